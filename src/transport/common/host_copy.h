// Copies between ranges that are both addressable in this process: the local backend's
// transfers (the peer is this process), shm's and cuda's into a peer's memory mapped here, the
// staging buffers' host side, and the engine's inline copies.
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <span>

#include "transport/link.h"

namespace xfer::transport {

// memcpy: the ranges must not overlap.
inline void CopyHost(void* dst, const void* src, size_t n) { std::memcpy(dst, src, n); }
// memmove: for ranges that may overlap (only within one process).
inline void MoveHost(void* dst, const void* src, size_t n) { std::memmove(dst, src, n); }

// memcpy with non-temporal stores, which bypass the caches: faster for copies too large to stay
// there, slower for those that would (bench/RESULTS.md, "How the defaults were chosen").
void StreamingCopy(void* dst, const void* src, uint64_t n);

// Copies a batch whose slices' both sides are mapped here (remote: the peer's memory as mapped
// in this process). streaming: with StreamingCopy.
void CopyInProcess(Op op, std::span<const Slice> batch, bool streaming = false);

// A link that copies its batches in process (CopyInProcess).
class CopyLink : public Link {
 public:
  explicit CopyLink(bool streaming = false) : streaming_(streaming) {}
  Status Execute(Op op, std::span<const Slice> batch, Clock::time_point) override {
    CopyInProcess(op, batch, streaming_);
    return Status::Ok();
  }

 private:
  const bool streaming_;
};

}  // namespace xfer::transport
