#include "core/datapath/planner.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "core/regions/registry.h"
#include "transport/common/host_copy.h"

namespace xfer {
namespace {

wire::WireRegion HostRegion(uint64_t addr, uint64_t len, const std::string& tag) {
  wire::WireRegion r;
  r.info = RegionInfo{addr, len, MemType::kHost, -1, tag, false};
  return r;
}

// A route that reaches the pairs `reaches` accepts, mapping remote regions to `base` (null: a
// link over a wire, which staging may use).
class TestRoute final : public transport::Route {
 public:
  using Reaches = std::function<bool(MemType local, const RemoteRegion& r)>;
  TestRoute(std::string_view name, PlanLimits limits, Reaches reaches, uint8_t* base = nullptr)
      : Route(name, nullptr, limits), reaches_(std::move(reaches)), base_(base) {}
  bool Reach(MemType local, RemoteRegion& r, uint8_t** mapped) override {
    if (!reaches_(local, r)) return false;
    *mapped = base_;
    return true;
  }
  std::string WhyNot(MemType, const RemoteRegion&) const override {
    return std::string(backend()) + ": not this pair";
  }
  bool Stageable() const override { return base_ == nullptr; }

 private:
  const Reaches reaches_;
  uint8_t* const base_;
};

bool HostPairs(MemType local, const RemoteRegion& r) {
  return local == MemType::kHost && r.info.type == MemType::kHost;
}

class PlannerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    local_.resize(1 << 20);
    remote_.Reset({{1, RegionInfo{kRemote, 1 << 20, MemType::kHost, -1, "", false}, {}},
                   {2, RegionInfo{kRemote + (1 << 20), 1 << 20, MemType::kHost, -1, "", false}, {}}});
  }
  uint64_t L(uint64_t off) { return reinterpret_cast<uint64_t>(local_.data()) + off; }
  Status Make(Op op, const std::vector<TransferDesc>& d, Plan* p, PlanLimits lim = {}) {
    LocalMemoryCheck check(registry_);
    PeerRoutes routes;
    routes.routes.push_back(std::make_shared<TestRoute>("link", lim, HostPairs));
    return MakePlan(op, d, remote_, check, routes, p);
  }
  static constexpr uint64_t kRemote = 0x7000'0000'0000ull;
  std::vector<char> local_;
  Registry registry_;
  RemoteRegions remote_;
};

