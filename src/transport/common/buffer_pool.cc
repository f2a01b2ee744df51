#include "transport/common/buffer_pool.h"

namespace xfer::transport {

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
  bool waited = false;  // (one wait counted per Acquire)
  while (free_.empty()) {
    if (static_cast<int>(all_.size()) + allocating_ < count_) {
      // Allocated outside the lock: page-locking a large buffer takes a while.
      ++allocating_;
      lock.unlock();
      std::unique_ptr<StagingBuffer> buf;
      Status s = StagingBuffer::Allocate(bytes_, &buf);
      lock.lock();
      --allocating_;
      if (s.ok()) {
        free_.push_back(buf->data());
        all_.push_back(std::move(buf));
        continue;
      }
      // Out of memory: wait for a buffer that exists, if any does (and let other waiters
      // try again).
      cv_.notify_all();
      if (all_.empty()) return {s.code(), "buffer pool: " + s.message()};
    }
    if (!waited) waits_.fetch_add(1, std::memory_order_relaxed);
    waited = true;
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && free_.empty()) {
      return {StatusCode::kTimeout, "buffer pool: no staging buffer came free before the deadline"};
    }
  }
  out->Release();
  out->pool_ = this;
  out->data_ = free_.back();
  free_.pop_back();
  return Status::Ok();
}

Status BufferPool::Run(Op op, std::span<const Slice> batch, bool device, Link& link,
                       Clock::time_point deadline) {
  uint64_t total = 0;
  for (const Slice& s : batch) total += s.len;
  if (total > bytes_) {
    return {StatusCode::kInternal,
            "buffer pool: a batch of " + std::to_string(total) + " bytes exceeds the staging buffer size"};
  }
  Lease lease;
  if (Status s = Acquire(deadline, &lease); !s.ok()) return s;
  // The batch with the buffer on the local side (to send or receive), and the copies
  // between the buffer and local memory.
  thread_local std::vector<Slice> wire, copies;
  wire.clear();
  copies.clear();
  uint64_t off = 0;
  for (const auto& s : batch) {
    const uint64_t at = reinterpret_cast<uint64_t>(lease.data()) + off;
    wire.push_back({at, s.remote, s.len});
    copies.push_back({s.local, at, s.len});
    off += s.len;
  }
  if (op == Op::kWrite) {
    if (Status s = StageCopy(true, copies, device, deadline); !s.ok()) return s;
    return link.Execute(op, wire, deadline);
  }
  if (Status s = link.Execute(op, wire, deadline); !s.ok()) return s;
  return StageCopy(false, copies, device, deadline);
}

}  // namespace xfer::transport
