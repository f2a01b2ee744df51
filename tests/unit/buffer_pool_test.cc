// BufferPool with host memory: leases, waiting for a free buffer, and staged batches over a
// real in-process link (CopyLink's memcpy), by Run and through a StagedLink.
#include "transport/common/buffer_pool.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "transport/common/cuda/cuda_api.h"
#include "transport/common/host_copy.h"

namespace xfer::transport {
namespace {

using namespace std::chrono_literals;
using Clock = BufferPool::Clock;

TEST(BufferPool, LendsCountBuffersThenWaitsForOne) {
  BufferPool pool(2, 64 << 10);
  BufferPool::Lease a, b, c;
  ASSERT_TRUE(pool.Acquire(Clock::now() + 1s, &a).ok());
  ASSERT_TRUE(pool.Acquire(Clock::now() + 1s, &b).ok());
  EXPECT_NE(a.data(), b.data());
  const auto t0 = Clock::now();
  EXPECT_EQ(pool.Acquire(Clock::now() + 50ms, &c).code(), StatusCode::kTimeout);
  EXPECT_GE(Clock::now() - t0, 50ms);
  // A buffer given back wakes a waiter, who gets that very buffer.
  uint8_t* given = a.data();
  std::thread t([&] {
    std::this_thread::sleep_for(20ms);
    a = BufferPool::Lease();
  });
  ASSERT_TRUE(pool.Acquire(Clock::now() + 5s, &c).ok());
  EXPECT_EQ(c.data(), given);
  t.join();
}

TEST(BufferPool, OneOwnerHoldsAtMostItsBoundOthersStillGetBuffers) {
  BufferPool pool(4, 64 << 10, 2);
  BufferPool::Lease a1, a2, a3, b1, b2;
  ASSERT_TRUE(pool.Acquire(Clock::now() + 1s, &a1, 7).ok());
  ASSERT_TRUE(pool.Acquire(Clock::now() + 1s, &a2, 7).ok());
  // Owner 7 is at its bound while two buffers could still be made: it waits, and is told why.
  const Status third = pool.Acquire(Clock::now() + 50ms, &a3, 7);
  EXPECT_EQ(third.code(), StatusCode::kTimeout);
  EXPECT_NE(third.message().find("the most one may"), std::string::npos) << third.ToString();
  EXPECT_EQ(pool.allocated(), 2) << "a buffer was made for an owner at its bound";
  ASSERT_TRUE(pool.Acquire(Clock::now() + 1s, &b1, 9).ok());
  ASSERT_TRUE(pool.Acquire(Clock::now() + 1s, &b2, 9).ok());
  EXPECT_EQ(pool.in_use(), 4);
  // One of 9's comes back: a waiter of owner 7 stays waiting (7 is still at its bound)...
  b1 = BufferPool::Lease();
  EXPECT_EQ(pool.Acquire(Clock::now() + 50ms, &a3, 7).code(), StatusCode::kTimeout);
  // ...and one of 7's coming back lets it take one, the one that was free.
  std::thread t([&] {
    std::this_thread::sleep_for(20ms);
    a1 = BufferPool::Lease();
  });
  ASSERT_TRUE(pool.Acquire(Clock::now() + 5s, &a3, 7).ok());
  t.join();
  EXPECT_EQ(pool.in_use(), 3);
  EXPECT_EQ(pool.allocated(), 4);
  // A lease handed back into Acquire is returned first (its owner's count with it).
  ASSERT_TRUE(pool.Acquire(Clock::now() + 1s, &a3, 7).ok());
  EXPECT_EQ(pool.in_use(), 3);
}

TEST(BufferPool, BuffersGoToWaitersInTheOrderTheyCame) {
  // One buffer: a thread that gives it back and asks again at once waits behind the thread
  // that was waiting already (a busy connection must not starve a waiting one).
  BufferPool pool(1, 64 << 10);
  BufferPool::Lease held;
  ASSERT_TRUE(pool.Acquire(Clock::now() + 1s, &held, 1).ok());
  std::atomic<bool> waiting{false}, got{false}, gave_back{false};
  std::thread waiter([&] {
    BufferPool::Lease mine;
    waiting = true;
    ASSERT_TRUE(pool.Acquire(Clock::now() + 5s, &mine, 2).ok());
    got = true;
    std::this_thread::sleep_for(20ms);
    gave_back = true;
  });
  while (!waiting) std::this_thread::yield();
  while (pool.waits() == 0) std::this_thread::yield();  // (the waiter is in line)
  held = BufferPool::Lease();
  ASSERT_TRUE(pool.Acquire(Clock::now() + 5s, &held, 1).ok());
  EXPECT_TRUE(got.load()) << "the buffer went back to the thread that gave it up, past the one waiting";
  EXPECT_TRUE(gave_back.load());
  waiter.join();
  // Canceled: a waiter leaves at once when its flag is set.
  std::atomic<bool> cancel{false};
  std::thread canceler([&] {
    std::this_thread::sleep_for(20ms);
    cancel = true;
  });
  BufferPool::Lease none;
  const auto t0 = Clock::now();
  EXPECT_EQ(pool.Acquire(Clock::now() + 5s, &none, 3, &cancel).code(), StatusCode::kCanceled);
  EXPECT_LT(Clock::now() - t0, 2s);
  canceler.join();
}

TEST(BufferPool, StagedBatchesLandThroughALink) {
  auto link = std::make_shared<CopyLink>();  // (the buffers and the "peer" are this process's)
  BufferPool pool(1, 64 << 10);
  std::vector<uint8_t> src(48 << 10), dst(64 << 10, 0), back(48 << 10, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 31 + 7);
  auto at = [](std::vector<uint8_t>& v, size_t off) { return reinterpret_cast<uint64_t>(v.data() + off); };
  // Scattered both ways: three slices of 16 KiB, the second landing at an odd offset.
  const std::vector<Slice> w = {{at(src, 0), at(dst, 0), 16 << 10},
                                {at(src, 16 << 10), at(dst, (32 << 10) + 1), 16 << 10},
                                {at(src, 32 << 10), at(dst, 16 << 10), 16 << 10}};
  ASSERT_TRUE(pool.Run(Op::kWrite, w, false, *link, Clock::now() + 5s).ok());
  EXPECT_EQ(0, std::memcmp(dst.data() + (32 << 10) + 1, src.data() + (16 << 10), 16 << 10));
  std::vector<Slice> r = w;
  for (auto& s : r) s.local = at(back, s.local - at(src, 0));
  ASSERT_TRUE(pool.Run(Op::kRead, r, false, *link, Clock::now() + 5s).ok());
  EXPECT_EQ(back, src);
  // A batch larger than a buffer is a planner bug: refused, nothing moved.
  const std::vector<Slice> big = {{at(src, 0), at(dst, 0), 40 << 10}, {at(src, 0), at(dst, 0), 40 << 10}};
  EXPECT_EQ(pool.Run(Op::kWrite, big, false, *link, Clock::now() + 5s).code(), StatusCode::kInternal);
}

// A staged batch as the planner names it: a StagedLink over the route's link, one pool shared
// by the links of every route; the pool's buffers come back (two batches through one buffer).
TEST(BufferPool, AStagedLinkStagesThenMovesOverItsRoutesLink) {
  auto pool = std::make_shared<BufferPool>(1, 64 << 10);
  StagedLink staged(pool, std::make_shared<CopyLink>(), /*device=*/false);
  std::vector<uint8_t> src(32 << 10), dst(32 << 10, 0), back(32 << 10, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 13 + 1);
  const Slice w{reinterpret_cast<uint64_t>(src.data()), reinterpret_cast<uint64_t>(dst.data()), src.size()};
  ASSERT_TRUE(staged.Execute(Op::kWrite, {&w, 1}, Clock::now() + 5s).ok());
  EXPECT_EQ(dst, src);
  const Slice r{reinterpret_cast<uint64_t>(back.data()), reinterpret_cast<uint64_t>(dst.data()), dst.size()};
  ASSERT_TRUE(staged.Execute(Op::kRead, {&r, 1}, Clock::now() + 5s).ok());
  EXPECT_EQ(back, src);
  EXPECT_EQ(pool->waits(), 0u) << "the one buffer came back after each batch";
}

// A link that moves a batch within this process piece by piece, as tcp does (PieceHook), and
// lets the test look at the batch between pieces (upto: the payload bytes told so far).
class PieceLink final : public CopyLink {
 public:
  std::function<void(std::span<const Slice> batch, uint64_t upto)> between;
  Status ExecutePieces(Op op, std::span<const Slice> batch, Clock::time_point deadline,
                       PieceHook& hook) override {
    uint64_t total = 0;
    for (const Slice& s : batch) total += s.len;
    if (op == Op::kRead) CopyInProcess(op, batch);  // (landed whole, told piece by piece)
    for (uint64_t upto = 0; upto < total;) {
      upto = std::min(upto + hook.piece(), total);
      Status s = op == Op::kWrite ? hook.Ready(upto) : hook.Landed(upto);
      if (!s.ok()) return s;
      between(batch, upto);
    }
    return op == Op::kWrite ? Execute(op, batch, deadline) : Status::Ok();
  }
};

// A batch of several MiB is copied through its buffer in pieces, one piece ahead of the link:
// a WRITE's next piece is in the buffer when the link sends the one before it, and not the
// piece after; a READ's bytes are copied out as each piece lands.
TEST(BufferPool, ABatchIsCopiedPieceByPieceAsTheLinkMovesIt) {
  constexpr uint64_t kPiece = kStagePiece, kTotal = 3 * kPiece + 4097;
  PieceLink link;
  BufferPool pool(1, 4 * kPiece);
  std::vector<uint8_t> src(kTotal), dst(kTotal + 64, 0), back(kTotal, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 31 + 7) | 1;  // (never 0)
  auto at = [](std::vector<uint8_t>& v, uint64_t off) { return reinterpret_cast<uint64_t>(v.data() + off); };
  // Three slices whose ends fall inside pieces, the last one landing at an odd offset.
  const uint64_t a = kPiece / 2, b = 2 * kPiece + 3;
  const std::vector<Slice> w = {
      {at(src, 0), at(dst, 0), a}, {at(src, a), at(dst, a), b - a}, {at(src, b), at(dst, b + 1), kTotal - b}};
  std::vector<uint64_t> told;
  link.between = [&](std::span<const Slice> batch, uint64_t upto) {
    told.push_back(upto);
    const auto* buffer = reinterpret_cast<const uint8_t*>(batch[0].local);
    const uint64_t ahead = std::min(upto + kPiece, kTotal);
    EXPECT_EQ(0, std::memcmp(buffer, src.data(), ahead)) << "told " << upto;
    if (ahead < kTotal) EXPECT_EQ(0, buffer[ahead]) << "copied more than a piece ahead, told " << upto;
  };
  ASSERT_TRUE(pool.Run(Op::kWrite, w, false, link, Clock::now() + 5s).ok());
  EXPECT_EQ(told, (std::vector<uint64_t>{kPiece, 2 * kPiece, 3 * kPiece, kTotal}));
  EXPECT_EQ(0, std::memcmp(dst.data() + b + 1, src.data() + b, kTotal - b));

  std::vector<Slice> r = w;
  for (auto& s : r) s.local = at(back, s.local - at(src, 0));
  told.clear();
  link.between = [&](std::span<const Slice>, uint64_t upto) {
    told.push_back(upto);
    EXPECT_EQ(0, std::memcmp(back.data(), src.data(), upto)) << "told " << upto;
    if (upto < kTotal) EXPECT_EQ(0, back[upto]) << "copied out before it landed, told " << upto;
  };
  ASSERT_TRUE(pool.Run(Op::kRead, r, false, link, Clock::now() + 5s).ok());
  EXPECT_EQ(told.size(), 4u);
  EXPECT_EQ(back, src);
}

// A link that tries each batch twice, whatever the first try said (as tcp does a batch whose
// connection another batch broke), telling the hook from the start each time.
class TwiceLink final : public CopyLink {
 public:
  Status ExecutePieces(Op op, std::span<const Slice> batch, Clock::time_point deadline,
                       PieceHook& hook) override {
    uint64_t total = 0;
    for (const Slice& s : batch) total += s.len;
    Status s;
    for (int attempt = 0; attempt < 2; ++attempt) {
      s = op == Op::kWrite ? hook.Ready(total) : Execute(op, batch, deadline);
      if (s.ok()) s = op == Op::kWrite ? Execute(op, batch, deadline) : hook.Landed(total);
    }
    return s;
  }
};

// A staging copy that failed fails its batch, also when the link tries the batch again: the
// second try must not take the bytes the failed copy left behind for copied. (device = true
// with no GPU: every copy fails.)
TEST(BufferPool, ACopyThatFailedFailsTheBatchEvenWhenItGoesAgain) {
  if (cuda::Available(nullptr)) GTEST_SKIP() << "needs copies that fail: no usable GPU";
  TwiceLink link;
  BufferPool pool(1, 64 << 10);
  std::vector<uint8_t> src(4096, 0xab), dst(4096, 0);
  const Slice w{reinterpret_cast<uint64_t>(src.data()), reinterpret_cast<uint64_t>(dst.data()), src.size()};
  EXPECT_FALSE(pool.Run(Op::kWrite, {&w, 1}, /*device=*/true, link, Clock::now() + 5s).ok());
  const Slice r{reinterpret_cast<uint64_t>(dst.data()), reinterpret_cast<uint64_t>(src.data()), src.size()};
  EXPECT_FALSE(pool.Run(Op::kRead, {&r, 1}, /*device=*/true, link, Clock::now() + 5s).ok());
  EXPECT_EQ(dst, std::vector<uint8_t>(4096, 0));
}

// A pipelined link (as ucx is) within this process: Start only queues a piece; Drive lands the
// queued ones on another thread, the last started first, and can fail one of them.
class FlyingLink final : public CopyLink {
 public:
  bool pipelined() const override { return true; }
  void Start(Op op, std::span<const Slice> batch, Clock::time_point, Done done,
             std::function<Status()>) override {
    std::lock_guard lock(mu_);
    queued_.push_back({op, {batch.begin(), batch.end()}, std::move(done), started_++});
    most_in_flight_ = std::max(most_in_flight_, queued_.size());
  }
  void Drive(Clock::time_point until, const std::function<bool()>& finished) override {
    while (!finished() && Clock::now() < until) {
      std::vector<Flight> now;
      {
        std::lock_guard lock(mu_);
        now.swap(queued_);
      }
      std::thread([&] {
        for (auto f = now.rbegin(); f != now.rend(); ++f) {
          if (f->index == fail_piece) {
            f->done({StatusCode::kConnectionLost, "piece " + std::to_string(f->index) + " lost"});
            continue;
          }
          CopyInProcess(f->op, f->batch);
          f->done(Status::Ok());
        }
      }).join();
    }
  }
  size_t most_in_flight() {
    std::lock_guard lock(mu_);
    return most_in_flight_;
  }
  size_t queued() {
    std::lock_guard lock(mu_);
    return queued_.size();
  }
  size_t fail_piece = SIZE_MAX;

