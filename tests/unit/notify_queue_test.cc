#include "core/notify/notify_queue.h"

#include "core/notify/begun_requests.h"

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
  EXPECT_TRUE(q.Push(N("c", 3, "012345678")).ok());  // room again once taken (9: one sender's most)
}

// A request's end counts 8 bytes per landed index against the bytes bound.
TEST(NotifyQueue, LandedIndicesCountAgainstTheBytes) {
  NotifyQueue q(8, 24);
  Notification ended = N("a", 1, "1234");
  ended.outcome = NotifyOutcome::kFailed;
  ended.landed = {0, 1};  // 4 + 16 bytes
  EXPECT_TRUE(q.Push(ended).ok());
  EXPECT_EQ(q.Push(N("b", 2, "12345")).code(), StatusCode::kResourceExhausted);  // 25 > 24
  EXPECT_TRUE(q.Push(N("b", 2, "1234")).ok());
  std::vector<Notification> got;
  ASSERT_TRUE(q.TakeAll(&got));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].outcome, NotifyOutcome::kFailed);
  EXPECT_EQ(got[0].landed, (std::vector<uint64_t>{0, 1}));
  // Past the bounds (one whose beginning came in a ring), a landed list that would pass the
  // bytes bound is dropped, never the notification.
  ended.landed.assign(1000, 0);
  q.PushAccepted(ended);
  ended.landed = {7};
  q.PushAccepted(ended);  // (4 + 8 + 4 bytes queued: it fits)
  got.clear();
  ASSERT_TRUE(q.TakeAll(&got));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(got[0].landed.empty());
  EXPECT_EQ(got[1].landed, (std::vector<uint64_t>{7}));
}

// One sender fills at most seven eighths of each bound: another still gets in, and once the
// application took what was queued, the first sender's part is whole again. (Before, one
// sender's flood refused every other sender's notifications.)
TEST(NotifyQueue, OneSenderLeavesAnEighthForTheOthers) {
  NotifyQueue q(16, 1000);
  for (int i = 0; i < 14; ++i) ASSERT_TRUE(q.Push(N("flood", 1, "x")).ok()) << i;
  const Status refused = q.Push(N("flood", 1, "x"));
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("other senders"), std::string::npos) << refused.ToString();
  EXPECT_TRUE(q.Push(N("other", 2, "y")).ok());
  EXPECT_TRUE(q.Push(N("third", 3, "z")).ok());
  EXPECT_EQ(q.Push(N("third", 3, "z")).code(), StatusCode::kResourceExhausted);  // (16: full)
  std::vector<Notification> got;
  ASSERT_TRUE(q.TakeAll(&got));
  EXPECT_EQ(got.size(), 16u);
  for (int i = 0; i < 14; ++i) EXPECT_TRUE(q.Push(N("flood", 1, "x")).ok()) << i;
  NotifyQueue bytes(1000, 800);  // and by bytes: 700 of 800
  EXPECT_TRUE(bytes.Push(N("flood", 1, std::string(700, 'x'))).ok());
  EXPECT_EQ(bytes.Push(N("flood", 1, "x")).code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(bytes.Push(N("other", 2, std::string(100, 'y'))).ok());
}

// Requests begun toward the engine hold their place in the queue until they end, each
// session a quarter of it at most; every place comes back.
TEST(BegunRequests, ReserveUntilTheEndAndGiveEveryPlaceBack) {
  EngineOptions::Notify o;
  o.queue_messages = 8;
  o.queue_bytes = 1000;
  o.max_message_bytes = 100;
  NotifyQueue q(o.queue_messages, o.queue_bytes);
  BegunRequests begun(&q, o);
  const int s1 = 0, s2 = 0;  // (two sessions: their addresses)
  EXPECT_TRUE(begun.Begin(&s1, 1, "aaaa").ok());
  EXPECT_EQ(begun.Begin(&s1, 1, "x").code(), StatusCode::kInvalidArgument);  // a number begun already
  EXPECT_TRUE(begun.Begin(&s1, 2, "bb").ok());
  EXPECT_EQ(begun.Begin(&s1, 3, "c").code(), StatusCode::kResourceExhausted);  // its share: 8 / 4
  EXPECT_TRUE(begun.Begin(&s2, 1, "cc").ok());
  for (int k = 0; k < 5; ++k) EXPECT_TRUE(q.Push(N("p", 1, "n")).ok()) << k;  // 3 places held
  EXPECT_EQ(q.Push(N("p", 1, "n")).code(), StatusCode::kResourceExhausted);
  BegunRequests::Held m;
  EXPECT_EQ(begun.End(&s1, 9, &m).code(), StatusCode::kResourceExhausted);  // never begun
  ASSERT_TRUE(begun.End(&s1, 1, &m).ok());
  EXPECT_EQ(m.message, "aaaa");
  EXPECT_TRUE(m.reserved);
  EXPECT_EQ(begun.End(&s1, 1, &m).code(), StatusCode::kResourceExhausted);  // ended already
  Notification ended = N("s1", 1, m.message);
  ended.outcome = NotifyOutcome::kFailed;
  ended.landed.assign(1000, 0);  // 8000 bytes: past the bound, so dropped (the message fits)
  q.PushReserved(std::move(ended), m.message.size());
  for (BegunRequests::Key k : {static_cast<BegunRequests::Key>(&s1), static_cast<BegunRequests::Key>(&s2)}) {
    for (BegunRequests::Held& left : begun.Take(k))
      q.PushReserved(N("lost", 1, left.message), left.message.size());
  }
  EXPECT_TRUE(begun.Take(&s1).empty());
  std::vector<Notification> got;
  ASSERT_TRUE(q.TakeAll(&got));
  ASSERT_EQ(got.size(), 8u);
  EXPECT_EQ(got[5].outcome, NotifyOutcome::kFailed);
  EXPECT_TRUE(got[5].landed.empty()) << "a landed list past the bound is dropped, not the notification";
  EXPECT_EQ(got[6].message, "bb");
  EXPECT_EQ(got[7].message, "cc");
  for (int k = 0; k < 8; ++k) {  // (seven from one sender, its most: OneSenderLeavesAnEighthForTheOthers)
    EXPECT_TRUE(q.Push(N(k < 7 ? "p" : "q", k < 7 ? 1 : 2, "n")).ok()) << "place " << k << " not given back";
  }
  EXPECT_EQ(q.Push(N("q", 2, "n")).code(), StatusCode::kResourceExhausted);
}

