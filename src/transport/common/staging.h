// Staging memory: host buffers that GPU memory passes through on its way to or from a
// transport that cannot reach it (tcp's sockets, cma's system calls). Under
// EngineOptions::staging = Staging::kAlways host memory takes the same way, standing in for GPU memory.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "transport/link.h"
#include "xfer/status.h"

namespace xfer::transport {

// One buffer: page-locked host memory (cudaHostAlloc) when a GPU is usable, so the copy
// engines reach it at full speed; plain pages otherwise, or when page-locked memory runs out.
class StagingBuffer {
 public:
  static Status Allocate(uint64_t bytes, std::unique_ptr<StagingBuffer>* out);
  ~StagingBuffer();
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;
  uint8_t* data() const { return data_; }

 private:
  StagingBuffer(uint8_t* data, uint64_t bytes, bool pinned) : data_(data), bytes_(bytes), pinned_(pinned) {}
  uint8_t* data_;
  uint64_t bytes_;
  bool pinned_;
};

// Copies between memory and staging buffers: each slice's local side is the memory (GPU memory
// when device, else host memory), its remote side a buffer; into the buffers when to_buffer,
// out of them otherwise.
Status StageCopy(bool to_buffer, std::span<const Slice> copies, bool device, Clock::time_point deadline);

// A staged batch moves in pieces of at most this many bytes, so that the copy of one overlaps
// the network moving another: small enough that a batch of a few MiB is several pieces, large
// enough that a copy's fixed cost (~10 us on a GPU) stays small against it.
constexpr uint64_t kStagePiece = 1 << 20;

// StageCopy in two steps, so that this thread sends or receives one piece while the copy
// engines copy the next (GPU memory); host memory is copied by Start, on this thread. One
// started copy at a time per thread (cuda::StartCopy): Finish it before the next Start. The
// destructor waits for a copy still running: the memory it touches must outlive it.
class PendingCopy {
 public:
  PendingCopy() = default;
  PendingCopy(const PendingCopy&) = delete;
  PendingCopy& operator=(const PendingCopy&) = delete;
  ~PendingCopy();
  Status Start(bool to_buffer, std::span<const Slice> copies, bool device);
  // Ok when nothing was started.
  Status Finish(Clock::time_point deadline);

 private:
  bool running_ = false;  // a device copy runs
};

}  // namespace xfer::transport
