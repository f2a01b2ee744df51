// RemoteRegion::OpenOnce and CloseAll: what a backend opened of a peer's region (a mapping) is
// opened once, shared by every caller without a lock, and closed for good.
#include "transport/remote_region.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

namespace xfer::transport {
namespace {

const char kKey = 0, kOtherKey = 0;

TEST(RemoteRegion, OpensOnceForEveryThread) {
  RemoteRegion r;
  static uint8_t mapping[64];
  std::atomic<int> opened{0};
  auto open = [&](std::shared_ptr<void>* handle, uint8_t** base) {
    ++opened;
    *handle = std::make_shared<int>(1);
    *base = mapping;
    return Status::Ok();
  };
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) wrong += r.OpenOnce(&kKey, open) != mapping;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(opened.load(), 1);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(r.OpenOnce(&kOtherKey,
                       [](std::shared_ptr<void>*, uint8_t** base) {
                         *base = nullptr;
                         return Status::Ok();
                       }),
            nullptr);  // another key: its own entry
  EXPECT_EQ(r.OpenOnce(&kKey, open), mapping);
}

TEST(RemoteRegion, AFailureIsToldOnceAndNotRetried) {
  RemoteRegion r;
  int calls = 0;
  auto fail = [&](std::shared_ptr<void>*, uint8_t**) {
    ++calls;
    return Status{StatusCode::kRemoteAccessDenied, "not that segment"};
  };
  Status first, second;
  EXPECT_EQ(r.OpenOnce(&kKey, fail, &first), nullptr);
  EXPECT_EQ(first.code(), StatusCode::kRemoteAccessDenied);
  EXPECT_EQ(r.OpenOnce(&kKey, fail, &second), nullptr);
  EXPECT_TRUE(second.ok()) << "the failure was reported again: " << second.ToString();
  EXPECT_EQ(calls, 1);
}

TEST(RemoteRegion, CloseAllReleasesAndNothingOpensAfter) {
  RemoteRegion r;
  static uint8_t mapping[64];
  std::weak_ptr<int> held;
  int calls = 0;
  auto open = [&](std::shared_ptr<void>* handle, uint8_t** base) {
    ++calls;
    auto h = std::make_shared<int>(1);
    held = h;
    *handle = h;
    *base = mapping;
    return Status::Ok();
  };
  ASSERT_EQ(r.OpenOnce(&kKey, open), mapping);
  r.CloseAll();
  EXPECT_TRUE(held.expired()) << "the mapping outlived CloseAll";
  EXPECT_EQ(r.OpenOnce(&kKey, open), nullptr);
  EXPECT_EQ(r.OpenOnce(&kOtherKey, open), nullptr);
  EXPECT_EQ(calls, 1);
}

TEST(RemoteRegion, ARevokedRegionIsNotOpened) {
  RemoteRegion r;
  r.revoked = true;
  int calls = 0;
  EXPECT_EQ(r.OpenOnce(&kKey,
                       [&](std::shared_ptr<void>*, uint8_t**) {
                         ++calls;
                         return Status::Ok();
                       }),
            nullptr);
  EXPECT_EQ(calls, 0);
}

}  // namespace
}  // namespace xfer::transport
