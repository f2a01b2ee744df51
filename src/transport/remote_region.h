// A peer's region as this engine knows it: what the peer advertised (its wire record, with a
// blob per backend), whether it was revoked, and what backends opened of it here.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
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

  // What a backend opened of the region here (a mapping; may be shared by several backends
  // under one key), and where its first byte is addressable.
  struct Opened {
    std::string key;
    std::shared_ptr<void> handle;
    uint8_t* base = nullptr;
  };
  using Opener = std::function<Status(std::shared_ptr<void>* handle, uint8_t** base)>;
  // The base opened under key, opening it on first use (once: a failure is not retried, and
  // is logged by the opener's caller from the returned status). Null once the region is closed.
  uint8_t* OpenOnce(std::string_view key, const Opener& open, Status* failure = nullptr) {
    std::lock_guard lock(open_mu_);
    for (const Opened& o : opened_) {
      if (o.key == key) return o.base;
    }
    if (closed_ || revoked.load()) return nullptr;
    Opened o{std::string(key), nullptr, nullptr};
    Status s = open(&o.handle, &o.base);
    if (!s.ok()) {
      o = Opened{std::string(key), nullptr, nullptr};
      if (failure != nullptr) *failure = std::move(s);
    }
    opened_.push_back(std::move(o));
    return opened_.back().base;
  }
  // Closes what was opened, for good. Called once the region is revoked and no batch uses it
  // any more, before the owner is told: CUDA forbids the owner to free memory that another
  // process still has open.
  void CloseAll() {
    std::vector<Opened> gone;
    {
      std::lock_guard lock(open_mu_);
      closed_ = true;
      gone.swap(opened_);
    }
  }

 private:
  std::mutex open_mu_;
  std::vector<Opened> opened_;  // open_mu_
  bool closed_ = false;         // open_mu_
};

}  // namespace xfer::transport
