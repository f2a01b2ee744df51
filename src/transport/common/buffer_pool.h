// BufferPool: the staging buffers of this engine's outgoing batches, for memory pairs that no
// transport reaches directly (GPU memory and a peer on another host, say). A batch is copied
// into a buffer while it is sent, piece by piece (kStagePiece; the copy of the next piece
// overlaps the send of the one before), or copied out of one as its pieces are received. Each
// batch holds one buffer, so with N buffers up to N batches of a request move at once. (A tcp
// target stages through a pool of its own, lent to one frame at a time and bounded per peer:
// see TcpTargetHooks. One pool for both would let two engines staging to each other wait on
// each other's buffers.)
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "transport/common/staging.h"
#include "transport/link.h"
#include "xfer/status.h"

namespace xfer::transport {

class BufferPool {
 public:
  using Clock = std::chrono::steady_clock;

  // Nothing is allocated until a buffer is first needed. per_owner: the most buffers one owner
  // (Acquire's) holds at once; 0: count.
  BufferPool(int count, uint64_t buffer_bytes, int per_owner = 0)
      : count_(count), bytes_(buffer_bytes), per_owner_(per_owner > 0 ? per_owner : count) {}

  uint64_t buffer_bytes() const { return bytes_; }

  // One buffer, returned to the pool when the lease ends.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept : pool_(o.pool_), data_(o.data_), owner_(o.owner_) { o.pool_ = nullptr; }
    Lease& operator=(Lease&& o) noexcept;
    ~Lease() { Release(); }
    uint8_t* data() const { return data_; }

   private:
    friend class BufferPool;
    void Release();
    BufferPool* pool_ = nullptr;
    uint8_t* data_ = nullptr;
    uint64_t owner_ = 0;
  };
  // A free buffer, allocating one while fewer than count exist; else, or while owner holds
  // per_owner already, waits until one is returned (kTimeout at the deadline: a deadline
  // passed already only takes one that is free, or can be made, now; kCanceled once *cancel is
  // set). Buffers go to the waiters in the order they came, each in turn once its owner is
  // under its bound.
  Status Acquire(Clock::time_point deadline, Lease* out, uint64_t owner = 0,
                 const std::atomic<bool>* cancel = nullptr);
  // How many times Acquire found no buffer free and waited for one.
  uint64_t waits() const { return waits_.load(std::memory_order_relaxed); }
  // Buffers allocated (lent or free).
  int allocated() {
    std::lock_guard lock(mu_);
    return static_cast<int>(all_.size());
  }
  // Buffers lent now (allocated and not returned).
  int in_use() {
    std::lock_guard lock(mu_);
    return static_cast<int>(all_.size() - free_.size());
  }

  // Moves a batch to or from a peer through one buffer (Link::ExecutePieces): WRITE copies the
  // slices' local sides into the buffer as link sends it; READ copies out as it is received.
  // device: the local sides are GPU memory (copied by the copy engines), else host memory.
  // The batch must fit one buffer.
  Status Run(Op op, std::span<const Slice> batch, bool device, Link& link, Clock::time_point deadline);

 private:
  const int count_;
  const uint64_t bytes_;
  const int per_owner_;
  std::mutex mu_;
  std::condition_variable cv_;
  int allocating_ = 0;                               // mu_
  std::vector<std::unique_ptr<StagingBuffer>> all_;  // mu_
  std::vector<uint8_t*> free_;                       // mu_
  std::unordered_map<uint64_t, int> held_;           // mu_: buffers lent, by owner (none: absent)
  std::list<uint64_t> waiting_;                      // mu_: the owners of Acquires under way, oldest first
  bool AtBound(uint64_t owner) const;                // mu_
  Status Lend(uint64_t owner, Lease* out);           // mu_: the last free buffer, to owner
  // mu_: whether it is the turn of waiter `me`: its owner is under its bound, and every older
  // waiter's is at it.
  bool Turn(std::list<uint64_t>::const_iterator me) const;
  std::atomic<uint64_t> waits_{0};
};

// A link that stages its batches through the pool, then moves them over another link (a
// route's, whose far side is the peer's memory): Plan::Batch names it for a staged batch.
// device: the batches' local sides are GPU memory (copied by the copy engines), else host memory.
class StagedLink final : public Link {
 public:
  StagedLink(std::shared_ptr<BufferPool> pool, std::shared_ptr<Link> inner, bool device)
      : pool_(std::move(pool)), inner_(std::move(inner)), device_(device) {}
  Status Execute(Op op, std::span<const Slice> batch, Clock::time_point deadline) override {
    return pool_->Run(op, batch, device_, *inner_, deadline);
  }

 private:
  const std::shared_ptr<BufferPool> pool_;
  const std::shared_ptr<Link> inner_;
  const bool device_;
};

}  // namespace xfer::transport