// The lost come back in the order of their ids (a sender numbers its requests as they begin),
// whatever order their beginnings came in (a ring's and the session's); a peer's share counts
// bytes too; an end is answered with its beginning's refusal.
TEST(BegunRequests, OrderOfIdsByteShareAndRefusalsRemembered) {
  EngineOptions::Notify o;
  o.queue_messages = 400;
  o.queue_bytes = 4096;  // a peer's share: 1024 bytes
  o.max_message_bytes = 600;
  NotifyQueue q(o.queue_messages, o.queue_bytes);
  BegunRequests begun(&q, o);
  const int s1 = 0;
  EXPECT_TRUE(begun.Begin(&s1, 9, "nine").ok());
  EXPECT_TRUE(begun.Begin(&s1, 3, std::string(600, 't')).ok());
  EXPECT_EQ(begun.Begin(&s1, 5, std::string(500, 'f')).code(),
            StatusCode::kResourceExhausted);  // 1104 > 1024
  EXPECT_TRUE(begun.Begin(&s1, 7, "seven").ok());
  begun.Refuse(&s1, 11, {StatusCode::kInvalidArgument, "too long"});
  BegunRequests::Held m;
  EXPECT_EQ(begun.End(&s1, 5, &m).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(begun.End(&s1, 11, &m).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(begun.End(&s1, 11, &m).code(), StatusCode::kResourceExhausted);  // (answered once)
  const std::vector<BegunRequests::Held> lost = begun.Take(&s1);
  ASSERT_EQ(lost.size(), 3u);
  EXPECT_EQ(lost[0].message.size(), 600u);
  EXPECT_EQ(lost[1].message, "seven");
  EXPECT_EQ(lost[2].message, "nine");
  for (const BegunRequests::Held& l : lost) q.PushReserved(N("lost", 1, l.message), l.message.size());
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

// A beginning that came in a ring holds no place in the queue (a ring's records are past its
// bounds), but counts against its peer's share all the same, and says so at its end.
TEST(BegunRequests, ARingsBeginningsHoldNoPlaceButCountAgainstTheShare) {
  EngineOptions::Notify o;
  o.queue_messages = 8;  // a peer's share: 2
  o.queue_bytes = 1000;
  o.max_message_bytes = 100;
  NotifyQueue q(o.queue_messages, o.queue_bytes);
  BegunRequests begun(&q, o);
  const int s1 = 0;
  EXPECT_TRUE(begun.Begin(&s1, 1, "ring-1", false).ok());
  EXPECT_TRUE(begun.Begin(&s1, 2, "ring-2", false).ok());
  EXPECT_EQ(begun.Begin(&s1, 3, "ring-3", false).code(), StatusCode::kResourceExhausted);
  for (int k = 0; k < 7; ++k) EXPECT_TRUE(q.Push(N("p", 1, "n")).ok()) << "place " << k << " held";
  BegunRequests::Held m;
  ASSERT_TRUE(begun.End(&s1, 1, &m).ok());
  EXPECT_EQ(m.message, "ring-1");
  EXPECT_FALSE(m.reserved);
  const std::vector<BegunRequests::Held> lost = begun.Take(&s1);
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].message, "ring-2");
  EXPECT_FALSE(lost[0].reserved);
}

}  // namespace
}  // namespace xfer
