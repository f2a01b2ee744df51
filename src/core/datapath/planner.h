// Turns a request's descriptors into batches of slices: validate every range, coalesce
// adjacent descriptors, cut large ones into slices, pack slices into batches.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "core/peers/peer_state.h"
#include "core/regions/remote_regions.h"
#include "transport/backend.h"
#include "util/range.h"
#include "xfer/status.h"
#include "xfer/types.h"

namespace xfer {

class Registry;

using transport::PlanLimits;

struct Plan {
  std::vector<transport::Slice> slices;  // mapping routes: remote = the address mapped here
  struct Batch {
    uint32_t begin = 0, end = 0;  // slices[begin, end)
    uint64_t bytes = 0;
    uint8_t route = 0;  // index into PeerRoutes::routes
    // The link that runs it: the route's link, its streaming link, or its staged link (as the
    // flags below say); the peer's state holds it (a request holds the state).
    transport::Link* link = nullptr;
    bool staged = false;     // through a staging buffer, then the route's link
    bool device = false;     // staged: the local side is GPU memory (else host memory)
    bool streaming = false;  // over the route's streaming link (a run past its streaming_bytes)
    bool mapped = false;     // its slices' remote addresses are a mapping of the region here
  };
  std::vector<Batch> batches;
  // Every remote region the request touches, so a batch can see if one was revoked.
  std::vector<std::shared_ptr<RemoteRegion>> regions;
  uint64_t bytes = 0;
  bool gpu_memory = false;              // some descriptor's local or remote side is GPU memory
  size_t batches_in_flight = SIZE_MAX;  // worth running at once: the least of its routes'
  // With two or more descriptors: where each ends in the request's bytes, as the slices
  // carry them in order (so a batch's bytes tell which descriptors it holds part of).
  std::vector<uint64_t> desc_ends;
};

// Answers whether this process may read (WRITE requests) or write (READ requests) a local
// range, and what memory it is: registered memory is trusted; other host memory is checked
// against the process's mappings, read from /proc/self/maps at most once per plan. A range
// inside the registered region found last is answered without asking the registry again (a
// plan is checked against the regions as they were when it was made).
class LocalMemoryCheck {
 public:
  explicit LocalMemoryCheck(const Registry& registry) : registry_(registry) {}
  bool Allows(uint64_t addr, uint64_t len, bool need_write, MemType* type = nullptr);
  // Allows' answer for a range inside the registered region found last, at no cost; false
  // when the range is not inside it (then ask Allows).
  bool Remembered(uint64_t addr, uint64_t len, MemType* type) const {
    if (!RangeInside(addr, len, last_begin_, last_end_ - last_begin_)) return false;
    *type = last_type_;
    return true;
  }

 private:
  struct Mapping {
    uint64_t begin, end;
    bool readable, writable;
  };
  const Registry& registry_;
  uint64_t last_begin_ = 0, last_end_ = 0;  // the registered region found last
  MemType last_type_ = MemType::kHost;
  bool loaded_ = false;
  std::vector<Mapping> maps_;
};

// The planner's rule for a pair of memories: the first route, in order, that reaches local
// memory of that type and region r (*mapped: where r is mapped here, for mapping routes);
// -1 when none does. The inline copies choose by it too.
int FirstRouteReaching(const PeerRoutes& peer, MemType local, RemoteRegion& r, uint8_t** mapped);

Status MakePlan(Op op, std::span<const TransferDesc> descs, const RemoteRegions& remote,
                LocalMemoryCheck& local, const PeerRoutes& routes, Plan* plan);

// Entries of prepared lists (core/datapath/prepared_lists.h), as checked when they were prepared.
struct LocalEntry {
  uint64_t addr = 0, len = 0;
  MemType type = MemType::kHost;
  bool usable = true;     // readable memory of this process (else no longer, since it was prepared)
  bool writable = false;  // ...that a READ may write into
};
struct RemoteEntry {
  uint64_t addr = 0, len = 0;
  uint32_t region = 0;  // index into the list's regions
};
// A request over prepared lists: pair k is local[local_index[k]] with remote[remote_index[k]].
struct PreparedPairs {
  std::span<const LocalEntry> local;
  std::span<const uint32_t> local_index;
  std::span<const RemoteEntry> remote;
  std::span<const std::shared_ptr<RemoteRegion>> regions;  // as the remote list found them
  std::span<const uint32_t> remote_index;
  const RemoteRegions* current = nullptr;  // the peer's regions now: an entry whose region was
                                           // revoked is looked up there again
};

// MakePlan for prepared pairs (same sizes of index spans, checked by the caller): checks only
// what may differ per request (indices, lengths, the op's access) and routes each region once.
Status MakePreparedPlan(Op op, const PreparedPairs& pairs, const PeerRoutes& routes, Plan* plan);

// Where descriptor k of a plan lies (its pieces follow one another in its slices): its local
// bytes, its remote bytes (the address mapped here, where mapped), their length.
struct PlannedDescriptor {
  uint64_t local = 0, remote = 0, len = 0;
  bool mapped = false;  // remote is where the peer's region is mapped here
};
std::vector<PlannedDescriptor> PlannedDescriptors(const Plan& plan);
// The descriptor that holds byte `offset` of the request, and where its bytes begin and end.
size_t DescriptorAt(const Plan& plan, uint64_t offset);
inline uint64_t DescriptorBegin(const Plan& plan, size_t k) { return k == 0 ? 0 : plan.desc_ends[k - 1]; }
inline uint64_t DescriptorEnd(const Plan& plan, size_t k) {
  return plan.desc_ends.empty() ? plan.bytes : plan.desc_ends[k];
}

// The descriptors (ascending indices) none of whose bytes is in a batch of `unmoved` (the
// batches that failed or were dropped, in any order): those that landed whole.
std::vector<uint64_t> LandedDescriptors(const Plan& plan, const std::vector<uint32_t>& unmoved);

}  // namespace xfer
