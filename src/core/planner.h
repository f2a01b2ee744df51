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
  size_t batches_in_flight = SIZE_MAX;  // worth running at once (Transport's)
};

// How a batch travels.
enum class Path : uint8_t {
  kLink,    // the peer's transport
  kShm,     // memcpy into or out of the peer's AllocMem memory, mapped here
  kCuda,    // the copy engines, between memory addressable here (GPU memory opened by IPC)
  kStaged,  // through a buffer of the pool, then the peer's transport
};
std::string_view PathName(Path p);

// The ways to one peer. A descriptor takes the first that reaches both of its sides: cuda
// (GPU memory on either side), shm (host memory on both), the link, or staging (local GPU
// memory, which the link cannot read or write) through the link. The peer's GPU memory goes
// over the link when the link reaches it, else over the gpu link.
struct PeerPaths {
  PlanLimits link_limits;
  bool link = true;                  // false: the transport is forced to shm or cuda
  bool link_reaches_device = false;  // the peer's GPU memory (tcp: the target stages it)
  bool gpu_link = false;             // a tcp link beside a link that does not reach it
  PlanLimits gpu_link_limits;
  // Where a region of the peer is mapped here for memcpy (its AllocMem memory), or null.
  std::function<uint8_t*(RemoteRegion&)> shm_base;
  PlanLimits shm_limits;
  // Where a region is addressable here by the copy engines (the peer's GPU memory opened via
  // CUDA IPC; its host memory mapped by shm), or null. Used for pairs with GPU memory.
  std::function<uint8_t*(RemoteRegion&)> cuda_base;
  PlanLimits cuda_limits;
  bool staging = false;    // a buffer pool may carry local GPU memory over the link
  bool stage_all = false;  // ...and every other descriptor too (EngineOptions::staging=always)
  uint64_t staging_bytes = 0;  // a staged batch is cut as the link's own, within one buffer
};

struct Plan {
  std::vector<transport::Slice> slices;  // shm and cuda: remote = the address mapped here
  struct Batch {
    uint32_t begin = 0, end = 0;  // slices[begin, end)
    uint64_t bytes = 0;
    Path path = Path::kLink;
    bool streaming = false;  // kShm: non-temporal stores
    bool device = false;     // kStaged: the local side is GPU memory (else host memory)
    bool gpu_link = false;   // kLink, kStaged: over the gpu link (PeerState::gpu_link)
  };
  std::vector<Batch> batches;
  // Every remote region the request touches, so a batch can see if one was revoked.
  std::vector<std::shared_ptr<RemoteRegion>> regions;
  uint64_t bytes = 0;
  size_t batches_in_flight = SIZE_MAX;  // worth running at once: the least of its paths'
};

// Answers whether this process may read (WRITE requests) or write (READ requests) a local
// range, and what memory it is: registered memory is trusted; other host memory is checked
// against the process's mappings, read from /proc/self/maps at most once per plan.
class LocalMemoryCheck {
 public:
  explicit LocalMemoryCheck(const Registry& registry) : registry_(registry) {}
  bool Allows(uint64_t addr, uint64_t len, bool need_write, MemType* type = nullptr);

 private:
  struct Mapping { uint64_t begin, end; bool readable, writable; };
  const Registry& registry_;
  bool loaded_ = false;
  std::vector<Mapping> maps_;
};

Status MakePlan(Op op, std::span<const TransferDesc> descs, const RemoteRegions& remote,
                LocalMemoryCheck& local, const PeerPaths& paths, Plan* plan);

}  // namespace xfer
