#include "util/worker_thread.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <vector>

namespace xfer {
namespace {

using namespace std::chrono_literals;

// Jobs queued behind a running one run lightest first, in order among equals.
TEST(WorkerThread, RunsTheLightestJobFirst) {
  WorkerThread w;
  std::promise<void> go;
  std::shared_future<void> started = go.get_future().share();
  std::promise<void> release;
  auto released = release.get_future().share();
  std::vector<int> order;  // (written by the worker only)
  w.Post([&] {
    go.set_value();
    released.wait();
  });
  started.wait();
  w.Post([&] { order.push_back(3); }, 300);
  w.Post([&] { order.push_back(1); }, 1);
  w.Post([&] { order.push_back(2); }, 1);
  w.Post([&] { order.push_back(0); }, 0);
  std::promise<void> done;
  w.Post([&] { done.set_value(); }, 1000);
  release.set_value();
  ASSERT_EQ(done.get_future().wait_for(10s), std::future_status::ready);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
}

// Stop lets the running job end and drops the queued ones, destroying what they captured; a
// job posted after Stop is dropped at once.
TEST(WorkerThread, StopDropsWhatIsQueued) {
  auto captured = std::make_shared<int>(7);
  std::atomic<int> ran{0};
  {
    WorkerThread w;
    std::promise<void> go;
    auto started = go.get_future();
    w.Post([&] {
      go.set_value();
      std::this_thread::sleep_for(50ms);
      ran.fetch_add(1);
    });
    started.wait();
    w.Post([&ran, captured] { ran.fetch_add(10); });
    EXPECT_EQ(captured.use_count(), 2);
    w.Stop();
    EXPECT_EQ(captured.use_count(), 1);
    w.Post([&ran, captured] { ran.fetch_add(100); });
    EXPECT_EQ(captured.use_count(), 1);
  }
  EXPECT_EQ(ran.load(), 1);
}

}  // namespace
}  // namespace xfer
