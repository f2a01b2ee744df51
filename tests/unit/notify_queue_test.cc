#include "core/notify/notify_queue.h"

#include <gtest/gtest.h>

#include <thread>

namespace xfer {
namespace {

using namespace std::chrono_literals;

Notification N(std::string sender, uint64_t incarnation, std::string message) {
  Notification n;
  n.sender = std::move(sender);
  n.sender_incarnation = incarnation;
  n.message = std::move(message);
  return n;
}

TEST(NotifyQueue, RefusesPastEitherBoundAndTakesInOrder) {
  NotifyQueue q(3, 10);
  EXPECT_TRUE(q.Push(N("a", 1, "1234")).ok());
  EXPECT_TRUE(q.Push(N("a", 1, "5678")).ok());
  EXPECT_EQ(q.Push(N("b", 2, "abc")).code(), StatusCode::kResourceExhausted);  // 11 bytes > 10
  EXPECT_TRUE(q.Push(N("b", 2, "ab")).ok());
  EXPECT_EQ(q.Push(N("b", 2, "")).code(), StatusCode::kResourceExhausted);  // 4 messages > 3
  std::vector<Notification> got;
  ASSERT_TRUE(q.TakeAll(&got));
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].message, "1234");
  EXPECT_EQ(got[2].sender, "b");
  EXPECT_FALSE(q.TakeAll(&got));
  EXPECT_TRUE(q.Push(N("c", 3, "0123456789")).ok());  // room again once taken
}

// A request's end counts 8 bytes per landed index against the bytes bound.
TEST(NotifyQueue, LandedIndicesCountAgainstTheBytes) {
  NotifyQueue q(8, 24);
  Notification ended = N("a", 1, "1234");
  ended.outcome = NotifyOutcome::kFailed;
  ended.landed = {0, 1};  // 4 + 16 bytes
  EXPECT_TRUE(q.Push(ended).ok());
  EXPECT_EQ(q.Push(N("a", 1, "12345")).code(), StatusCode::kResourceExhausted);  // 25 > 24
  EXPECT_TRUE(q.Push(N("a", 1, "1234")).ok());
  std::vector<Notification> got;
  ASSERT_TRUE(q.TakeAll(&got));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].outcome, NotifyOutcome::kFailed);
  EXPECT_EQ(got[0].landed, (std::vector<uint64_t>{0, 1}));
}

TEST(NotifyQueue, WaitReturnsOnArrivalOrTimeoutOrClose) {
  NotifyQueue q(8, 1 << 20);
  std::vector<Notification> got;
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(q.WaitTakeAll(&got, t0 + 30ms));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 30ms);
  std::thread pusher([&] {
    std::this_thread::sleep_for(20ms);
    (void)q.Push(N("p", 1, "late"));
  });
  EXPECT_TRUE(q.WaitTakeAll(&got, std::chrono::steady_clock::now() + 10s));
  pusher.join();
  ASSERT_EQ(got.size(), 1u);
  std::thread closer([&] {
    std::this_thread::sleep_for(20ms);
    q.Close();
  });
  t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(q.WaitTakeAll(&got, t0 + 10s));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  closer.join();
}

}  // namespace
}  // namespace xfer
