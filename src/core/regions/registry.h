// Local memory regions registered with this engine.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "control/wire.h"
#include "util/thread_cache.h"
#include "xfer/status.h"
#include "xfer/types.h"

namespace xfer {

class Registry {
 public:
  // Adds region (its id is assigned here), or returns the handle of the identical range
  // registered before with the same type and access (its reference count goes up). *added says whether it is
  // new, so peers must hear of it. allocated: memory from AllocMem, released only by FreeMem.
  Status Add(const wire::WireRegion& region, bool allocated, MemHandle* handle, bool* added);
  // Drops one reference; *removed is set when the region is gone (peers must hear of it).
  // The last reference of AllocMem memory goes only with free (FreeMem), and free drops all.
  Status Remove(MemHandle handle, bool* removed, bool free = false);
  // True when [addr, addr+len) lies inside one registered region.
  bool Contains(uint64_t addr, uint64_t len) const { return Access(addr, len, false).has_value(); }
  // What peers may do with [addr, addr+len): its memory type, and whether a region that holds
  // all of it grants WRITE (with want_write, whether any of them does; without, the first one
  // found says), and that region's bounds (a range inside them gets the same answer while the
  // region stays). Nullopt when no registered region holds it all.
  // tagged: whether that region's tag is `tag` (when given and not empty).
  struct RangeAccess {
    MemType type = MemType::kHost;
    bool writable = false;
    uint64_t begin = 0, end = 0;
    bool tagged = false;
  };
  std::optional<RangeAccess> Access(uint64_t addr, uint64_t len, bool want_write,
                                    const std::string& tag = {}) const;
  // The memory type of the registered region holding all of [addr, addr+len), if any. For a
  // thread that asks again and again (the inline copies): the region this thread found last
  // answers, without the lock, while no region was added or removed since.
  std::optional<MemType> TypeOf(uint64_t addr, uint64_t len) const;
  std::vector<wire::WireRegion> Snapshot() const;
  // Changes whenever a region is added or removed (read it before looking regions up: an answer
  // then holds while it is unchanged).
  uint64_t version() const { return version_.load(std::memory_order_acquire); }
  bool Lookup(MemHandle handle, wire::WireRegion* out) const;

 private:
  struct Entry {
    wire::WireRegion region;
    bool allocated = false;
    int refs = 1;
  };
  std::atomic<uint64_t> version_{NextTableVersion()};  // changes with every region added or removed
  mutable std::mutex mu_;
  MemHandle next_ = 1;
  std::map<MemHandle, Entry> by_handle_;
  std::multimap<uint64_t, Entry*> by_addr_;  // (into by_handle_, whose nodes stay put)
  // The longest region ever added: bounds the walk of Access down the starts below an address
  // (a lookup outside every region costs O(log n), not a walk over all of them).
  uint64_t max_len_ = 0;
};

}  // namespace xfer
