#include "core/buffer_pool.h"

#include <sys/mman.h>

#include <cstring>

#include "transport/cuda/cuda_api.h"
#include "transport/local/local_transport.h"

namespace xfer {

BufferPool::BufferPool(int count, uint64_t buffer_bytes) : count_(count), bytes_(buffer_bytes) {}

BufferPool::~BufferPool() {
  for (uint8_t* b : all_) {
    if (pinned_) {
      transport::cuda::FreePinned(b);
    } else {
      ::munmap(b, bytes_);
    }
  }
}

BufferPool::Lease& BufferPool::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    Release();
    pool_ = o.pool_;
    data_ = o.data_;
    o.pool_ = nullptr;
  }
  return *this;
}

void BufferPool::Lease::Release() {
  if (pool_ == nullptr) return;
  {
    std::lock_guard lock(pool_->mu_);
    pool_->free_.push_back(data_);
  }
  pool_->cv_.notify_one();
  pool_ = nullptr;
}

Status BufferPool::Acquire(Clock::time_point deadline, Lease* out) {
  std::unique_lock lock(mu_);
  if (free_.empty() && static_cast<int>(all_.size()) < count_) {
    if (all_.empty()) pinned_ = transport::cuda::Available(nullptr);
    void* p = nullptr;
    if (pinned_) {
      if (Status s = transport::cuda::AllocPinned(bytes_, &p); !s.ok()) {
        return {s.code(), "buffer pool: " + s.message()};
      }
    } else {
      p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) {
        return {StatusCode::kInternal, "buffer pool: cannot map " + std::to_string(bytes_) +
                                           " bytes: " + std::strerror(errno)};
      }
    }
    all_.push_back(static_cast<uint8_t*>(p));
    free_.push_back(static_cast<uint8_t*>(p));
  }
  if (!cv_.wait_until(lock, deadline, [&] { return !free_.empty(); })) {
    return {StatusCode::kTimeout, "buffer pool: no staging buffer came free before the deadline"};
  }
  out->Release();
  out->pool_ = this;
  out->data_ = free_.back();
  free_.pop_back();
  return Status::Ok();
}

Status BufferPool::Copy(bool to_buffer, std::span<const transport::Slice> copies, bool device,
                        Clock::time_point deadline) {
  const Op op = to_buffer ? Op::kWrite : Op::kRead;  // WRITE copies local to remote sides
  if (device) return transport::cuda::Copy(op, copies, deadline);
  transport::CopyInProcess(op, copies);
  return Status::Ok();
}

Status BufferPool::Run(Op op, std::span<const transport::Slice> batch, bool device,
                       transport::Link& link, Clock::time_point deadline) {
  uint64_t total = 0;
  for (const auto& s : batch) total += s.len;
  if (total > bytes_) {
    return {StatusCode::kInternal, "buffer pool: a batch of " + std::to_string(total) +
                                       " bytes exceeds the staging buffer size"};
  }
  Lease lease;
  if (Status s = Acquire(deadline, &lease); !s.ok()) return s;
  // The same batch with the buffer on the local side (to send or receive) ...
  thread_local std::vector<transport::Slice> wire, copies;
  wire.clear();
  copies.clear();
  uint64_t off = 0;
  for (const auto& s : batch) {
    const uint64_t at = reinterpret_cast<uint64_t>(lease.data()) + off;
    wire.push_back({at, s.remote, s.len});
    copies.push_back({s.local, at, s.len});  // ... and the copies between it and local memory
    off += s.len;
  }
  if (op == Op::kWrite) {
    if (Status s = Copy(true, copies, device, deadline); !s.ok()) return s;
    return link.Execute(op, wire, deadline);
  }
  if (Status s = link.Execute(op, wire, deadline); !s.ok()) return s;
  return Copy(false, copies, device, deadline);
}

}  // namespace xfer
