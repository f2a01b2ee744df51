#include "transport/common/buffer_pool.h"

#include <algorithm>
#include <new>

namespace xfer::transport {

BufferPool::Lease& BufferPool::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    Release();
    pool_ = o.pool_;
    data_ = o.data_;
    owner_ = o.owner_;
    o.pool_ = nullptr;
  }
  return *this;
}

void BufferPool::Lease::Release() {
  if (pool_ == nullptr) return;
  {
    std::lock_guard lock(pool_->mu_);
    pool_->free_.push_back(data_);
    if (auto it = pool_->held_.find(owner_); --it->second == 0) pool_->held_.erase(it);
  }
  pool_->cv_.notify_all();  // (a waiter at its owner's bound cannot take it; another may)
  pool_ = nullptr;
}

bool BufferPool::AtBound(uint64_t owner) const {
  const auto it = held_.find(owner);
  return it != held_.end() && it->second >= per_owner_;
}

bool BufferPool::Turn(std::list<uint64_t>::const_iterator me) const {
  for (auto it = waiting_.begin(); it != me; ++it) {
    if (!AtBound(*it)) return false;  // (an older waiter that may take one)
  }
  return !AtBound(*me);
}

Status BufferPool::Acquire(Clock::time_point deadline, Lease* out, uint64_t owner,
                           const std::atomic<bool>* cancel) {
  out->Release();  // (before the lock: it may be this pool's)
  std::unique_lock lock(mu_);
  // Nobody waiting and a buffer free: taken at once (a staged batch's every call, most often).
  if (waiting_.empty() && !free_.empty() && !AtBound(owner)) return Lend(owner, out);
  const auto me = waiting_.insert(waiting_.end(), owner);
  struct Leave {  // (a waiter that leaves may have been the one whose turn it was)
    BufferPool& pool;
    std::list<uint64_t>::const_iterator me;
    ~Leave() {
      pool.waiting_.erase(me);
      if (!pool.waiting_.empty()) pool.cv_.notify_all();
    }
  } leave{*this, me};
  bool waited = false;  // (one wait counted per Acquire)
  for (;;) {
    const bool turn = Turn(me);
    if (turn && !free_.empty()) break;
    if (turn && static_cast<int>(all_.size()) + allocating_ < count_) {
      // Allocated outside the lock: page-locking a large buffer takes a while.
      ++allocating_;
      lock.unlock();
      std::unique_ptr<StagingBuffer> buf;
      Status s;
      try {  // (the lock is back, and the count right, however the allocation ends)
        s = StagingBuffer::Allocate(bytes_, &buf);
      } catch (const std::bad_alloc&) {
        s = {StatusCode::kResourceExhausted, "out of memory for a staging buffer"};
      }
      lock.lock();
      --allocating_;
      if (s.ok()) {
        all_.reserve(all_.size() + 1);  // (may throw: before the buffer is listed)
        free_.reserve(free_.size() + 1);
        free_.push_back(buf->data());
        all_.push_back(std::move(buf));
        continue;
      }
      // Out of memory: wait for a buffer that exists, if any does.
      if (all_.empty()) return {s.code(), "buffer pool: " + s.message()};
    }
    if (cancel != nullptr && cancel->load(std::memory_order_acquire)) {
      return {StatusCode::kCanceled, "buffer pool: the wait for a staging buffer was canceled"};
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      return {StatusCode::kTimeout, AtBound(owner)
                                        ? "buffer pool: this peer holds " + std::to_string(per_owner_) +
                                              " staging buffers, the most one may, and none came back "
                                              "before the deadline"
                                        : std::string("buffer pool: no staging buffer came free before "
                                                      "the deadline")};
    }
    if (!waited) waits_.fetch_add(1, std::memory_order_relaxed);
    waited = true;
    // (With a cancel flag, looked at every few milliseconds: nothing here is told it changed.)
    cv_.wait_until(lock,
                   cancel == nullptr ? deadline : std::min(deadline, now + std::chrono::milliseconds(5)));
  }
  return Lend(owner, out);
}

Status BufferPool::Lend(uint64_t owner, Lease* out) {
  ++held_[owner];  // (may throw: before the lease holds the buffer)
  out->pool_ = this;
  out->data_ = free_.back();
  out->owner_ = owner;
  free_.pop_back();
  return Status::Ok();
}

namespace {

// The copies between local memory and one staging buffer, piece by piece, as the link moves
// the batch (PieceHook): a WRITE copies the next piece into the buffer while the link sends
// the one before; a READ copies a piece out while the link receives the next.
class Pipe final : public PieceHook {
 public:
  // copies: local sides the memory, remote sides the buffer, in the buffer's order.
  Pipe(bool write, std::span<const Slice> copies, uint64_t total, bool device, Clock::time_point deadline)
      : write_(write), cutter_(copies), total_(total), device_(device), deadline_(deadline) {}

  uint64_t piece() const override { return kStagePiece; }
  Status Ready(uint64_t upto) override {
    upto = std::min(upto, total_);
    while (failed_.ok() && done_ < upto) {
      if (queued_ == done_) Start(std::min(done_ + kStagePiece, total_));
      if (failed_.ok()) Fail(pending_.Finish(deadline_));
      if (!failed_.ok()) break;
      done_ = queued_;
      // The next piece's copy, while the link sends this one.
      if (done_ < total_) Start(std::min(done_ + kStagePiece, total_));
    }
    return failed_;
  }
  Status Landed(uint64_t upto) override {
    upto = std::min(upto, total_);
    if (failed_.ok() && upto > queued_) {  // (else landed again: the batch went again)
      Fail(pending_.Finish(deadline_));
      if (failed_.ok()) Start(upto);
    }
    return failed_;
  }
  // The last copy's end (READ: the batch's bytes are all where they belong then).
  Status Finish() {
    Fail(pending_.Finish(deadline_));
    return failed_;
  }

 private:
  // Starts the copy of the buffer's bytes [queued_, end).
  void Start(uint64_t end) {
    cutter_.Next(end - queued_, &cut_);
    queued_ = end;
    Fail(pending_.Start(write_, cut_, device_));
  }
  // A copy that failed fails the batch for good: a batch that goes again (PieceHook) must not
  // take the bytes it left behind for copied.
  void Fail(Status s) {
    if (failed_.ok() && !s.ok()) failed_ = std::move(s);
  }

  const bool write_;
  SliceCutter cutter_;
  const uint64_t total_;
  const bool device_;
  const Clock::time_point deadline_;
  std::vector<Slice> cut_;  // the copies of the piece started last
  uint64_t queued_ = 0;     // bytes whose copy was started
  uint64_t done_ = 0;       // WRITE: bytes whose copy finished
  Status failed_;           // the first copy that failed
  PendingCopy pending_;     // (waited for before the buffer goes back to the pool: declared last)
};

}  // namespace

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
  Pipe pipe(op == Op::kWrite, copies, total, device, deadline);
  if (Status s = link.ExecutePieces(op, wire, deadline, pipe); !s.ok()) return s;
  if (op == Op::kRead) {
    if (Status s = pipe.Landed(total); !s.ok()) return s;  // (nothing when the link told it all)
  }
  return pipe.Finish();
}

}  // namespace xfer::transport
