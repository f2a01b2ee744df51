// Helpers for what threads keep of shared state: a number per thread (to spread threads over
// slots or shards evenly, which a hash of the thread id does not), and versions for tables
// whose answers threads remember (a thread's answer holds while the table's version is the one
// it read).
#pragma once

#include <atomic>
#include <cstdint>

namespace xfer {

// This thread's number: threads are numbered from 0 as they first call here.
inline unsigned ThisThreadIndex() {
  static std::atomic<unsigned> threads{0};
  thread_local const unsigned mine = threads.fetch_add(1, std::memory_order_relaxed);
  return mine;
}

// A new table version: unique in the process, so that no two tables (nor one table before and
// after a change) share a value, even at one address.
inline uint64_t NextTableVersion() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace xfer
