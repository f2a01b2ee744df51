// A peer's advertised regions, as this engine last heard of them.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "control/wire.h"
#include "transport/remote_region.h"

namespace xfer {

using transport::RemoteRegion;

// Why a peer's region table is not one to use ("" when it is): a region of zero length, one
// that wraps past the end of the address space, or two with one id.
std::string WhyBadTable(const std::vector<wire::WireRegion>& regions);

class RemoteRegions {
 public:
  void Reset(const std::vector<wire::WireRegion>& regions);  // (a table WhyBadTable passed)
  // Adds the region; false (nothing added, *why set) when it is bad or its id is taken.
  bool Add(const wire::WireRegion& region, std::string* why);
  // Marks the region revoked and forgets it; returns it (null when the id is unknown).
  std::shared_ptr<RemoteRegion> Revoke(uint64_t id);
  // Revokes every region (the peer is gone) and returns them.
  std::vector<std::shared_ptr<RemoteRegion>> RevokeAll();
  // The region that holds all of [addr, addr+len), one that peers may WRITE where there is
  // one, or null.
  std::shared_ptr<RemoteRegion> Find(uint64_t addr, uint64_t len) const;
  std::vector<RegionInfo> List() const;

 private:
  void Rebuild();  // recomputes max_end_ after a change; mu_ held
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<RemoteRegion>> by_addr_;  // sorted by start address
  std::vector<uint64_t> max_end_;                       // max end of by_addr_[0..i]
};

}  // namespace xfer
