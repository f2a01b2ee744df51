// What the data path needs to know about one peer: its regions, its link, whether it lives.
#pragma once

#include <atomic>
#include <memory>

#include "core/planner.h"
#include "core/remote_regions.h"
#include "transport/shm/shm_memory.h"
#include "transport/transport.h"
#include "xfer/types.h"

namespace xfer {

struct PeerState {
  PeerInfo info;
  RemoteRegions regions;
  std::shared_ptr<transport::Link> link;  // null when no transport reaches the peer
  PlanLimits limits;                      // how requests to this peer are cut into batches
  // Same host: maps the peer's AllocMem memory, which is then moved with memcpy in batches
  // cut by shm_limits. Null otherwise.
  std::unique_ptr<transport::shm::PeerMapper> mapper;
  PlanLimits shm_limits;
  std::atomic<bool> alive{true};  // cleared when the session ends; batches check it
  std::atomic<uint64_t> shm_bytes{0}, link_bytes{0};  // moved so far, by path
};

}  // namespace xfer
