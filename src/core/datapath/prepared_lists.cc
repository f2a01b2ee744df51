#include "core/datapath/prepared_lists.h"

#include <algorithm>
#include <atomic>

#include "core/regions/registry.h"
#include "util/text.h"

namespace xfer {
namespace {

std::string EntryName(size_t i, uint64_t addr, uint64_t len) {
  return "entry " + std::to_string(i) + " {" + text::Hex(addr) + ", len " + std::to_string(len) + "}";
}

// Why a range cannot be an entry of any list, or null.
const char* Malformed(uint64_t addr, uint64_t len) {
  return len == 0            ? "zero length"
         : addr == 0         ? "null address"
         : addr + len < addr ? "range wraps around"
                             : nullptr;
}

}  // namespace

Status CheckLocalEntries(const Registry& registry, std::vector<LocalEntry>* entries, bool strict) {
  LocalMemoryCheck check(registry);
  for (size_t i = 0; i < entries->size(); ++i) {
    LocalEntry& e = (*entries)[i];
    const char* bad = Malformed(e.addr, e.len);
    e.usable = bad == nullptr && check.Allows(e.addr, e.len, false, &e.type);
    e.writable = e.usable && check.Allows(e.addr, e.len, true);
    if (!e.usable && strict) {
      return {StatusCode::kInvalidArgument,
              EntryName(i, e.addr, e.len) + ": " +
                  (bad != nullptr ? bad
                                  : "not registered and not readable memory of this process (GPU "
                                    "memory must be registered)")};
    }
  }
  return Status::Ok();
}

Status FindRemoteEntries(const std::vector<MemRange>& ranges, const RemoteRegions& regions,
                         RemoteList* list) {
  list->entries.clear();
  list->regions.clear();
  list->entries.reserve(ranges.size());
  std::unordered_map<const RemoteRegion*, uint32_t> index;  // list->regions by region
  const RemoteRegion* last = nullptr;
  uint32_t last_index = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const MemRange& r = ranges[i];
    if (const char* bad = Malformed(r.addr, r.len)) {
      return {StatusCode::kInvalidArgument, EntryName(i, r.addr, r.len) + ": " + bad};
    }
    // (The region before answers only when it grants WRITE: a read-only one may hide a
    // writable one that holds this range too.)
    if (last == nullptr || last->info.access != PeerAccess::kReadWrite ||
        !RangeInside(r.addr, r.len, last->info.addr, last->info.len)) {
      std::shared_ptr<RemoteRegion> found = regions.Find(r.addr, r.len, true);
      if (!found) {
        return {StatusCode::kRemoteAccessDenied,
                EntryName(i, r.addr, r.len) + ": not inside one registered region of the peer"};
      }
      auto [at, added] = index.emplace(found.get(), static_cast<uint32_t>(list->regions.size()));
      if (added) list->regions.push_back(found);
      last = found.get();
      last_index = at->second;
    }
    list->entries.push_back({r.addr, r.len, last_index});
  }
  return Status::Ok();
}

std::shared_ptr<const Plan> PlanCache::Find(Op op, const LocalList* local,
                                            std::span<const uint32_t> local_index,
                                            std::span<const uint32_t> remote_index) {
  std::lock_guard lock(mu_);
  for (Kept& k : kept_) {
    if (!k.plan || k.op != op || k.local.get() != local || !std::ranges::equal(local_index, k.local_index) ||
        !std::ranges::equal(remote_index, k.remote_index)) {
      continue;
    }
    const bool stale = std::ranges::any_of(k.plan->regions, [](const auto& r) {
      return r->revoked.load(std::memory_order_acquire);  // (planned again: looked up afresh)
    });
    if (!stale) return k.plan;
    k.plan.reset();
  }
  return nullptr;
}

void PlanCache::Keep(Op op, std::shared_ptr<const LocalList> local, std::span<const uint32_t> local_index,
                     std::span<const uint32_t> remote_index, std::shared_ptr<const Plan> plan) {
  std::lock_guard lock(mu_);
  Kept& k = kept_[next_];
  next_ = (next_ + 1) % kPlans;
  k.op = op;
  k.local = std::move(local);
  k.local_index.assign(local_index.begin(), local_index.end());
  k.remote_index.assign(remote_index.begin(), remote_index.end());
  k.plan = std::move(plan);
}

ListHandle ListTable::NextHandle() {
  static std::atomic<ListHandle> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

ListHandle ListTable::Add(std::shared_ptr<const LocalList> list) {
  const ListHandle h = NextHandle();
  std::lock_guard lock(mu_);
  local_.emplace(h, std::move(list));
  return h;
}

ListHandle ListTable::Add(std::shared_ptr<const RemoteList> list) {
  const ListHandle h = NextHandle();
  std::lock_guard lock(mu_);
  remote_.emplace(h, std::move(list));
  return h;
}

bool ListTable::Remove(ListHandle h) {
  std::lock_guard lock(mu_);
  return local_.erase(h) + remote_.erase(h) > 0;
}

Status ListTable::Get(ListHandle local, ListHandle remote, std::shared_ptr<const LocalList>* l,
                      std::shared_ptr<const RemoteList>* r) const {
  // side: "local list" or "remote list"; other_kind: h is a list of the other kind.
  auto unknown = [](const std::string& side, ListHandle h, bool other_kind) {
    const std::string other = side[0] == 'l' ? "remote list" : "local list";
    return Status(StatusCode::kInvalidArgument,
                  side + " " + std::to_string(h) +
                      (other_kind ? " is a " + other : " is unknown (never prepared, or released)"));
  };
  std::lock_guard lock(mu_);
  auto li = local_.find(local);
  if (li == local_.end()) return unknown("local list", local, remote_.contains(local));
  auto ri = remote_.find(remote);
  if (ri == remote_.end()) return unknown("remote list", remote, local_.contains(remote));
  *l = li->second;
  *r = ri->second;
  return Status::Ok();
}

void ListTable::Replace(ListHandle h, const std::shared_ptr<const LocalList>& old,
                        std::shared_ptr<const LocalList> fresh) {
  std::lock_guard lock(mu_);
  auto it = local_.find(h);
  if (it != local_.end() && it->second == old) it->second = std::move(fresh);
}

void ListTable::Clear() {
  std::lock_guard lock(mu_);
  local_.clear();
  remote_.clear();
}

}  // namespace xfer
