#include "core/regions/registry.h"

#include <algorithm>

#include "util/log.h"
#include "util/range.h"
#include "util/thread_cache.h"

namespace xfer {

Status Registry::Add(const wire::WireRegion& region, bool allocated, MemHandle* handle, bool* added) {
  const uint64_t addr = region.info.addr, len = region.info.len;
  if (addr == 0) return {StatusCode::kInvalidArgument, "RegisterMem: null address"};
  if (len == 0) return {StatusCode::kInvalidArgument, "RegisterMem: zero length"};
  if (addr + len < addr) return {StatusCode::kInvalidArgument, "RegisterMem: range wraps"};
  if (region.info.tag.size() > wire::kMaxTag) {
    return {StatusCode::kInvalidArgument, "RegisterMem: tag longer than 4096 bytes"};
  }
  std::lock_guard lock(mu_);
  auto [lo, hi] = by_addr_.equal_range(addr);
  for (auto it = lo; it != hi; ++it) {
    Entry& e = *it->second;
    if (e.region.info.len == len && e.region.info.type == region.info.type &&
        e.region.info.access == region.info.access && !allocated && !e.allocated) {
      ++e.refs;
      *handle = e.region.id;
      *added = false;
      return Status::Ok();
    }
  }
  MemHandle h = next_++;
  Entry e;
  e.region = region;
  e.region.id = h;
  e.allocated = allocated;
  auto at = by_handle_.emplace(h, std::move(e)).first;
  by_addr_.emplace(addr, &at->second);
  version_.store(NextTableVersion(), std::memory_order_release);
  max_len_ = std::max(max_len_, len);
  *handle = h;
  *added = true;
  return Status::Ok();
}

Status Registry::Remove(MemHandle handle, bool* removed, bool free) {
  std::lock_guard lock(mu_);
  auto it = by_handle_.find(handle);
  if (it == by_handle_.end()) {
    return {StatusCode::kInvalidArgument,
            std::string(free ? "FreeMem" : "DeregisterMem") + ": unknown handle " + std::to_string(handle)};
  }
  const bool allocated = it->second.allocated;
  if (free && !allocated) {
    return {StatusCode::kInvalidArgument,
            "FreeMem: handle " + std::to_string(handle) + " was not allocated by AllocMem"};
  }
  if (!free && allocated && it->second.refs == 1) {
    return {StatusCode::kInvalidArgument, "DeregisterMem: handle " + std::to_string(handle) +
                                              " is memory from AllocMem; release it with FreeMem"};
  }
  it->second.refs = free ? 0 : it->second.refs - 1;
  *removed = it->second.refs == 0;
  if (*removed) {
    auto [lo, hi] = by_addr_.equal_range(it->second.region.info.addr);
    for (auto a = lo; a != hi; ++a) {
      if (a->second == &it->second) {
        by_addr_.erase(a);
        break;
      }
    }
    by_handle_.erase(it);
    version_.store(NextTableVersion(), std::memory_order_release);
  }
  return Status::Ok();
}

std::optional<Registry::RangeAccess> Registry::Access(uint64_t addr, uint64_t len, bool want_write,
                                                      const std::string& tag) const {
  std::lock_guard lock(mu_);
  std::optional<RangeAccess> found;
  // Regions may overlap, so every region starting at or below addr is a candidate; a
  // read-only one that holds the range does not end the search for one that grants WRITE.
  for (auto it = by_addr_.upper_bound(addr); it != by_addr_.begin();) {
    --it;
    const RegionInfo& r = it->second->region.info;
    if (addr - r.addr >= max_len_) break;  // this one and every one below end before addr
    if (!RangeInside(addr, len, r.addr, r.len)) continue;
    const bool writable = r.access == PeerAccess::kReadWrite;
    const bool tagged = !tag.empty() && r.tag == tag;
    if (writable || !want_write) return RangeAccess{r.type, writable, r.addr, r.addr + r.len, tagged};
    if (!found) found = RangeAccess{r.type, false, r.addr, r.addr + r.len, tagged};
  }
  return found;
}

std::optional<MemType> Registry::TypeOf(uint64_t addr, uint64_t len) const {
  struct Found {
    const Registry* registry = nullptr;
    uint64_t version = 0, begin = 0, end = 0;
    MemType type = MemType::kHost;
  };
  thread_local Found last;
  const uint64_t version = version_.load(std::memory_order_acquire);
  if (last.registry == this && last.version == version &&
      RangeInside(addr, len, last.begin, last.end - last.begin)) {
    return last.type;
  }
  auto a = Access(addr, len, false);  // (at this version or a later one: either answer is current)
  if (!a) return std::nullopt;
  last = {this, version, a->begin, a->end, a->type};
  return a->type;
}

std::vector<wire::WireRegion> Registry::Snapshot() const {
  std::lock_guard lock(mu_);
  std::vector<wire::WireRegion> out;
  out.reserve(by_handle_.size());
  for (const auto& [h, e] : by_handle_) out.push_back(e.region);
  return out;
}

bool Registry::Lookup(MemHandle handle, wire::WireRegion* out) const {
  std::lock_guard lock(mu_);
  auto it = by_handle_.find(handle);
  if (it == by_handle_.end()) return false;
  *out = it->second.region;
  return true;
}

}  // namespace xfer
