// BufferPool: staging buffers for memory pairs that no transport reaches directly (GPU memory
// and a peer on another host, say). A batch is copied into a buffer, sent, and on the far side
// received and copied out (or the reverse for READ). Each batch holds one buffer, so with N
// buffers up to N batches of a request move at once: one stream copying while another sends.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include "transport/transport.h"
#include "xfer/status.h"

namespace xfer {

class BufferPool {
 public:
  using Clock = std::chrono::steady_clock;

  // Nothing is allocated until a buffer is first needed. Buffers are page-locked (cudaHostAlloc)
  // when a GPU is present, so the copy engines reach them at full speed; plain pages otherwise.
  BufferPool(int count, uint64_t buffer_bytes);
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  uint64_t buffer_bytes() const { return bytes_; }

  // One buffer, returned to the pool when the lease ends.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept : pool_(o.pool_), data_(o.data_) { o.pool_ = nullptr; }
    Lease& operator=(Lease&& o) noexcept;
    ~Lease() { Release(); }
    uint8_t* data() const { return data_; }

   private:
    friend class BufferPool;
    void Release();
    BufferPool* pool_ = nullptr;
    uint8_t* data_ = nullptr;
  };
  // Waits until a buffer is free (kTimeout at the deadline).
  Status Acquire(Clock::time_point deadline, Lease* out);

  // Moves a batch to or from a peer through one buffer: WRITE copies the slices' local sides
  // into the buffer and sends it over link; READ receives into the buffer and copies out.
  // device: the local sides are GPU memory (copied by the copy engines), else host memory.
  // The batch must fit one buffer.
  Status Run(Op op, std::span<const transport::Slice> batch, bool device, transport::Link& link,
             Clock::time_point deadline);

  // Copies between memory and staging buffers: each slice's local side is the memory (GPU
  // memory when device, else host memory), its remote side a buffer; into the buffers when
  // to_buffer, out of them otherwise.
  static Status Copy(bool to_buffer, std::span<const transport::Slice> copies, bool device,
                     Clock::time_point deadline);

 private:
  const int count_;
  const uint64_t bytes_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint8_t*> all_;   // mu_
  std::vector<uint8_t*> free_;  // mu_
  bool pinned_ = false;         // mu_: all_ came from cudaHostAlloc
};

}  // namespace xfer
