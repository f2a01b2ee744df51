#include "core/planner.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "core/registry.h"
#include "util/text.h"

namespace xfer {
using text::Hex;
namespace {

std::string DescName(size_t i, const TransferDesc& d) {
  return "descriptor " + std::to_string(i) + " {local " + Hex(d.local_addr) + ", remote " +
         Hex(d.remote_addr) + ", len " + std::to_string(d.len) + "}";
}

}  // namespace

bool LocalMemoryCheck::Allows(uint64_t addr, uint64_t len, bool need_write) {
  if (registry_.Contains(addr, len)) return true;
  if (!loaded_) {
    loaded_ = true;
    std::ifstream in("/proc/self/maps");
    std::string line;
    while (std::getline(in, line)) {
      Mapping m{};
      char perms[8] = {};
      if (std::sscanf(line.c_str(), "%" SCNx64 "-%" SCNx64 " %7s", &m.begin, &m.end, perms) != 3) {
        continue;
      }
      m.readable = perms[0] == 'r';
      m.writable = perms[1] == 'w';
      maps_.push_back(m);
    }
  }
  // Walk the (sorted) mappings that cover the range; they must be contiguous.
  uint64_t at = addr, end = addr + len;
  auto it = std::upper_bound(maps_.begin(), maps_.end(), at,
                             [](uint64_t a, const Mapping& m) { return a < m.begin; });
  if (it == maps_.begin()) return false;
  for (--it; it != maps_.end() && at < end; ++it) {
    if (it->begin > at || at >= it->end) return false;
    if (!(need_write ? it->writable : it->readable)) return false;
    at = it->end;
  }
  return at >= end;
}

Status MakePlan(Op op, std::span<const TransferDesc> descs, const RemoteRegions& remote,
                LocalMemoryCheck& local, const PlanLimits& limits, const ShmPath* shm,
                Plan* plan) {
  if (descs.empty()) return {StatusCode::kInvalidArgument, "no descriptors"};
  plan->slices.clear();
  plan->batches.clear();
  plan->regions.clear();
  plan->bytes = 0;

  // Validate each descriptor and coalesce runs that are adjacent on both sides.
  std::vector<transport::Slice> runs;
  std::vector<bool> run_mapped;
  runs.reserve(descs.size());
  RemoteRegion* last_region = nullptr;  // region of the previous descriptor
  uint8_t* last_base = nullptr;         // where it is mapped here (shm), or null
  RemoteRegion* run_region = nullptr;   // region of runs.back()
  for (size_t i = 0; i < descs.size(); ++i) {
    const TransferDesc& d = descs[i];
    if (d.len == 0) return {StatusCode::kInvalidArgument, DescName(i, d) + ": zero length"};
    if (d.local_addr == 0) return {StatusCode::kInvalidArgument, DescName(i, d) + ": null local address"};
    if (d.remote_addr == 0) return {StatusCode::kInvalidArgument, DescName(i, d) + ": null remote address"};
    if (d.local_addr + d.len < d.local_addr || d.remote_addr + d.len < d.remote_addr) {
      return {StatusCode::kInvalidArgument, DescName(i, d) + ": range wraps around"};
    }
    std::shared_ptr<RemoteRegion> region;
    if (last_region != nullptr && d.remote_addr >= last_region->info.addr &&
        d.remote_addr + d.len <= last_region->info.addr + last_region->info.len) {
      region = plan->regions.back();
    } else {
      region = remote.Find(d.remote_addr, d.len);
      if (!region) {
        return {StatusCode::kRemoteAccessDenied,
                DescName(i, d) + ": remote range is not inside one registered region of the peer"};
      }
      if (std::find(plan->regions.begin(), plan->regions.end(), region) == plan->regions.end()) {
        plan->regions.push_back(region);
      }
      // Keep the last-used region at the back so the fast path above finds it.
      auto pos = std::find(plan->regions.begin(), plan->regions.end(), region);
      std::iter_swap(pos, plan->regions.end() - 1);
      last_region = region.get();
      last_base = shm && region->shm_key != 0 ? shm->base(*region) : nullptr;
    }
    if (!last_base && shm && !shm->link) {
      return {StatusCode::kUnsupported,
              DescName(i, d) + ": remote region is not the peer's shared memory (AllocMem), "
                               "and the transport is forced to shm"};
    }
    // In mapped memory the remote address becomes the address of the mapping here.
    const uint64_t remote_addr =
        last_base ? reinterpret_cast<uint64_t>(last_base) + (d.remote_addr - last_region->info.addr)
                  : d.remote_addr;
    if (!local.Allows(d.local_addr, d.len, op == Op::kRead)) {
      return {StatusCode::kInvalidArgument,
              DescName(i, d) + ": local range is not registered and not " +
                  (op == Op::kRead ? "writable" : "readable") + " memory of this process"};
    }
    plan->bytes += d.len;
    if (!runs.empty()) {
      transport::Slice& r = runs.back();
      if (r.local + r.len == d.local_addr && r.remote + r.len == remote_addr &&
          region.get() == run_region) {
        r.len += d.len;
        continue;
      }
    }
    runs.push_back({d.local_addr, remote_addr, d.len});
    run_mapped.push_back(last_base != nullptr);
    run_region = region.get();
  }

  // Cut runs into slices and pack the slices into batches, each batch of one path.
  Plan::Batch current;
  auto close_batch = [&] {
    if (current.end > current.begin) plan->batches.push_back(current);
    current.begin = current.end;
    current.bytes = 0;
  };
  for (size_t k = 0; k < runs.size(); ++k) {
    const transport::Slice& r = runs[k];
    const PlanLimits& lim = run_mapped[k] ? shm->limits : limits;
    const uint64_t slice = std::max<uint64_t>(lim.slice_bytes, 1);
    const uint64_t batch_cap = std::max<uint64_t>(lim.batch_bytes, 1);
    const size_t max_slices = std::max<size_t>(lim.max_slices_per_batch, 1);
    const bool streaming = run_mapped[k] && r.len >= lim.streaming_bytes;
    if (current.end > current.begin &&
        (current.mapped != run_mapped[k] || current.streaming != streaming)) {
      close_batch();
    }
    current.mapped = run_mapped[k];
    current.streaming = streaming;
    for (uint64_t off = 0; off < r.len; off += slice) {
      uint64_t n = std::min(slice, r.len - off);
      if (current.end > current.begin &&
          (current.bytes + n > batch_cap || current.end - current.begin >= max_slices)) {
        close_batch();
      }
      plan->slices.push_back({r.local + off, r.remote + off, n});
      ++current.end;
      current.bytes += n;
    }
  }
  close_batch();
  return Status::Ok();
}

}  // namespace xfer
