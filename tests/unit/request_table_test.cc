// The request table: handles issued on many threads are unique, each one's end is reported
// once, and a thread may wait for a handle another thread issued.
#include "core/request_table.h"

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

}  // namespace
}  // namespace xfer
