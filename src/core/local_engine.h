// This engine as each of its services sees it: its name and identity, its options, and whether
// it runs. EngineImpl::Initialize fills it in before any service starts; it is read-only from
// then on, but for `running`, which Finalize clears first.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "util/deadline.h"
#include "xfer/options.h"
#include "xfer/status.h"

namespace xfer {

struct LocalEngine {
  using Clock = std::chrono::steady_clock;

  EngineOptions options;  // as given, less the secret (the peers' Authenticator holds it)
  std::string name;       // host:port as bound, or a host alone (a client-only engine)
  uint64_t incarnation = 0;
  std::string host_id;  // EngineOptions::host_id, or the boot id
  std::atomic<bool> running{false};
  // Test hook (environment XFER_TEST_CORRUPT_LANDED=k, read at Initialize; -1 when unset):
  // before it computes the checksum of where a request's bytes landed (TransferOptions::checksum),
  // this engine flips the first byte of descriptor k's landed bytes, as corruption would.
  int64_t corrupt_landed = -1;
  // Test hook (environment XFER_TEST_STAGE_TAG=tag, read at Initialize): as a target, this
  // engine stages the ranges of its regions with that tag as it would GPU memory (host memory
  // standing in for part of its memory; staging = always stands in for all of it).
  std::string stage_tag;

  // Ok while the engine runs; else kInvalidArgument naming the call.
  Status CheckRunning(const char* what) const {
    if (running.load()) return Status::Ok();
    return {StatusCode::kInvalidArgument, std::string(what) + ": engine is not initialized (or finalized)"};
  }
  // The deadline of a fence on the control thread: every peer waits while it runs (a quarter of
  // the heartbeat timeout, so that heartbeats still go out in time).
  Clock::time_point ControlFenceDeadline() const { return DeadlineAfter(options.heartbeat_timeout / 4); }
  Clock::time_point HeartbeatDeadline() const { return DeadlineAfter(options.heartbeat_timeout); }
};

}  // namespace xfer
