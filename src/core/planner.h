// Turns a request's descriptors into batches of slices: validate every range, coalesce
// adjacent descriptors, cut large ones into slices, pack slices into batches.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "core/remote_regions.h"
#include "transport/transport.h"
#include "xfer/status.h"
#include "xfer/types.h"

namespace xfer {

class Registry;

struct PlanLimits {
  uint64_t slice_bytes = 1ull << 20;   // descriptors longer than this are cut
  uint64_t batch_bytes = 4ull << 20;   // a batch carries at most this many bytes...
  size_t max_slices_per_batch = 1024;  // ...and at most this many slices
  // Mapped (shm) batches: descriptors at least this long are copied with non-temporal stores.
  uint64_t streaming_bytes = UINT64_MAX;
};

// Mapped memory of a same-host peer (shm): descriptors into it become memcpy batches.
struct ShmPath {
  // The region mapped into this process, or null (not mappable: use the link).
  std::function<uint8_t*(RemoteRegion&)> base;
  PlanLimits limits;
  bool link = true;  // false: no other path (transport forced to shm)
};

struct Plan {
  std::vector<transport::Slice> slices;  // mapped batches: remote = the address mapped here
  struct Batch {
    uint32_t begin = 0, end = 0;  // slices[begin, end)
    uint64_t bytes = 0;
    bool mapped = false;          // shm: memcpy on the calling thread...
    bool streaming = false;       // ...with non-temporal stores
  };
  std::vector<Batch> batches;
  // Every remote region the request touches, so a batch can see if one was revoked.
  std::vector<std::shared_ptr<RemoteRegion>> regions;
  uint64_t bytes = 0;
};

// Answers whether this process may read (WRITE requests) or write (READ requests) a local
// range: registered memory is trusted; other host memory is checked against the process's
// mappings, read from /proc/self/maps at most once per plan.
class LocalMemoryCheck {
 public:
  explicit LocalMemoryCheck(const Registry& registry) : registry_(registry) {}
  bool Allows(uint64_t addr, uint64_t len, bool need_write);

 private:
  struct Mapping { uint64_t begin, end; bool readable, writable; };
  const Registry& registry_;
  bool loaded_ = false;
  std::vector<Mapping> maps_;
};

// shm: null when the peer has no mapped path.
Status MakePlan(Op op, std::span<const TransferDesc> descs, const RemoteRegions& remote,
                LocalMemoryCheck& local, const PlanLimits& limits, const ShmPath* shm,
                Plan* plan);

}  // namespace xfer
