#include "core/datapath/stream_pool.h"

#include "core/awaiting_control.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

namespace xfer {
namespace {
using Clock = std::chrono::steady_clock;

// A fence that is never late: its deadline is far.
void Fence(StreamPool& pool) {
  pool.Fence(Clock::now() + std::chrono::seconds(60), [] { ADD_FAILURE() << "a fence was late"; });
}

TEST(StreamPool, RunsEveryTaskAndDrainsOnStop) {
  std::atomic<int> ran{0};
  {
    StreamPool pool(3, std::chrono::microseconds(10));
    for (int i = 0; i < 1000; ++i) pool.Submit(i, [&] { ran.fetch_add(1); });
    pool.Stop();
    EXPECT_EQ(ran.load(), 1000);
    pool.Submit(0, [&] { ran.fetch_add(1); });  // after Stop: runs inline, never lost
    EXPECT_EQ(ran.load(), 1001);
  }
}

TEST(StreamPool, FenceWaitsForTheRunningBatchNotTheWholeTask) {
  // A task that runs two batches, each under its slot, and idles between them: a fence called
  // during the first waits for it, and one called between them returns at once (the control
  // thread must not wait out a long request for a peer's deregistration).
  StreamPool pool(2, std::chrono::microseconds(0));
  std::atomic<int> stage{0};
  pool.Submit(0, [&] {
    {
      auto slot = pool.Slot();
      stage = 1;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      stage = 2;
    }
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (stage != 3 && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
    auto slot = pool.Slot();
    stage = 4;
  });
  while (stage != 1) std::this_thread::yield();
  Fence(pool);
  EXPECT_EQ(stage.load(), 2);
  const auto t0 = std::chrono::steady_clock::now();
  Fence(pool);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  stage = 3;
  // And a caller's thread holds an inline slot, which a fence waits for as well.
  std::atomic<bool> held{false}, fenced{false};
  std::thread caller([&] {
    auto slot = pool.Slot();
    held = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_FALSE(fenced.load());
  });
  while (!held) std::this_thread::yield();
  Fence(pool);
  fenced = true;
  caller.join();
}

TEST(StreamPool, ALateFenceCallsOnLateOnceThenWaitsForTheBatches) {
  // Two batches that end only when on_late is called (as Link::Interrupt ends a stalled one):
  // the fence calls it at its deadline, and returns when both have ended.
  StreamPool pool(2, std::chrono::microseconds(0));
  std::atomic<bool> interrupted{false};
  std::atomic<int> holding{0}, ended{0};
  for (int i = 0; i < 2; ++i) {
    pool.Submit(i, [&] {
      auto slot = pool.Slot();
      holding.fetch_add(1);
      const auto give_up = Clock::now() + std::chrono::seconds(10);
      while (!interrupted && Clock::now() < give_up) std::this_thread::yield();
      ended.fetch_add(1);
    });
  }
  while (holding != 2) std::this_thread::yield();
  int late = 0;
  const auto t0 = Clock::now();
  pool.Fence(t0 + std::chrono::milliseconds(200), [&] {
    ++late;
    EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(200)) << "on_late before the deadline";
    interrupted = true;
  });
  EXPECT_GE(late, 1);
  EXPECT_EQ(ended.load(), 2) << "the fence returned while a batch still ran";
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
}

TEST(StreamPool, AThreadMarksOnlyTheSlotItHolds) {
  // A batch that waits for the control thread marks the slot it holds, and a fence the control
  // thread runs passes it by; once the slot is released, the thread marks no slot (another
  // thread may hold that one by then, and its batch must not be passed by).
  StreamPool pool(1, std::chrono::microseconds(0));
  {
    auto slot = pool.Slot();
    const AwaitingControl awaiting;
    const auto t0 = Clock::now();
    std::thread control([&] {
      pool.Fence(
          Clock::now() + std::chrono::seconds(60), [] {}, true);
    });
    control.join();
    EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5)) << "the fence did not pass the awaiting batch by";
  }
  EXPECT_EQ(AwaitingControl::Mark(), nullptr) << "the released slot is still this thread's mark";
  // Another thread takes the same inline slot and does not wait for the control thread; this
  // thread, holding no slot, says it waits: the fence must still wait for the other's batch.
  std::atomic<bool> release{false};
  int k = -1;
  { auto probe = pool.Slot(&k); }
  std::thread other;
  for (int tries = 0; tries < 10 * StreamPool::kInlineSlots; ++tries) {  // (a thread with this one's slot)
    std::atomic<int> state{0};                                           // 1: holds slot k; 2: another
    other = std::thread([&] {
      int mine = -1;
      auto slot = pool.Slot(&mine);
      state = mine == k ? 1 : 2;
      while (mine == k && !release) std::this_thread::yield();
    });
    while (state == 0) std::this_thread::yield();
    if (state == 1) break;
    other.join();
  }
  ASSERT_TRUE(other.joinable()) << "no thread got inline slot " << k;
  {
    const AwaitingControl awaiting;  // (on a thread that holds no slot: marks nothing)
    std::atomic<bool> fenced{false};
    std::thread control([&] {
      pool.Fence(
          Clock::now() + std::chrono::seconds(60), [] {}, true);
      fenced = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_FALSE(fenced.load()) << "the fence passed by a batch that does not wait for the control thread";
    release = true;
    control.join();
  }
  other.join();
}

// Copies of every length around the threshold, odd ones included, land whole and touch
// nothing outside the destination, whether or not a stream takes half.
void CheckSharedCopies(StreamPool& pool, uint32_t seed) {
  std::mt19937_64 rng(seed);
  constexpr size_t kGuard = 64;
  for (size_t len :
       {size_t{1}, size_t{4095}, StreamPool::kMinSharedCopy - 1, StreamPool::kMinSharedCopy,
        StreamPool::kMinSharedCopy + 1, size_t{65536 + 7}, size_t{1} << 20, (size_t{3} << 20) + 13}) {
    std::vector<uint8_t> src(len), dst(len + 2 * kGuard, 0xAB);
    for (auto& b : src) b = static_cast<uint8_t>(rng());
    for (int round = 0; round < 20; ++round) {
      src[round % len] ^= 0xFF;  // each round copies different bytes
      pool.SharedCopy(dst.data() + kGuard, src.data(), len);
      ASSERT_EQ(std::memcmp(dst.data() + kGuard, src.data(), len), 0) << "length " << len;
    }
    for (size_t i = 0; i < kGuard; ++i) {
      ASSERT_EQ(dst[i], 0xAB) << "written before the destination, length " << len;
      ASSERT_EQ(dst[kGuard + len + i], 0xAB) << "written past the destination, length " << len;
    }
  }
}

TEST(StreamPool, SharedCopyLandsWholeAndStreamsTakeHalves) {
  StreamPool pool(2, std::chrono::milliseconds(50));  // streams spin long: they take halves
  CheckSharedCopies(pool, 1);
  // A loaded machine may not have run a stream yet, and its share rule may have found copying
  // alone cheaper (then only a trial of 4 copies in 128 offers a half, and the stream that the
  // trial's first copy wakes may not run before the trial is over): keep a stream spinning with
  // an empty task before each copy, and give it up to 5 s of copies to take a half.
  std::vector<uint8_t> a(1 << 20), b(1 << 20);
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
       pool.shared_halves() == 0 && std::chrono::steady_clock::now() < until;) {
    pool.Submit(0, [] {});
    std::fill(a.begin(), a.end(), static_cast<uint8_t>(a[0] + 1));
    pool.SharedCopy(b.data(), a.data(), a.size());
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0);
  }
  EXPECT_GT(pool.shared_halves(), 0u) << "no stream ever took half of a copy";
}