// Prepared pairs plan as their descriptors would: the same slices; only what a request may get
// wrong is checked (indices, lengths, a READ into memory that is not writable).
TEST_F(PlannerTest, PreparedPairsPlanAsTheirDescriptors) {
  std::vector<LocalEntry> local;
  std::vector<RemoteEntry> remote;
  for (uint64_t i = 0; i < 8; ++i) {
    local.push_back({L(i * 64), 64, MemType::kHost, true, true});
    remote.push_back({kRemote + (1 << 20) - 4 * 64 + i * 64, 64, i < 4 ? 0u : 1u});  // across two regions
  }
  std::vector<std::shared_ptr<RemoteRegion>> regions = {remote_.Find(kRemote, 1),
                                                        remote_.Find(kRemote + (1 << 20), 1)};
  std::vector<uint32_t> li = {0, 1, 2, 3, 4, 5}, ri = {0, 1, 2, 3, 4, 5};
  PeerRoutes routes;
  routes.routes.push_back(std::make_shared<TestRoute>("link", PlanLimits{}, HostPairs));
  Plan p, q;
  ASSERT_TRUE(MakePreparedPlan(Op::kWrite, {local, li, remote, regions, ri, &remote_}, routes, &p).ok());
  std::vector<TransferDesc> d;
  for (size_t k = 0; k < li.size(); ++k) d.push_back({local[li[k]].addr, remote[ri[k]].addr, 64});
  ASSERT_TRUE(Make(Op::kWrite, d, &q).ok());
  ASSERT_EQ(p.slices.size(), 2u);  // coalesced within each region
  ASSERT_EQ(p.slices.size(), q.slices.size());
  for (size_t k = 0; k < p.slices.size(); ++k) {
    EXPECT_EQ(p.slices[k].local, q.slices[k].local);
    EXPECT_EQ(p.slices[k].remote, q.slices[k].remote);
    EXPECT_EQ(p.slices[k].len, q.slices[k].len);
  }
  EXPECT_EQ(p.regions.size(), 2u);
  EXPECT_EQ(p.bytes, q.bytes);
  EXPECT_EQ(p.desc_ends, q.desc_ends);
  std::vector<uint32_t> bad = {0, 8};
  EXPECT_EQ(MakePreparedPlan(Op::kWrite,
                             {local, std::span<const uint32_t>(li).first(2), remote, regions, bad, &remote_},
                             routes, &p)
                .code(),
            StatusCode::kInvalidArgument);
  local[1].writable = false;
  EXPECT_EQ(MakePreparedPlan(Op::kRead, {local, li, remote, regions, ri, &remote_}, routes, &p).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(MakePreparedPlan(Op::kWrite, {local, li, remote, regions, ri, &remote_}, routes, &p).ok());
  remote[2].len = 32;
  EXPECT_EQ(MakePreparedPlan(Op::kWrite, {local, li, remote, regions, ri, &remote_}, routes, &p).code(),
            StatusCode::kInvalidArgument);
}

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

// Which descriptors landed when some batches did not move: a descriptor cut into slices of
// several batches counts only when all of them moved; coalesced neighbours are told apart.
TEST_F(PlannerTest, LandedDescriptorsAreThoseWhoseBatchesAllMoved) {
  // d0: 96 KiB, d1 and d2: 16 KiB each and adjacent to d0 (one run), d3 elsewhere: 48 KiB.
  std::vector<TransferDesc> d = {{L(0), kRemote, 96 << 10},
                                 {L(96 << 10), kRemote + (96 << 10), 16 << 10},
                                 {L(112 << 10), kRemote + (112 << 10), 16 << 10},
                                 {L(512 << 10), kRemote + (512 << 10), 48 << 10}};
  Plan p;
  ASSERT_TRUE(Make(Op::kWrite, d, &p, PlanLimits{32 << 10, 32 << 10, 1024}).ok());
  ASSERT_EQ(p.batches.size(), 6u);  // 32 KiB each: d0 = 0..2, d1+d2 = 3, d3 = 4 (32) and 5 (16)
  EXPECT_EQ(LandedDescriptors(p, {}), (std::vector<uint64_t>{0, 1, 2, 3}));
  EXPECT_EQ(LandedDescriptors(p, {1}), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(LandedDescriptors(p, {3}), (std::vector<uint64_t>{0, 3}));
  EXPECT_EQ(LandedDescriptors(p, {5, 0}), (std::vector<uint64_t>{1, 2}));
  EXPECT_TRUE(LandedDescriptors(p, {0, 3, 4}).empty());
  // One descriptor: all or nothing.
  ASSERT_TRUE(Make(Op::kRead, {{L(0), kRemote, 96 << 10}}, &p, PlanLimits{32 << 10, 32 << 10, 1024}).ok());
  EXPECT_EQ(LandedDescriptors(p, {}), (std::vector<uint64_t>{0}));
  EXPECT_TRUE(LandedDescriptors(p, {2}).empty());
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
  EXPECT_EQ(Make(Op::kWrite, {{L(0), kRemote + (2 << 20), 1}}, &p).code(), StatusCode::kRemoteAccessDenied);
  EXPECT_EQ(Make(Op::kWrite, {{L(0), ~0ull - 2, 8}}, &p).code(), StatusCode::kInvalidArgument);
}

TEST_F(PlannerTest, WritesIntoReadOnlyRegionsAreRefusedReadsPlanned) {
  remote_.Reset(
      {{1, RegionInfo{kRemote, 1 << 20, MemType::kHost, -1, "weights", false, PeerAccess::kReadOnly}, {}},
       {2, RegionInfo{kRemote + (1 << 20), 1 << 20, MemType::kHost, -1, "", false}, {}}});
  Plan p;
  // The read-only descriptor comes second: the whole request is refused, naming it.
  const Status s = Make(Op::kWrite, {{L(0), kRemote + (1 << 20), 8}, {L(0), kRemote + 8, 8}}, &p);
  EXPECT_EQ(s.code(), StatusCode::kRemoteAccessDenied);
  EXPECT_NE(s.message().find("descriptor 1"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("'weights'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("read-only"), std::string::npos) << s.message();
  Plan r;
  EXPECT_TRUE(Make(Op::kRead, {{L(0), kRemote + 8, 8}, {L(8), kRemote + (1 << 20), 8}}, &r).ok());
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

// Routing: which route each descriptor takes, by the memory on both sides.
class PlannerRouteTest : public PlannerTest {
 protected:
  void SetUp() override {
    PlannerTest::SetUp();
    wire::WireRegion gpu;
    gpu.id = 3;
    gpu.info = RegionInfo{kGpu, 1 << 20, MemType::kCuda, 0, "", false};
    std::string why;
    ASSERT_TRUE(remote_.Add(gpu, &why)) << why;
    // Our own "GPU memory": the planner only reads the registered type.
    device_.resize(1 << 20);
    wire::WireRegion mine;
    mine.info = RegionInfo{D(0), 1 << 20, MemType::kCuda, 0, "", false};
    MemHandle h;
    bool added;
    ASSERT_TRUE(registry_.Add(mine, false, &h, &added).ok());
    routes_.staging_bytes = 128 << 10;
  }
  uint64_t D(uint64_t off) { return reinterpret_cast<uint64_t>(device_.data()) + off; }
  Status Route(Op op, const std::vector<TransferDesc>& d, Plan* p) {
    LocalMemoryCheck check(registry_);
    return MakePlan(op, d, remote_, check, routes_, p);
  }
  // A link like cma or ucx: host memory on both sides.
  void AddHostLink(PlanLimits lim = {64 << 10, 256 << 10, 1024}) {
    routes_.routes.push_back(std::make_shared<TestRoute>("host-link", lim, HostPairs));
  }
  // A link like tcp: from our host memory to any of the peer's memory (the target stages it).
  void AddStagingTargetLink(PlanLimits lim = {512 << 10, 512 << 10, 1024}) {
    routes_.routes.push_back(std::make_shared<TestRoute>(
        "any-link", lim, [](MemType local, const RemoteRegion&) { return local == MemType::kHost; }));
  }
  // Like cuda: GPU memory on either side, at the opened address.
  void AddCopyEngines(uint8_t* opened) {
    routes_.routes.push_back(std::make_shared<TestRoute>(
        "copy-engines", PlanLimits{1 << 20, 4 << 20, 1024},
        [](MemType local, const RemoteRegion& r) {
          return r.info.type == MemType::kCuda;  // (and our GPU memory to it)
        },
        opened));
  }
  static constexpr uint64_t kGpu = 0x6000'0000'0000ull;
  std::vector<char> device_;
  PeerRoutes routes_;
};

TEST(LocalMemoryCheck, EachRangeGetsTheAnswerOfItsOwnRegion) {
  // The check remembers the region it found last; a range outside it is asked about afresh.
  std::vector<char> host(8192), device(8192);
  const auto h0 = reinterpret_cast<uint64_t>(host.data()), d0 = reinterpret_cast<uint64_t>(device.data());
  Registry registry;
  MemHandle h;
  bool added;
  ASSERT_TRUE(registry.Add(HostRegion(h0, 4096, ""), false, &h, &added).ok());
  wire::WireRegion gpu;
  gpu.info = RegionInfo{d0, 4096, MemType::kCuda, 0, "", false};
  ASSERT_TRUE(registry.Add(gpu, false, &h, &added).ok());
  LocalMemoryCheck check(registry);
  MemType t = MemType::kCuda;
  EXPECT_TRUE(check.Allows(h0 + 64, 64, true, &t));
  EXPECT_EQ(t, MemType::kHost);
  EXPECT_TRUE(check.Allows(d0 + 64, 64, true, &t));
  EXPECT_EQ(t, MemType::kCuda);
  EXPECT_TRUE(check.Allows(d0 + 128, 64, true, &t));
  EXPECT_EQ(t, MemType::kCuda);
  // Past the registered GPU region's end: unregistered host memory (checked against the maps).
  EXPECT_TRUE(check.Allows(d0 + 4096 - 8, 64, true, &t));
  EXPECT_EQ(t, MemType::kHost);
  EXPECT_TRUE(check.Allows(d0 + 4096, 64, true, &t));
  EXPECT_EQ(t, MemType::kHost);
  EXPECT_TRUE(check.Allows(h0, 4096, true, &t));
  EXPECT_EQ(t, MemType::kHost);
  // A range that wraps past the end of the address space is never inside the last region.
  EXPECT_FALSE(check.Allows(h0 + 8, UINT64_MAX - 4, false, &t));
  EXPECT_FALSE(check.Allows(0x10, 8, false, &t));
}

TEST_F(PlannerRouteTest, HostPairsTakeTheFirstRouteThatReachesThem) {
  AddHostLink();
  AddStagingTargetLink();
  Plan p;
  ASSERT_TRUE(Route(Op::kWrite, {{L(0), kRemote, 4096}}, &p).ok());
  ASSERT_EQ(p.batches.size(), 1u);
  EXPECT_EQ(p.batches[0].route, 0u);
  EXPECT_FALSE(p.batches[0].staged);
}

TEST_F(PlannerRouteTest, LocalGpuMemoryIsStagedInBufferSizedBatches) {
  AddHostLink();
  routes_.staging = true;
  Plan p;
  ASSERT_TRUE(Route(Op::kWrite, {{D(0), kRemote, 1 << 20}}, &p).ok());
  ASSERT_EQ(p.batches.size(), 8u);  // 1 MiB in batches of one 128 KiB buffer
  for (const auto& b : p.batches) {
    EXPECT_TRUE(b.staged);
    EXPECT_EQ(b.route, 0u);
    EXPECT_TRUE(b.device);
    EXPECT_LE(b.bytes, 128u << 10);
  }
  routes_.staging = false;
  Status s = Route(Op::kWrite, {{D(0), kRemote, 4096}}, &p);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("staging"), std::string::npos) << s.message();
}

TEST_F(PlannerRouteTest, RemoteGpuMemoryNeedsARouteThatReachesIt) {
  AddHostLink();
  Plan p;
  Status s = Route(Op::kWrite, {{L(0), kGpu, 4096}}, &p);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("GPU memory"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("host-link: not this pair"), std::string::npos) << s.message();
  AddStagingTargetLink();
  ASSERT_TRUE(Route(Op::kWrite, {{L(0), kGpu, 4096}}, &p).ok());
  EXPECT_EQ(p.batches[0].route, 1u);
}

TEST_F(PlannerRouteTest, EachPairTakesItsOwnRouteWithItsLimits) {
  AddHostLink();
  AddStagingTargetLink();
  routes_.staging = true;
  Plan p;
  // Host memory to the peer's host memory keeps the first link; to its GPU memory takes the
  // second, staged when our side is GPU memory too.
  ASSERT_TRUE(
      Route(Op::kWrite, {{L(0), kRemote, 4096}, {L(8192), kGpu, 1 << 20}, {D(0), kGpu + (1 << 19), 4096}}, &p)
          .ok());
  ASSERT_EQ(p.batches.size(), 4u);
  EXPECT_EQ(p.batches[0].route, 0u);
  for (int i : {1, 2}) {
    EXPECT_EQ(p.batches[i].route, 1u) << i;
    EXPECT_FALSE(p.batches[i].staged) << i;
    EXPECT_EQ(p.batches[i].bytes, 512u << 10) << i;  // cut by that route's own limits
  }
  EXPECT_EQ(p.batches[3].route, 1u);
  EXPECT_TRUE(p.batches[3].staged);
}

TEST_F(PlannerRouteTest, MappingRoutesTakeTheirPairsAtTheOpenedAddress) {
  static uint8_t opened[1 << 20];
  AddCopyEngines(opened);
  AddHostLink();
  routes_.staging = true;
  Plan p;
  // H2D and D2D go to the opened region; D2H to host memory no mapping reaches is staged
  // through the link (never through a mapping route).
  ASSERT_TRUE(
      Route(Op::kWrite, {{L(0), kGpu + 100, 4096}, {D(0), kGpu + 8192, 4096}, {D(8192), kRemote, 4096}}, &p)
          .ok());
  ASSERT_EQ(p.batches.size(), 2u);
  EXPECT_EQ(p.batches[0].route, 0u);
  EXPECT_EQ(p.slices[0].remote, reinterpret_cast<uint64_t>(opened) + 100);
  EXPECT_EQ(p.slices[1].remote, reinterpret_cast<uint64_t>(opened) + 8192);
  EXPECT_EQ(p.batches[1].route, 1u);
  EXPECT_TRUE(p.batches[1].staged);
  EXPECT_EQ(p.slices[2].remote, kRemote);
}

TEST_F(PlannerRouteTest, BatchesInFlightIsTheLeastOfTheRoutesTaken) {
  static uint8_t opened[1 << 20];
  AddCopyEngines(opened);
  AddHostLink({64 << 10, 256 << 10, 1024, UINT64_MAX, 2});  // as tcp with one link
  Plan p;
  ASSERT_TRUE(Route(Op::kWrite, {{D(0), kGpu, 1 << 20}}, &p).ok());  // copy engines: no limit
  EXPECT_EQ(p.batches_in_flight, SIZE_MAX);
  ASSERT_TRUE(Route(Op::kWrite, {{L(0), kRemote, 1 << 20}}, &p).ok());  // over the link
  EXPECT_EQ(p.batches.size(), 4u);
  EXPECT_EQ(p.batches_in_flight, 2u);
  ASSERT_TRUE(Route(Op::kWrite, {{D(0), kGpu, 4096}, {L(0), kRemote, 4096}}, &p).ok());  // both
  EXPECT_EQ(p.batches_in_flight, 2u);
}

TEST_F(PlannerRouteTest, LongRunsTakeTheStreamingLink) {
  AddHostLink({64 << 10, 256 << 10, 1024, 512 << 10});
  Plan p;
  ASSERT_TRUE(Route(Op::kWrite, {{L(0), kRemote, 4096}, {L(8192), kRemote + 8192, 512 << 10}}, &p).ok());
  ASSERT_EQ(p.batches.size(), 3u);
  EXPECT_FALSE(p.batches[0].streaming);
  EXPECT_TRUE(p.batches[1].streaming);  // the long run's slices, in batches of their own
  EXPECT_TRUE(p.batches[2].streaming);
}

// A route like cma or ucx (host pairs), with links of its own: a plain one and a streaming one.
class LinkedRoute final : public transport::Route {
 public:
  explicit LinkedRoute(PlanLimits limits)
      : Route("linked", std::make_shared<transport::CopyLink>(false), limits) {
    set_streaming_link(std::make_shared<transport::CopyLink>(true));
  }
  bool Reach(MemType local, RemoteRegion& r, uint8_t**) override { return HostPairs(local, r); }
  std::string WhyNot(MemType, const RemoteRegion&) const override { return "linked: host pairs only"; }
};

// Each batch names the link that runs it: the route's, its streaming link for a long run, or
// the route's staged link for our GPU memory (the one from GPU memory: [1]).
TEST_F(PlannerRouteTest, EachBatchNamesTheLinkThatRunsIt) {
  auto route = std::make_shared<LinkedRoute>(PlanLimits{64 << 10, 256 << 10, 1024, 512 << 10});
  routes_.routes.push_back(route);
  routes_.staging = true;
  const std::array<std::shared_ptr<transport::Link>, 2> staged = {std::make_shared<transport::CopyLink>(),
                                                                  std::make_shared<transport::CopyLink>()};
  routes_.staged_links.push_back(staged);
  Plan p;
  ASSERT_TRUE(
      Route(
          Op::kWrite,
          {{L(0), kRemote, 4096}, {L(8192), kRemote + 8192, 512 << 10}, {D(0), kRemote + (600 << 10), 4096}},
          &p)
          .ok());
  ASSERT_EQ(p.batches.size(), 4u);
  EXPECT_EQ(p.batches[0].link, &route->link());
  EXPECT_EQ(p.batches[1].link, &route->streaming_link());
  EXPECT_EQ(p.batches[2].link, &route->streaming_link());
  EXPECT_TRUE(p.batches[3].staged && p.batches[3].device);
  EXPECT_EQ(p.batches[3].link, staged[1].get());
}

TEST_F(PlannerRouteTest, StageAllStagesHostMemoryToo) {
  static uint8_t opened[1 << 20];
  AddCopyEngines(opened);
  AddHostLink();
  routes_.staging = true;
  routes_.stage_all = true;
  Plan p;
  ASSERT_TRUE(Route(Op::kRead, {{L(0), kRemote, 4096}}, &p).ok());
  EXPECT_TRUE(p.batches[0].staged);
  EXPECT_EQ(p.batches[0].route, 1u);
  EXPECT_FALSE(p.batches[0].device);
}

TEST_F(PlannerRouteTest, NoRouteForAPairIsRefusedWithTheDescriptor) {
  static uint8_t opened[1 << 20];
  AddCopyEngines(opened);  // as with the transport forced to cuda
  Plan p;
  Status s = Route(Op::kWrite, {{L(0), kRemote, 4096}}, &p);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("descriptor 0"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace xfer
