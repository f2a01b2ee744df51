// A peer's advertised regions, as this engine last heard of them.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "control/wire.h"
#include "transport/cuda/cuda_api.h"
#include "transport/shm/shm_memory.h"

namespace xfer {

struct RemoteRegion {
  uint64_t id = 0;
  RegionInfo info;
  // Set when the owner deregisters it: batches check this before they move a byte.
  std::atomic<bool> revoked{false};
  // Memory from the owner's AllocMem (shm_key != 0): its segment, mapped here on first use.
  int32_t shm_fd = -1;
  uint64_t shm_key = 0;
  std::string ucx_key;      // packed UCX remote key (the ucx transport), or empty
  std::string cuda_handle;  // GPU memory: what cuda::Open takes, or empty
  std::mutex map_mu;
  bool map_tried = false;                          // map_mu
  std::shared_ptr<transport::shm::Mapping> map;    // map_mu; null: not mapped (use the link)
  bool cuda_tried = false;                         // map_mu
  std::shared_ptr<transport::cuda::Mapping> cuda_map;  // map_mu; the GPU region opened here

  // Closes the GPU region opened here, for good. Called once the region is revoked and no
  // batch uses it any more, before the owner is told: CUDA forbids the owner to free memory
  // that another process still has open.
  void CloseGpu() {
    std::lock_guard lock(map_mu);
    cuda_tried = true;
    cuda_map.reset();
  }
};

class RemoteRegions {
 public:
  void Reset(const std::vector<wire::WireRegion>& regions);
  void Add(const wire::WireRegion& region);
  // Marks the region revoked and forgets it; returns it (null when the id is unknown).
  std::shared_ptr<RemoteRegion> Revoke(uint64_t id);
  // Revokes every region (the peer is gone) and returns them.
  std::vector<std::shared_ptr<RemoteRegion>> RevokeAll();
  // The region that holds all of [addr, addr+len), or null.
  std::shared_ptr<RemoteRegion> Find(uint64_t addr, uint64_t len) const;
  std::vector<RegionInfo> List() const;

 private:
  void Rebuild();  // recomputes max_end_ after a change; mu_ held
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<RemoteRegion>> by_addr_;  // sorted by start address
  std::vector<uint64_t> max_end_;                       // max end of by_addr_[0..i]
};

}  // namespace xfer
