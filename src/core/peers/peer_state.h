// What the data path needs to know about one peer: its regions, its routes, whether it lives.
// It is a control session's context (control::Session::context) from its hello on.
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "control/session.h"
#include "core/metrics/metrics.h"
#include "core/regions/remote_regions.h"
#include "core/stage/stage_channel.h"
#include "transport/backend.h"
#include "util/shared_memory.h"
#include "xfer/types.h"

namespace xfer {

// The ways to one peer: its routes, best first (a descriptor takes the first that reaches its
// pair of memories), and the buffer pool, which carries local GPU memory (with stage_all: any
// memory) through the first stageable route that reaches the remote side from host memory.
struct PeerRoutes {
  std::vector<std::shared_ptr<transport::Route>> routes;
  // Per route, where staging is on and the route Stageable: the links that stage its batches
  // through the buffer pool ([0] from host memory, [1] from GPU memory; transport::StagedLink).
  std::vector<std::array<std::shared_ptr<transport::Link>, 2>> staged_links;
  bool staging = false;        // a buffer pool may stage batches
  bool stage_all = false;      // ...and stages every descriptor (EngineOptions::staging=always)
  uint64_t staging_bytes = 0;  // a staged batch is cut as its route's own, within one buffer
};

struct PeerState final : control::SessionContext {
  PeerInfo info;
  RemoteRegions regions;
  PeerRoutes routes;              // best first; empty when no backend reaches the peer
  bool copies_inline = false;     // some route copies small transfers on the caller
  std::atomic<bool> alive{true};  // cleared when the session ends; batches check it
  // The peer asked for the notifications of requests that did not complete (its
  // EngineOptions::notify.outcomes): they go to it as wire::NotifyEnded.
  bool notify_outcomes = false;
  // The peer answers wire::Digest (end-to-end checksums, TransferOptions::checksum), and drops
  // one on wire::DigestCancel.
  bool answers_digests = false;
  bool sums_gpu_digests = false;  // ...of its GPU memory too (wire::kFeatureGpuDigests)
  bool cancels_digests = false;
  // The peer's build carries requests' beginnings and ends in notification rings
  // (wire::kFeatureRingEnds): the ring between us is typed when the target asked for outcomes.
  bool ring_ends = false;
  // The peer lends staging slots of its own (wire::kFeatureTargetStaging): memory of its that
  // a one-sided route cannot reach goes through them (core/stage/), asked for over `stage`.
  std::shared_ptr<StageChannel> stage;
  // The key both sides derived when the control session authenticated (control/auth.h); its
  // tcp data connections prove they know it. Empty without a secret.
  std::string auth_key;
  // Where this peer's transfers are counted; null when EngineOptions::metrics is off.
  std::shared_ptr<EngineMetrics> metrics;
  EngineMetrics::PeerSlot metrics_slot = 0;

  // Another process on this host, seen to hold the control connection: it takes the
  // descriptors of the memory it shares with us (its notification ring) through `mapper`
  // (null where that cannot be opened).
  bool on_this_host = false;
  std::unique_ptr<shared_memory::PeerMapper> mapper;
  // The other end's host as its control connection's socket names it (an IP address, whatever
  // name we dialled); empty for this engine itself.
  std::string control_host;

  // Some route reaches the peer, so transfers can be tried.
  bool Reachable() const { return !routes.routes.empty(); }
};

// The peer state of a session that said hello (null before).
inline PeerState* PeerOf(const control::Session& s) { return static_cast<PeerState*>(s.context.get()); }
inline std::shared_ptr<PeerState> SharedPeerOf(const control::Session& s) {
  return std::static_pointer_cast<PeerState>(s.context);
}

}  // namespace xfer
