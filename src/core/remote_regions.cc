#include "core/remote_regions.h"

#include <algorithm>
#include <unordered_set>

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

std::string WhyBadTable(const std::vector<wire::WireRegion>& regions) {
  std::unordered_set<uint64_t> ids;
  for (const auto& r : regions) {
    if (std::string why = WhyBad(r); !why.empty()) return why;
    if (!ids.insert(r.id).second) return "two regions have id " + std::to_string(r.id);
  }
  return "";
}

void RemoteRegions::Rebuild() {
  std::sort(by_addr_.begin(), by_addr_.end(),
            [](const auto& a, const auto& b) { return a->info.addr < b->info.addr; });
  max_end_.resize(by_addr_.size());
  uint64_t m = 0;
  for (size_t i = 0; i < by_addr_.size(); ++i) {
    m = std::max(m, by_addr_[i]->info.addr + by_addr_[i]->info.len);
    max_end_[i] = m;
  }
}

void RemoteRegions::Reset(const std::vector<wire::WireRegion>& regions) {
  std::lock_guard lock(mu_);
  for (auto& r : by_addr_) r->revoked = true;
  by_addr_.clear();
  for (const auto& w : regions) by_addr_.push_back(Make(w));
  Rebuild();
}

bool RemoteRegions::Add(const wire::WireRegion& region, std::string* why) {
  if (*why = WhyBad(region); !why->empty()) return false;
  std::lock_guard lock(mu_);
  for (const auto& r : by_addr_) {
    if (r->id == region.id) {
      *why = "region " + std::to_string(region.id) + " was added twice";
      return false;
    }
  }
  by_addr_.push_back(Make(region));
  Rebuild();
  return true;
}

std::shared_ptr<RemoteRegion> RemoteRegions::Revoke(uint64_t id) {
  std::lock_guard lock(mu_);
  auto it = std::find_if(by_addr_.begin(), by_addr_.end(),
                         [&](const auto& r) { return r->id == id; });
  if (it == by_addr_.end()) return nullptr;
  auto gone = *it;
  gone->revoked = true;
  by_addr_.erase(it);
  Rebuild();
  return gone;
}

std::vector<std::shared_ptr<RemoteRegion>> RemoteRegions::RevokeAll() {
  std::lock_guard lock(mu_);
  for (auto& r : by_addr_) r->revoked = true;
  std::vector<std::shared_ptr<RemoteRegion>> gone;
  gone.swap(by_addr_);
  Rebuild();
  return gone;
}

std::shared_ptr<RemoteRegion> RemoteRegions::Find(uint64_t addr, uint64_t len) const {
  std::lock_guard lock(mu_);
  // Candidates start at or below addr; walk down while some region could still reach addr.
  auto it = std::upper_bound(by_addr_.begin(), by_addr_.end(), addr,
                             [](uint64_t a, const auto& r) { return a < r->info.addr; });
  // A read-only region that holds the range does not end the search for one that grants
  // WRITE (each registration grants its own access).
  std::shared_ptr<RemoteRegion> read_only;
  for (size_t i = static_cast<size_t>(it - by_addr_.begin()); i-- > 0;) {
    if (max_end_[i] <= addr) break;
    const RegionInfo& r = by_addr_[i]->info;
    if (addr + len > r.addr + r.len) continue;
    if (r.access == PeerAccess::kReadWrite) return by_addr_[i];
    if (!read_only) read_only = by_addr_[i];
  }
  return read_only;
}

std::vector<RegionInfo> RemoteRegions::List() const {
  std::lock_guard lock(mu_);
  std::vector<RegionInfo> out;
  for (const auto& r : by_addr_) out.push_back(r->info);
  return out;
}

}  // namespace xfer
