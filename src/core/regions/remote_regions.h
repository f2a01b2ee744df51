// A peer's advertised regions, as this engine last heard of them.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "control/wire.h"
#include "transport/remote_region.h"
#include "util/thread_cache.h"

namespace xfer {

using transport::RemoteRegion;

// Every operation is O(log n) or amortized O(1) in the number of regions, so that a peer
// adding or removing 100,000 regions one by one costs the control thread no quadratic work.
class RemoteRegions {
 private:
  // Regions sorted by start address, with the largest end among each prefix (a revoked
  // region stays, skipped, until the next compaction: its end only makes walks longer).
  struct Index {
    struct Entry {
      uint64_t addr = 0, end = 0;
      uint64_t max_end = 0;  // the largest end among this entry and those before it
      std::shared_ptr<RemoteRegion> region;
    };
    std::vector<Entry> by_addr;  // (addresses inline: rebuilding touches no region)
    void Rebuild(size_t from);   // max_end from position `from` on
    void Insert(std::shared_ptr<RemoteRegion> r);
    // A live region holding the range: the first found, or with write the first writable one
    // (else the first found).
    std::shared_ptr<RemoteRegion> Find(uint64_t addr, uint64_t len, bool write) const;
  };
  using ById = std::unordered_map<uint64_t, std::shared_ptr<RemoteRegion>>;

 public:
  // A peer's whole table (its hello's), checked and indexed on any thread: O(n log n), a
  // second for a million regions, so the control loop makes big ones on its worker.
  class Table {
   public:
    // why_bad() says why the table is not one to use ("" when it is): more than max_regions
    // regions, a region of zero length, one that wraps past the end of the address space, or
    // two with one id. (A bad table keeps nothing.)
    Table(const std::vector<wire::WireRegion>& regions, size_t max_regions);
    const std::string& why_bad() const { return why_bad_; }

   private:
    friend class RemoteRegions;
    std::string why_bad_;
    Index index_;
    ById by_id_;
  };
  // Takes a good table's regions in place of the ones known (those are revoked).
  void Adopt(Table&& table);
  // (Tests: a table known to be good; a bad one leaves no region.)
  void Reset(const std::vector<wire::WireRegion>& regions) { Adopt(Table(regions, SIZE_MAX)); }
  // Adds the region; false (nothing added, *why set) when it is bad or its id is taken.
  bool Add(const wire::WireRegion& region, std::string* why);
  // Marks the region revoked and forgets it; returns it (null when the id is unknown).
  std::shared_ptr<RemoteRegion> Revoke(uint64_t id);
  // Revokes every region (the peer is gone) and returns them (with what indexed them: all of
  // it is freed wherever the result goes).
  struct Revoked {
    std::vector<std::shared_ptr<RemoteRegion>> regions;
    ById by_id;
  };
  Revoked RevokeAll();
  // The region that holds all of [addr, addr+len), or null; with write, one that grants
  // WRITE where there is one (a read-only one otherwise: the caller says why not).
  std::shared_ptr<RemoteRegion> Find(uint64_t addr, uint64_t len, bool write = false) const;
  // Find for a thread that asks again and again (the inline copies): the region this thread
  // found last answers, without the lock, while it holds the range, is not revoked and (write)
  // grants WRITE. (A region added since cannot make that answer wrong.)
  std::shared_ptr<RemoteRegion> FindRemembered(uint64_t addr, uint64_t len, bool write) const;
  std::vector<RegionInfo> List() const;
  size_t size() const {
    std::lock_guard lock(mu_);
    return by_id_.size();
  }

 private:
  // New regions go to recent_ (small: inserting costs little); past kRecent they are merged
  // into all_ at once, which costs O(n) once per kRecent additions.
  static constexpr size_t kRecent = 1024;
  void MergeRecent();  // mu_ held
  void DropRevoked();  // compacts both indexes once revoked entries are half of them; mu_ held
  const uint64_t table_id_ = NextTableVersion();  // (unique: tells tables apart in FindRemembered)
  mutable std::mutex mu_;
  Index all_, recent_;           // mu_
  ById by_id_;                   // mu_: live ones
  size_t revoked_in_index_ = 0;  // mu_
};

}  // namespace xfer
