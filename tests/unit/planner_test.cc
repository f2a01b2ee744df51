#include "core/planner.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "core/registry.h"

namespace xfer {
namespace {

class PlannerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    local_.resize(1 << 20);
    remote_.Reset({{1, RegionInfo{kRemote, 1 << 20, MemType::kHost, -1, "", false}, -1, 0, ""},
                   {2, RegionInfo{kRemote + (1 << 20), 1 << 20, MemType::kHost, -1, "", false}, -1, 0, ""}});
  }
  uint64_t L(uint64_t off) { return reinterpret_cast<uint64_t>(local_.data()) + off; }
  Status Make(Op op, const std::vector<TransferDesc>& d, Plan* p, PlanLimits lim = {}) {
    LocalMemoryCheck check(registry_);
    return MakePlan(op, d, remote_, check, lim, nullptr, p);
  }
  static constexpr uint64_t kRemote = 0x7000'0000'0000ull;
  std::vector<char> local_;
  Registry registry_;
  RemoteRegions remote_;
};

TEST_F(PlannerTest, CoalescesAdjacentDescriptors) {
  std::vector<TransferDesc> d;
  for (uint64_t i = 0; i < 100; ++i) d.push_back({L(i * 64), kRemote + i * 64, 64});
  Plan p;
  ASSERT_TRUE(Make(Op::kWrite, d, &p).ok());
  ASSERT_EQ(p.slices.size(), 1u);
  EXPECT_EQ(p.slices[0].len, 6400u);
  EXPECT_EQ(p.bytes, 6400u);
  EXPECT_EQ(p.batches.size(), 1u);
}

TEST_F(PlannerTest, DoesNotCoalesceAcrossRegions) {
  // Adjacent on both sides, but the remote side crosses from region 1 into region 2.
  std::vector<TransferDesc> d = {{L(0), kRemote + (1 << 20) - 64, 64}, {L(64), kRemote + (1 << 20), 64}};
  Plan p;
  ASSERT_TRUE(Make(Op::kWrite, d, &p).ok());
  EXPECT_EQ(p.slices.size(), 2u);
  EXPECT_EQ(p.regions.size(), 2u);
}

TEST_F(PlannerTest, SlicesAndBatchesRespectLimits) {
  std::vector<TransferDesc> d = {{L(0), kRemote, 1 << 20}};
  Plan p;
  ASSERT_TRUE(Make(Op::kRead, d, &p, PlanLimits{64 << 10, 256 << 10, 1024}).ok());
  EXPECT_EQ(p.slices.size(), 16u);
  EXPECT_EQ(p.batches.size(), 4u);
  // Many scattered small descriptors: at most max_slices_per_batch per batch.
  std::vector<TransferDesc> s;
  for (uint64_t i = 0; i < 3000; ++i) s.push_back({L(i * 128), kRemote + i * 256, 64});
  ASSERT_TRUE(Make(Op::kWrite, s, &p, PlanLimits{1 << 20, 4 << 20, 1024}).ok());
  EXPECT_EQ(p.slices.size(), 3000u);
  ASSERT_EQ(p.batches.size(), 3u);
  EXPECT_EQ(p.batches[0].end - p.batches[0].begin, 1024u);
  uint64_t total = 0;
  for (auto& sl : p.slices) total += sl.len;
  EXPECT_EQ(total, 3000u * 64);
}

TEST_F(PlannerTest, RejectsBadDescriptorsWithReasons) {
  Plan p;
  EXPECT_EQ(Make(Op::kWrite, {}, &p).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Make(Op::kWrite, {{L(0), kRemote, 0}}, &p).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Make(Op::kWrite, {{0, kRemote, 8}}, &p).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Make(Op::kWrite, {{L(0), 0, 8}}, &p).code(), StatusCode::kInvalidArgument);
  Status s = Make(Op::kWrite, {{L(0), kRemote + (1 << 20) - 4, 8}}, &p);  // straddles 1 and 2
  EXPECT_EQ(s.code(), StatusCode::kRemoteAccessDenied);
  EXPECT_NE(s.message().find("descriptor 0"), std::string::npos);
  EXPECT_EQ(Make(Op::kWrite, {{L(0), kRemote + (2 << 20), 1}}, &p).code(),
            StatusCode::kRemoteAccessDenied);
  EXPECT_EQ(Make(Op::kWrite, {{L(0), ~0ull - 2, 8}}, &p).code(), StatusCode::kInvalidArgument);
}

TEST_F(PlannerTest, ChecksLocalMemory) {
  Plan p;
  // A READ lands in local memory: read-only memory (a string literal) is refused.
  static const char kConst[64] = "read-only";
  uint64_t ro = reinterpret_cast<uint64_t>(kConst);
  EXPECT_EQ(Make(Op::kRead, {{ro, kRemote, 8}}, &p).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Make(Op::kWrite, {{ro, kRemote, 8}}, &p).ok());
  // Unmapped memory is refused either way.
  EXPECT_EQ(Make(Op::kWrite, {{0x10, kRemote, 8}}, &p).code(), StatusCode::kInvalidArgument);
  // Registered memory is trusted without a look at the mappings.
  MemHandle h;
  bool added;
  ASSERT_TRUE(registry_.Add(L(0), 4096, MemType::kHost, -1, "", &h, &added).ok());
  EXPECT_TRUE(Make(Op::kRead, {{L(0), kRemote, 4096}}, &p).ok());
}

}  // namespace
}  // namespace xfer
