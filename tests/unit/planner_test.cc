#include "core/planner.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "core/registry.h"

namespace xfer {
namespace {

wire::WireRegion HostRegion(uint64_t addr, uint64_t len, const std::string& tag) {
  wire::WireRegion r;
  r.info = RegionInfo{addr, len, MemType::kHost, -1, tag, false};
  return r;
}

class PlannerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    local_.resize(1 << 20);
    remote_.Reset({{1, RegionInfo{kRemote, 1 << 20, MemType::kHost, -1, "", false}, -1, 0, "", ""},
                   {2, RegionInfo{kRemote + (1 << 20), 1 << 20, MemType::kHost, -1, "", false}, -1, 0, "", ""}});
  }
  uint64_t L(uint64_t off) { return reinterpret_cast<uint64_t>(local_.data()) + off; }
  Status Make(Op op, const std::vector<TransferDesc>& d, Plan* p, PlanLimits lim = {}) {
    LocalMemoryCheck check(registry_);
    PeerPaths paths;
    paths.link_limits = lim;
    return MakePlan(op, d, remote_, check, paths, p);
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
  ASSERT_TRUE(registry_.Add(HostRegion(L(0), 4096, ""), false, &h, &added).ok());
  EXPECT_TRUE(Make(Op::kRead, {{L(0), kRemote, 4096}}, &p).ok());
}

// Routing: which path each descriptor takes, by the memory on both sides.
class PlannerRouteTest : public PlannerTest {
 protected:
  void SetUp() override {
    PlannerTest::SetUp();
    wire::WireRegion gpu;
    gpu.id = 3;
    gpu.info = RegionInfo{kGpu, 1 << 20, MemType::kCuda, 0, "", false};
    remote_.Add(gpu);
    // Our own "GPU memory": the planner only reads the registered type.
    device_.resize(1 << 20);
    wire::WireRegion mine;
    mine.info = RegionInfo{D(0), 1 << 20, MemType::kCuda, 0, "", false};
    MemHandle h;
    bool added;
    ASSERT_TRUE(registry_.Add(mine, false, &h, &added).ok());
    paths_.link_limits = {64 << 10, 256 << 10, 1024};
    paths_.staging_bytes = 128 << 10;
    paths_.cuda_limits = {1 << 20, 4 << 20, 1024};
  }
  uint64_t D(uint64_t off) { return reinterpret_cast<uint64_t>(device_.data()) + off; }
  Status Route(Op op, const std::vector<TransferDesc>& d, Plan* p) {
    LocalMemoryCheck check(registry_);
    return MakePlan(op, d, remote_, check, paths_, p);
  }
  static constexpr uint64_t kGpu = 0x6000'0000'0000ull;
  std::vector<char> device_;
  PeerPaths paths_;
};

TEST_F(PlannerRouteTest, HostPairsTakeTheLink) {
  Plan p;
  ASSERT_TRUE(Route(Op::kWrite, {{L(0), kRemote, 4096}}, &p).ok());
  ASSERT_EQ(p.batches.size(), 1u);
  EXPECT_EQ(p.batches[0].path, Path::kLink);
}

TEST_F(PlannerRouteTest, LocalGpuMemoryIsStagedInBufferSizedBatches) {
  paths_.staging = true;
  Plan p;
  ASSERT_TRUE(Route(Op::kWrite, {{D(0), kRemote, 1 << 20}}, &p).ok());
  ASSERT_EQ(p.batches.size(), 8u);  // 1 MiB in batches of one 128 KiB buffer
  for (const auto& b : p.batches) {
    EXPECT_EQ(b.path, Path::kStaged);
    EXPECT_TRUE(b.device);
    EXPECT_LE(b.bytes, 128u << 10);
  }
  paths_.staging = false;
  Status s = Route(Op::kWrite, {{D(0), kRemote, 4096}}, &p);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("staging"), std::string::npos) << s.message();
}

TEST_F(PlannerRouteTest, RemoteGpuMemoryNeedsCudaOrALinkThatReachesIt) {
  Plan p;
  Status s = Route(Op::kWrite, {{L(0), kGpu, 4096}}, &p);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("GPU memory"), std::string::npos) << s.message();
  paths_.link_reaches_device = true;  // tcp: the target stages it
  ASSERT_TRUE(Route(Op::kWrite, {{L(0), kGpu, 4096}}, &p).ok());
  EXPECT_EQ(p.batches[0].path, Path::kLink);
}