 private:
  struct Flight {
    Op op;
    std::vector<Slice> batch;
    Done done;
    size_t index;
  };
  std::mutex mu_;
  std::vector<Flight> queued_;
  size_t started_ = 0, most_in_flight_ = 0;
};

// Over a pipelined link every piece of a batch is in flight at once, landing in any order on
// any thread: the data still lands whole both ways, and a piece that failed fails the batch
// once every piece started has ended.
TEST(BufferPool, APipelinedLinksPiecesAllFlyAtOnce) {
  constexpr uint64_t kTotal = 3 * kStagePiece + 100;
  FlyingLink link;
  BufferPool pool(1, 4 * kStagePiece);
  std::vector<uint8_t> src(kTotal), dst(kTotal, 0), back(kTotal, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
  const auto at = [](std::vector<uint8_t>& v) { return reinterpret_cast<uint64_t>(v.data()); };
  const Slice w{at(src), at(dst), kTotal};
  ASSERT_TRUE(pool.Run(Op::kWrite, {&w, 1}, false, link, Clock::now() + 5s).ok());
  EXPECT_EQ(dst, src);
  EXPECT_EQ(link.most_in_flight(), 4u);
  const Slice r{at(back), at(dst), kTotal};
  ASSERT_TRUE(pool.Run(Op::kRead, {&r, 1}, false, link, Clock::now() + 5s).ok());
  EXPECT_EQ(back, src);

  link.fail_piece = 9;  // (the READ's second piece: the WRITE's were 0-3, the READ's 4-7)
  std::fill(back.begin(), back.end(), 0);
  const Status s = pool.Run(Op::kRead, {&r, 1}, false, link, Clock::now() + 5s);
  EXPECT_EQ(s.code(), StatusCode::kConnectionLost) << s.ToString();
  EXPECT_EQ(link.queued(), 0u) << "returned with pieces still in flight";
  EXPECT_EQ(0, std::memcmp(back.data(), src.data(), kStagePiece)) << "the piece before it was told";
  EXPECT_EQ(pool.in_use(), 0);
}

}  // namespace
}  // namespace xfer::transport
