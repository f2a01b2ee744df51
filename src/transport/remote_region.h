// A peer's region as this engine knows it: what the peer advertised (its wire record, with a
// blob per backend), whether it was revoked, and what backends opened of it here.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "xfer/types.h"

namespace xfer::transport {

// One (backend name, bytes) entry of a hello or region record: what that backend of the sender
// needs its peers to know. Opaque to everything but that backend.
struct Blob {
  std::string backend;
  std::string bytes;
  bool operator==(const Blob&) const = default;
};
using Blobs = std::vector<Blob>;

// The bytes of backend's entry, or null when there is none.
inline const std::string* FindBlob(const Blobs& blobs, std::string_view backend) {
  for (const Blob& b : blobs) {
    if (b.backend == backend) return &b.bytes;
  }
  return nullptr;
}

struct RemoteRegion {
  uint64_t id = 0;
  RegionInfo info;
  Blobs blobs;
  // Set when the owner deregisters it: batches check this before they move a byte.
  std::atomic<bool> revoked{false};

  // What backends opened of the region here (mappings), each under a key: the address of a
  // tag object of the backend's (so that several backends may share one mapping), and where
  // its first byte is addressable.
  using OpenKey = const void*;
  // The base opened under key, opening it on first use with open(std::shared_ptr<void>* handle,
  // uint8_t** base) -> Status (once: a failure is not retried; the opener's status comes back
  // in *failure for the caller to log). Null once the region is closed. After the first call
  // the answer costs a few loads: no lock, no allocation.
  template <class Opener>
  uint8_t* OpenOnce(OpenKey key, Opener&& open, Status* failure = nullptr) {
    if (uint8_t* const* known = Known(key)) return *known;
    std::lock_guard lock(open_mu_);
    if (uint8_t* const* known = Known(key)) return *known;
    const size_t n = count_.load(std::memory_order_relaxed);
    if (closed_.load() || revoked.load() || n == kMaxOpened) return nullptr;
    Opened& o = opened_[n];
    Status s = open(&o.handle, &o.base);
    if (!s.ok()) {
      o.handle.reset();
      o.base = nullptr;
      if (failure != nullptr) *failure = std::move(s);
    }
    o.key = key;
    count_.store(n + 1, std::memory_order_release);  // publishes o
    return o.base;
  }
  // Closes what was opened, for good, the last opened first (an opening may build on an
  // earlier one: cuda page-locks shm's mapping). Called once the region is revoked and no batch
  // uses it any more, before the owner is told: CUDA forbids the owner to free memory that
  // another process still has open.
  void CloseAll() {
    std::lock_guard lock(open_mu_);
    closed_.store(true);
    for (size_t i = count_.load(std::memory_order_relaxed); i > 0; --i) opened_[i - 1].handle.reset();
  }

 private:
  struct Opened {
    OpenKey key = nullptr;
    std::shared_ptr<void> handle;  // released by CloseAll; key and base stay for readers
    uint8_t* base = nullptr;
  };
  // Openings per region: shm's mapping, and cuda's page-locking of it or its IPC open. (The
  // array's elements are destroyed last first, as CloseAll releases them.)
  static constexpr size_t kMaxOpened = 4;
  // The published entry for key, or null (then the caller takes the lock).
  uint8_t* const* Known(OpenKey key) const {
    if (closed_.load(std::memory_order_acquire)) {
      static uint8_t* const kNone = nullptr;
      return &kNone;
    }
    const size_t n = count_.load(std::memory_order_acquire);
    for (size_t i = 0; i < n; ++i) {
      if (opened_[i].key == key) return &opened_[i].base;
    }
    return nullptr;
  }

  std::mutex open_mu_;         // serializes opening and closing
  Opened opened_[kMaxOpened];  // [0, count_) published, then immutable but handle
  std::atomic<size_t> count_{0};
  std::atomic<bool> closed_{false};
};

}  // namespace xfer::transport