TEST_F(PlannerRouteTest, RemoteGpuMemoryTakesTheGpuLinkBesideALinkThatCannotReachIt) {
  paths_.gpu_link = true;  // tcp beside ucx or cma
  paths_.gpu_link_limits = {512 << 10, 512 << 10, 1024};
  paths_.staging = true;
  Plan p;
  // Host memory to the peer's host memory keeps the link; to its GPU memory takes the gpu
  // link, staged when our side is GPU memory too.
  ASSERT_TRUE(Route(Op::kWrite, {{L(0), kRemote, 4096}, {L(8192), kGpu, 1 << 20}, {D(0), kGpu + (1 << 19), 4096}}, &p).ok());
  ASSERT_EQ(p.batches.size(), 4u);
  EXPECT_FALSE(p.batches[0].gpu_link);
  EXPECT_EQ(p.batches[0].path, Path::kLink);
  for (int i : {1, 2}) {
    EXPECT_TRUE(p.batches[i].gpu_link) << i;
    EXPECT_EQ(p.batches[i].path, Path::kLink) << i;
    EXPECT_EQ(p.batches[i].bytes, 512u << 10) << i;  // cut by the gpu link's own limits
  }
  EXPECT_TRUE(p.batches[3].gpu_link);
  EXPECT_EQ(p.batches[3].path, Path::kStaged);
}

TEST_F(PlannerRouteTest, CudaTakesGpuPairsAtTheOpenedAddress) {
  static uint8_t opened[1 << 20];
  paths_.cuda_base = [](RemoteRegion& r) {
    return r.info.type == MemType::kCuda ? opened : nullptr;
  };
  paths_.staging = true;
  Plan p;
  // H2D and D2D go to the opened region; D2H to unmapped host memory is staged.
  ASSERT_TRUE(Route(Op::kWrite, {{L(0), kGpu + 100, 4096}, {D(0), kGpu + 8192, 4096}, {D(8192), kRemote, 4096}}, &p).ok());
  ASSERT_EQ(p.batches.size(), 2u);
  EXPECT_EQ(p.batches[0].path, Path::kCuda);
  EXPECT_EQ(p.slices[0].remote, reinterpret_cast<uint64_t>(opened) + 100);
  EXPECT_EQ(p.slices[1].remote, reinterpret_cast<uint64_t>(opened) + 8192);
  EXPECT_EQ(p.batches[1].path, Path::kStaged);
  EXPECT_EQ(p.slices[2].remote, kRemote);
}

TEST_F(PlannerRouteTest, BatchesInFlightIsTheLeastOfThePathsTaken) {
  paths_.link_limits.batches_in_flight = 2;  // as tcp with one link
  static uint8_t opened[1 << 20];
  paths_.cuda_base = [](RemoteRegion& r) {
    return r.info.type == MemType::kCuda ? opened : nullptr;
  };
  Plan p;
  ASSERT_TRUE(Route(Op::kWrite, {{D(0), kGpu, 1 << 20}}, &p).ok());  // cuda only: no limit
  EXPECT_EQ(p.batches_in_flight, SIZE_MAX);
  ASSERT_TRUE(Route(Op::kWrite, {{L(0), kRemote, 1 << 20}}, &p).ok());  // over the link
  EXPECT_EQ(p.batches.size(), 4u);
  EXPECT_EQ(p.batches_in_flight, 2u);
  ASSERT_TRUE(Route(Op::kWrite, {{D(0), kGpu, 4096}, {L(0), kRemote, 4096}}, &p).ok());  // both
  EXPECT_EQ(p.batches_in_flight, 2u);
}

TEST_F(PlannerRouteTest, StageAllStagesHostMemoryToo) {
  paths_.staging = true;
  paths_.stage_all = true;
  Plan p;
  ASSERT_TRUE(Route(Op::kRead, {{L(0), kRemote, 4096}}, &p).ok());
  EXPECT_EQ(p.batches[0].path, Path::kStaged);
  EXPECT_FALSE(p.batches[0].device);
}

TEST_F(PlannerRouteTest, ForcedTransportWithoutARouteIsRefused) {
  paths_.link = false;
  Plan p;
  Status s = Route(Op::kWrite, {{L(0), kRemote, 4096}}, &p);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("descriptor 0"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace xfer
