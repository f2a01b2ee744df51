#include "core/regions/remote_regions.h"

#include <algorithm>

#include "util/range.h"

namespace xfer {
namespace {

std::shared_ptr<RemoteRegion> Make(const wire::WireRegion& w) {
  auto r = std::make_shared<RemoteRegion>();
  r->id = w.id;
  r->info = w.info;
  r->blobs = w.blobs;
  return r;
}

std::string WhyBad(const wire::WireRegion& r) {
  if (r.info.len == 0) return "region " + std::to_string(r.id) + " has zero length";
  if (r.info.addr + r.info.len < r.info.addr) {
    return "region " + std::to_string(r.id) + " wraps past the end of the address space";
  }
  return "";
}

}  // namespace

RemoteRegions::Table::Table(const std::vector<wire::WireRegion>& regions, size_t max_regions) {
  if (regions.size() > max_regions) {
    why_bad_ = std::to_string(regions.size()) + " regions, more than this engine takes from a peer (" +
               std::to_string(max_regions) + ", EngineOptions::max_peer_regions)";
    return;
  }
  by_id_.reserve(regions.size());
  index_.by_addr.reserve(regions.size());
  for (const auto& w : regions) {
    if (why_bad_ = WhyBad(w); why_bad_.empty()) {
      auto [at, added] = by_id_.try_emplace(w.id);
      if (added) {
        at->second = Make(w);
        index_.by_addr.push_back({w.info.addr, w.info.addr + w.info.len, 0, at->second});
        continue;
      }
      why_bad_ = "two regions have id " + std::to_string(w.id);
    }
    index_ = {};
    by_id_ = {};
    return;
  }
  std::sort(index_.by_addr.begin(), index_.by_addr.end(),
            [](const auto& a, const auto& b) { return a.addr < b.addr; });
  index_.Rebuild(0);
}

void RemoteRegions::Index::Rebuild(size_t from) {
  uint64_t m = from == 0 ? 0 : by_addr[from - 1].max_end;
  for (size_t i = from; i < by_addr.size(); ++i) {
    m = std::max(m, by_addr[i].end);
    by_addr[i].max_end = m;
  }
}

void RemoteRegions::Index::Insert(std::shared_ptr<RemoteRegion> r) {
  const uint64_t addr = r->info.addr;
  auto at = std::upper_bound(by_addr.begin(), by_addr.end(), addr,
                             [](uint64_t a, const Entry& e) { return a < e.addr; });
  const size_t pos = static_cast<size_t>(at - by_addr.begin());
  by_addr.insert(at, Entry{addr, addr + r->info.len, 0, std::move(r)});
  Rebuild(pos);
}

std::shared_ptr<RemoteRegion> RemoteRegions::Index::Find(uint64_t addr, uint64_t len, bool write) const {
  // Candidates start at or below addr; walk down while some region could still reach addr.
  auto it = std::upper_bound(by_addr.begin(), by_addr.end(), addr,
                             [](uint64_t a, const Entry& e) { return a < e.addr; });
  // A read-only region that holds the range does not end the search for one that grants
  // WRITE (each registration grants its own access).
  std::shared_ptr<RemoteRegion> read_only;
  for (size_t i = static_cast<size_t>(it - by_addr.begin()); i-- > 0;) {
    const Entry& e = by_addr[i];
    if (e.max_end <= addr) break;
    if (addr + len > e.end || e.region->revoked.load(std::memory_order_relaxed)) continue;
    if (!write || e.region->info.access == PeerAccess::kReadWrite) return e.region;
    if (!read_only) read_only = e.region;
  }
  return read_only;
}

void RemoteRegions::MergeRecent() {
  std::vector<Index::Entry> merged;
  merged.reserve(all_.by_addr.size() + recent_.by_addr.size());
  std::merge(std::make_move_iterator(all_.by_addr.begin()), std::make_move_iterator(all_.by_addr.end()),
             std::make_move_iterator(recent_.by_addr.begin()), std::make_move_iterator(recent_.by_addr.end()),
             std::back_inserter(merged), [](const auto& a, const auto& b) { return a.addr < b.addr; });
  all_.by_addr = std::move(merged);
  all_.Rebuild(0);
  recent_ = {};
}

void RemoteRegions::DropRevoked() {
  const size_t indexed = all_.by_addr.size() + recent_.by_addr.size();
  if (revoked_in_index_ < 64 || revoked_in_index_ * 2 < indexed) return;
  for (Index* x : {&all_, &recent_}) {
    std::erase_if(x->by_addr, [](const auto& e) { return e.region->revoked.load(); });
    x->Rebuild(0);
  }
  revoked_in_index_ = 0;
}

void RemoteRegions::Adopt(Table&& table) {
  std::lock_guard lock(mu_);
  for (auto& [id, r] : by_id_) r->revoked = true;
  by_id_ = std::move(table.by_id_);
  all_ = std::move(table.index_);
  recent_ = {};
  revoked_in_index_ = 0;
}

bool RemoteRegions::Add(const wire::WireRegion& region, std::string* why) {
  if (*why = WhyBad(region); !why->empty()) return false;
  std::lock_guard lock(mu_);
  auto [it, added] = by_id_.try_emplace(region.id);
  if (!added) {
    *why = "region " + std::to_string(region.id) + " was added twice";
    return false;
  }
  it->second = Make(region);
  recent_.Insert(it->second);
  if (recent_.by_addr.size() > kRecent) MergeRecent();
  return true;
}

std::shared_ptr<RemoteRegion> RemoteRegions::Revoke(uint64_t id) {
  std::lock_guard lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return nullptr;
  auto gone = std::move(it->second);
  by_id_.erase(it);
  gone->revoked = true;
  ++revoked_in_index_;
  DropRevoked();
  return gone;
}

RemoteRegions::Revoked RemoteRegions::RevokeAll() {
  Revoked gone;
  Index all, recent;
  {
    std::lock_guard lock(mu_);
    gone.by_id.swap(by_id_);
    all.by_addr.swap(all_.by_addr);
    recent.by_addr.swap(recent_.by_addr);
    revoked_in_index_ = 0;
  }
  // The live regions are those of the indexes not revoked yet (a vector walk, not the map's).
  gone.regions.reserve(gone.by_id.size());
  for (Index* x : {&all, &recent}) {
    for (auto& e : x->by_addr) {
      if (!e.region->revoked.exchange(true)) gone.regions.push_back(std::move(e.region));
    }
  }
  return gone;
}

std::shared_ptr<RemoteRegion> RemoteRegions::Find(uint64_t addr, uint64_t len, bool write) const {
  std::lock_guard lock(mu_);
  auto a = all_.Find(addr, len, write);
  if (a && (!write || a->info.access == PeerAccess::kReadWrite)) return a;
  auto b = recent_.Find(addr, len, write);
  return b && (!a || b->info.access == PeerAccess::kReadWrite) ? b : a;
}

std::shared_ptr<RemoteRegion> RemoteRegions::FindRemembered(uint64_t addr, uint64_t len, bool write) const {
  // (As PeerTable::Find's: `gone`, trivially destructible, outlives the thread's copy.)
  thread_local bool gone = false;
  struct Found {
    uint64_t table = 0;
    std::weak_ptr<RemoteRegion> region;
    uint64_t begin = 0, len = 0;
    bool writable = false;
    ~Found() { gone = true; }
  };
  Found* last = nullptr;
  if (!gone) {
    thread_local Found mine;
    last = &mine;
  }
  if (last != nullptr && last->table == table_id_ && RangeInside(addr, len, last->begin, last->len) &&
      (!write || last->writable)) {
    std::shared_ptr<RemoteRegion> r = last->region.lock();
    if (r && !r->revoked.load(std::memory_order_acquire)) return r;
  }
  std::shared_ptr<RemoteRegion> r = Find(addr, len, write);
  if (r && last != nullptr) {
    last->table = table_id_;
    last->region = r;
    last->begin = r->info.addr;
    last->len = r->info.len;
    last->writable = r->info.access == PeerAccess::kReadWrite;
  }
  return r;
}

std::vector<RegionInfo> RemoteRegions::List() const {
  std::lock_guard lock(mu_);
  std::vector<RegionInfo> out;
  out.reserve(by_id_.size());
  for (const Index* x : {&all_, &recent_}) {
    for (const auto& e : x->by_addr) {
      if (!e.region->revoked.load()) out.push_back(e.region->info);
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.addr < b.addr; });
  return out;
}

}  // namespace xfer
