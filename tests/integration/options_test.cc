// EngineOptions against a real peer: data-path shapes (streams, slices, batches) must not change
// what lands, odd values are refused cleanly at Initialize, a forced transport is honoured.
#include <string>
#include <vector>

#include "test_common.h"

namespace xfer_test {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kMiB = 1ull << 20;

struct Shape {
  const char* name;
  int streams;
  uint64_t slice_bytes;
  uint64_t batch_bytes;
  int64_t spin_us;
};
void PrintTo(const Shape& s, std::ostream* os) { *os << s.name; }

class IntegrationOptionsShape : public PeerFixture, public ::testing::WithParamInterface<Shape> {
 protected:
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o;
    o.streams = GetParam().streams;
    o.slice_bytes = GetParam().slice_bytes;
    o.batch_bytes = GetParam().batch_bytes;
    o.spin = std::chrono::microseconds(GetParam().spin_us);
    return o;
  }
};

TEST_P(IntegrationOptionsShape, MixedWorkloadLandsExactly) {
  // One big odd-sized descriptor plus 3000 small scattered ones, WRITE then READ back.
  constexpr uint64_t kBig = 9 * kMiB + 5;
  constexpr uint64_t kSmall = 3000;
  const PeerRegion r = peer_.Alloc(kBig + kSmall * 200, "shape");
  ASSERT_NE(r.addr, 0u);
  peer_.Fill(r, 1);
  LocalBuffer expected(r.len);
  expected.Fill(1);
  LocalBuffer src(kBig + kSmall * 100);
  src.Fill(2);
  std::vector<TransferDesc> d = {{src.addr(), r.addr + 3, kBig}};
  std::memcpy(expected.data() + 3, src.data(), kBig);
  for (uint64_t i = 0; i < kSmall; ++i) {
    const uint64_t len = 1 + (i * 37) % 100;
    const uint64_t loff = kBig + i * 100, roff = kBig + 8 + i * 200;
    d.push_back({src.addr() + loff, r.addr + roff, len});
    std::memcpy(expected.data() + roff, src.data() + loff, len);
  }
  XT_ASSERT_OK(Write(d, 60s));
  EXPECT_EQ(peer_.Sum(r), expected.Hash());

  LocalBuffer back(r.len);
  xfer::RequestHandle req = 0;
  XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kRead, {{back.addr(), r.addr, r.len}}, 60s, &req));
  const Outcome o = WaitFor(engine_, req, 60s);
  XT_ASSERT_OK(o.wait);
  EXPECT_EQ(std::memcmp(back.data(), expected.data(), r.len), 0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, IntegrationOptionsShape,
                         ::testing::Values(Shape{"OneStream", 1, 1 * kMiB, 4 * kMiB, 50},
                                           Shape{"EightStreamsTinySlices", 8, 4096, 16384, 50},
                                           Shape{"OddSlices", 3, 1000, 2500, 0},
                                           Shape{"SliceBiggerThanBatch", 2, 8 * kMiB, 64 * 1024, 50},
                                           Shape{"HugeSlicesNoSpin", 4, 1ull << 30, 1ull << 30, 0}),
                         [](const ::testing::TestParamInfo<Shape>& i) { return std::string(i.param.name); });

