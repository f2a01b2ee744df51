// The request table: handles issued on many threads are unique, each one's end is reported
// once, and a thread may wait for a handle another thread issued.
#include "core/datapath/request_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <thread>
#include <vector>

namespace xfer {
namespace {

TEST(RequestTable, HandlesFromManyThreadsAreUniqueAndReportedOnce) {
  constexpr int kThreads = 20, kEach = 2000;  // (more threads than shards)
  RequestTable table;
  std::vector<std::vector<RequestHandle>> issued(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) issued[t].push_back(table.TrackCompleted());
    });
  }
  for (auto& th : threads) th.join();
  std::vector<RequestHandle> all;
  for (const auto& v : issued) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end()) << "a handle was issued twice";
  EXPECT_EQ(std::count(all.begin(), all.end(), RequestHandle{0}), 0);
  // Each thread reports the handles of the next one: found once (and, left alone by Cancel's
  // lookup, taken by the first report), unknown after.
  threads.clear();
  std::atomic<int> wrong{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (RequestHandle h : issued[(t + 1) % kThreads]) {
        std::shared_ptr<Request> req;
        if (!table.Find(h, false, &req) || req) ++wrong;
        if (!table.Find(h, true, &req) || req) ++wrong;
        if (table.Find(h, true, &req)) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
}

// A thread that keeps `depth` requests in flight (as xfer-bench --depth does), its handles
// raced for by a second thread: each is reported exactly once, whoever takes it. (More than
// the ring's 256 places in flight: the rest wait in the sorted list, raced for the same way.)
void RaceForHandles(RequestTable& table, int depth, int rounds) {
  std::vector<std::atomic<RequestHandle>> offered(static_cast<size_t>(depth));
  std::atomic<bool> done{false};
  std::atomic<int> taken_by_other{0};
  std::thread other([&] {
    std::shared_ptr<Request> req;
    while (!done.load()) {
      for (auto& o : offered) {
        const RequestHandle h = o.load();
        if (h != 0 && table.Find(h, true, &req)) ++taken_by_other;
      }
    }
  });
  int taken_here = 0, unknown = 0;
  std::vector<RequestHandle> ring(static_cast<size_t>(depth), 0);
  for (int i = 0; i < rounds; ++i) {
    const size_t k = static_cast<size_t>(i % depth);
    std::shared_ptr<Request> req;
    if (ring[k] != 0) (table.Find(ring[k], true, &req) ? taken_here : unknown)++;
    ring[k] = table.TrackCompleted();
    offered[k].store(ring[k]);
  }
  for (RequestHandle h : ring) {
    std::shared_ptr<Request> req;
    (table.Find(h, true, &req) ? taken_here : unknown)++;
  }
  done = true;
  other.join();
  EXPECT_EQ(taken_here + taken_by_other.load(), rounds) << "a handle was reported twice or never";
  EXPECT_EQ(unknown, taken_by_other.load());
  std::shared_ptr<Request> req;
  for (RequestHandle h : ring) EXPECT_FALSE(table.Find(h, false, &req)) << "a handle taken came back";
}

TEST(RequestTable, HandlesNeverIssuedAreUnknown) {
  RequestTable table;
  std::shared_ptr<Request> req;
  // (0 marks a free place in the ring: it must not read as a handle found there.)
  for (RequestHandle h : {RequestHandle{0}, RequestHandle{16}, RequestHandle{123456789}}) {
    EXPECT_FALSE(table.Find(h, false, &req)) << h;
    EXPECT_FALSE(table.Find(h, true, &req)) << h;
  }
}

TEST(RequestTable, AHandleRacedForIsTakenOnce) {
  RequestTable table;
  RaceForHandles(table, 8, 20000);
  RaceForHandles(table, 600, 20000);  // (past the ring)
  std::shared_ptr<Request> req;
  const RequestHandle left = table.TrackCompleted();
  table.Clear();
  EXPECT_FALSE(table.Find(left, false, &req)) << "Clear left a handle in the ring";
}

}  // namespace
}  // namespace xfer