TEST(StreamPool, SharedCopyFromManyThreadsAtOnce) {
  StreamPool pool(2, std::chrono::milliseconds(50));
  std::vector<std::thread> callers;
  std::atomic<int> failures{0};
  for (uint32_t t = 0; t < 4; ++t) {
    callers.emplace_back([&, t] {
      CheckSharedCopies(pool, 10 + t);
      if (::testing::Test::HasFailure()) failures.fetch_add(1);
    });
  }
  for (auto& c : callers) c.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(StreamPool, SharedCopyWithoutSpinningStreamsCopiesAlone) {
  StreamPool pool(2, std::chrono::microseconds(0));  // streams sleep at once: nobody helps
  CheckSharedCopies(pool, 2);
  EXPECT_EQ(pool.shared_halves(), 0u);
}

// SharedCopy times its copies for the share rule (tests/unit/share_rule_test.cc tests the rule
// itself): both ways of copying get measured while copies go on, and every copy lands whole.
TEST(StreamPool, SharedCopyMeasuresBothWaysOfCopying) {
  StreamPool pool(2, std::chrono::milliseconds(50));
  constexpr size_t kLen = StreamPool::kMinSharedCopy;
  std::vector<uint8_t> a(kLen), b(kLen);
  const auto until = Clock::now() + std::chrono::seconds(5);  // (a loaded machine: more copies)
  const ShareRule& rule = pool.share_rule();
  for (int i = 0; i < 20000 || (Clock::now() < until && (rule.AverageCost(kLen, ShareRule::kShare) == 0 ||
                                                         rule.AverageCost(kLen, ShareRule::kAlone) == 0));
       ++i) {
    a[static_cast<size_t>(i) % kLen] = static_cast<uint8_t>(i);
    pool.SharedCopy(b.data(), a.data(), kLen);
    ASSERT_EQ(std::memcmp(a.data(), b.data(), kLen), 0);
  }
  EXPECT_NE(rule.AverageCost(kLen, ShareRule::kAlone), 0u) << "copies alone were never timed";
  EXPECT_NE(rule.AverageCost(kLen, ShareRule::kShare), 0u) << "shared copies were never timed";
}

TEST(StreamPool, PickPrefersTheFirstIdleStream) {
  StreamPool pool(3, std::chrono::microseconds(0));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(pool.Pick(), 0) << "not round-robin while all are idle";
  std::atomic<bool> release{false}, started{false};
  pool.Submit(0, [&] {
    started = true;
    while (!release) std::this_thread::yield();
  });
  while (!started) std::this_thread::yield();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(pool.Pick(), 1) << "stream 0 is busy";
  release = true;
  Fence(pool);
}

}  // namespace
}  // namespace xfer
