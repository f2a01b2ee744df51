// What an inline copy (EngineImpl::TryInlineCopy) found of the peer and region it copied to
// last: kept per inline execution slot (StreamPool::Slot), read and written only under that
// slot, so that the next copy through the slot to the same peer and region looks them up in no
// table and counts no reference (after a copy of a few KiB, each of those is a cache miss or a
// locked instruction that waits for the copy's stores); it reads the peer table's version.
// A target holds its peer's state and region alive. The engine lets go of it when the peer is
// dropped or the region revoked: at once where the slot is free, else at the slot's next inline
// copy or the control thread's next tick (EngineImpl::ForgetInlineTargets). A copy still checks,
// under the slot, that both are current: a fence orders it with their end.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/peer_state.h"
#include "util/range.h"

namespace xfer {

struct InlineTarget {
  std::string remote;          // the peer's name as the caller gave it
  uint64_t peers_version = 0;  // PeerTable::version() when the peer was looked up
  std::shared_ptr<PeerState> state;
  std::shared_ptr<RemoteRegion> region;
  transport::Route* route = nullptr;  // the route that copies inline (one of state's)
  uint64_t mapped = 0;                // where region's first byte is mapped in this process

  // Whether this target stands for [addr, addr + len) of that peer, for that access.
  bool Serves(const std::string& name, uint64_t version, uint64_t addr, uint64_t len, bool write) const {
    return state && version == peers_version && RangeInside(addr, len, region->info.addr, region->info.len) &&
           (!write || region->info.access == PeerAccess::kReadWrite) && name == remote;
  }
};

}  // namespace xfer
