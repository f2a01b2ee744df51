// What the data path needs to know about one peer: its regions, its routes, whether it lives.
#pragma once

#include <atomic>
#include <memory>

#include "core/buffer_pool.h"
#include "core/metrics.h"
#include "core/notify_rings.h"
#include "core/planner.h"
#include "core/remote_regions.h"
#include "xfer/types.h"

namespace xfer {

struct PeerState {
  PeerInfo info;
  RemoteRegions regions;
  PeerRoutes routes;                    // best first; empty when no backend reaches the peer
  bool copies_inline = false;           // some route copies small transfers on the caller
  std::shared_ptr<BufferPool> staging;  // the engine's buffer pool; null when staging is off
  std::atomic<bool> alive{true};        // cleared when the session ends; batches check it
  std::atomic<uint64_t> staged_bytes{0};  // moved through staging buffers (and then a route)
  // The key both sides derived when the control session authenticated (control/auth.h); its
  // tcp data connections prove they know it. Empty without a secret.
  std::string auth_key;
  // Where this peer's transfers are counted; null when EngineOptions::metrics is off.
  std::shared_ptr<EngineMetrics> metrics;
  EngineMetrics::PeerSlot metrics_slot = 0;

  // A peer on this host whose process holds the control connection: takes the descriptors of
  // the memory it shares with us (its notification ring). Null elsewhere.
  std::unique_ptr<shared_memory::PeerMapper> mapper;
  // This engine's notification ring for the peer (on this host, EngineOptions::notify.ring_bytes
  // on); null when notifications to it go over the control session only.
  std::shared_ptr<NotifyOutbox> outbox;

  // Some route reaches the peer, so transfers can be tried.
  bool Reachable() const { return !routes.routes.empty(); }
};

}  // namespace xfer