TEST(IntegrationOptions, NonsenseValuesAreRefusedAtInitialize) {
  struct Case {
    const char* what;
    void (*set)(xfer::EngineOptions*);
  };
  const Case cases[] = {
      {"streams 0", [](xfer::EngineOptions* o) { o->streams = 0; }},
      {"streams -1", [](xfer::EngineOptions* o) { o->streams = -1; }},
      {"heartbeat_interval 0", [](xfer::EngineOptions* o) { o->heartbeat_interval = 0ms; }},
      {"heartbeat_timeout 0", [](xfer::EngineOptions* o) { o->heartbeat_timeout = 0ms; }},
      {"heartbeat_timeout < interval",
       [](xfer::EngineOptions* o) {
         o->heartbeat_interval = 1000ms;
         o->heartbeat_timeout = 100ms;
       }},
      {"spin over 1 s", [](xfer::EngineOptions* o) { o->spin = std::chrono::microseconds(1000001); }},
      {"unknown transport", [](xfer::EngineOptions* o) { o->transport = "carrier-pigeon"; }},
      {"tcp.links 0", [](xfer::EngineOptions* o) { o->tcp.links = 0; }},
      {"tcp.nics unknown", [](xfer::EngineOptions* o) { o->tcp.nics = {"no-such-nic0"}; }},
      {"tcp.nics twice",
       [](xfer::EngineOptions* o) {
         o->tcp.nics = {"lo", "127.0.0.1"};
       }},
      {"ucx.endpoints 65", [](xfer::EngineOptions* o) { o->ucx.endpoints = 65; }},
      {"ucx.mode 7", [](xfer::EngineOptions* o) { o->ucx.mode = static_cast<xfer::UcxMode>(7); }},
      {"staging 7", [](xfer::EngineOptions* o) { o->staging = static_cast<xfer::Staging>(7); }},
      {"staging_buffers 0", [](xfer::EngineOptions* o) { o->staging_buffers = 0; }},
      {"staging_buffers 65", [](xfer::EngineOptions* o) { o->staging_buffers = 65; }},
      {"staging_buffer_bytes 4K", [](xfer::EngineOptions* o) { o->staging_buffer_bytes = 4096; }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    xfer::EngineOptions o;
    c.set(&o);
    xfer::Engine e;
    const xfer::Status s = e.Initialize("127.0.0.1:0", o);
    EXPECT_TRUE(s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kUnsupported)
        << s.ToString();
  }
}

TEST(IntegrationOptions, DegenerateSizesAreRefusedOrHarmless) {
  // Zero slice/batch sizes and a negative spin: refused, or clamped to something that still
  // moves a 4 MiB self-transfer correctly and promptly.
  struct Case {
    const char* what;
    void (*set)(xfer::EngineOptions*);
  };
  const Case cases[] = {
      {"slice_bytes 0", [](xfer::EngineOptions* o) { o->slice_bytes = 0; }},
      {"batch_bytes 0", [](xfer::EngineOptions* o) { o->batch_bytes = 0; }},
      {"negative spin", [](xfer::EngineOptions* o) { o->spin = std::chrono::microseconds(-5); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    xfer::EngineOptions o;
    c.set(&o);
    xfer::Engine e;
    const xfer::Status s = e.Initialize("127.0.0.1:0", o);
    if (!s.ok()) {
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
      continue;
    }
    LocalBuffer target(4 * kMiB), src(4 * kMiB);
    src.Fill(8);
    xfer::MemHandle h = 0;
    XT_ASSERT_OK(e.RegisterMem(target.data(), target.len(), xfer::MemType::kHost, &h));
    const auto t0 = Clock::now();
    XT_EXPECT_OK(e.TransferSync(e.LocalName(), Op::kWrite, {{src.addr(), target.addr(), src.len()}}, 20s));
    EXPECT_LT(SecondsSince(t0), 5.0) << "accepted option makes a 4 MiB copy crawl";
    EXPECT_EQ(target.Hash(), src.Hash());
  }
}

class IntegrationOptionsTransport : public PeerFixture {
 protected:
  bool ConnectInSetUp() override { return false; }
};

TEST_F(IntegrationOptionsTransport, ForcedCmaIsUsed) {
  xfer::EngineOptions o;
  o.transport = "cma";
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0", o));
  XT_ASSERT_OK(e.Connect(peer_.name(), 10s));
  xfer::PeerInfo info;
  XT_ASSERT_OK(e.GetPeerInfo(peer_.name(), &info));
  EXPECT_EQ(info.transport, "cma");
  const PeerRegion r = peer_.Alloc(kMiB);
  LocalBuffer src(kMiB);
  src.Fill(3);
  XT_EXPECT_OK(e.TransferSync(peer_.name(), Op::kWrite, {{src.addr(), r.addr, kMiB}}, 10s));
  EXPECT_EQ(peer_.Sum(r), src.Hash());
}

TEST_F(IntegrationOptionsTransport, ForcedLocalCannotReachAnotherProcess) {
  xfer::EngineOptions o;
  o.transport = "local";
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0", o));
  const xfer::Status s = e.Connect(peer_.name(), 10s);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.ToString();
  const PeerRegion r = peer_.Alloc(4096);
  const uint64_t before = peer_.Sum(r);
  LocalBuffer src(4096);
  src.Fill(4);
  const xfer::Status w = e.TransferSync(peer_.name(), Op::kWrite, {{src.addr(), r.addr, 4096}}, 5s);
  EXPECT_FALSE(w.ok());
  EXPECT_EQ(peer_.Sum(r), before);
}

TEST_F(IntegrationOptionsTransport, PeerWithFewerStreamsInteroperates) {
  // Options are local: a one-stream peer and an eight-stream initiator work together.
  PeerProcess one;
  PeerOptions po;
  po.extra_args = {"--streams", "1"};
  std::string err;
  ASSERT_TRUE(one.Start(po, &err)) << err;
  xfer::EngineOptions o;
  o.streams = 8;
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0", o));
  XT_ASSERT_OK(e.Connect(one.name(), 10s));
  const PeerRegion r = one.Alloc(16 * kMiB);
  LocalBuffer src(16 * kMiB);
  src.Fill(5);
  XT_EXPECT_OK(e.TransferSync(one.name(), Op::kWrite, {{src.addr(), r.addr, r.len}}, 10s));
  EXPECT_EQ(one.Sum(r), src.Hash());
  // And the one-stream peer writes back into us.
  LocalBuffer mine(16 * kMiB);
  xfer::MemHandle h = 0;
  XT_ASSERT_OK(e.RegisterMem(mine.data(), mine.len(), xfer::MemType::kHost, &h, "mine"));
  ASSERT_TRUE(PollUntil([&] { return one.Call("info " + e.LocalName()).ok; }, 5s));
  const Reply w = one.Xfer("write", e.LocalName(), 10000, r.addr, mine.addr(), mine.len());
  EXPECT_TRUE(w.ok) << w.line;
  EXPECT_EQ(mine.Hash(), src.Hash());
  XT_EXPECT_OK(e.DeregisterMem(h));
}

}  // namespace
}  // namespace xfer_test
