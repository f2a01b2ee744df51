// What the data path needs to know about one peer: its regions, its link, whether it lives.
#pragma once

#include <atomic>
#include <memory>

#include "core/planner.h"
#include "core/remote_regions.h"
#include "transport/transport.h"
#include "xfer/types.h"

namespace xfer {

struct PeerState {
  PeerInfo info;
  RemoteRegions regions;
  std::shared_ptr<transport::Link> link;  // null when no transport reaches the peer
  PlanLimits limits;                      // how requests to this peer are cut into batches
  std::atomic<bool> alive{true};  // cleared when the session ends; batches check it
};

}  // namespace xfer
