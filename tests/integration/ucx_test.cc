// The ucx transport between two processes (UCX over its tcp transport here: no RDMA NIC), forced,
// and chosen over tcp for a peer on another host.
#include <random>
#include <thread>

#include "test_common.h"

namespace xfer_test {
namespace {

using namespace std::chrono_literals;

class IntegrationUcx : public PeerFixture {
 protected:
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o;
    o.transport = "ucx";
    o.ucx.endpoints = 3;
    o.streams = 3;
    return o;
  }
  PeerOptions RemoteOptions() override {
    PeerOptions o;
    o.extra_args = {"--ucx", "on"};  // no RDMA device here: offer ucx anyway
    return o;
  }
};

TEST_F(IntegrationUcx, ForcedAndMovesRandomDataOfEverySize) {
  xfer::PeerInfo info;
  XT_ASSERT_OK(engine_.GetPeerInfo(peer_.name(), &info));
  ASSERT_EQ(info.transport, "ucx");
  constexpr uint64_t kMax = 64 << 20;
  const PeerRegion r = peer_.Alloc(kMax);
  LocalBuffer src(kMax), back(kMax);
  for (uint64_t size : std::initializer_list<uint64_t>{1, 7, 4096, 65537, (1 << 20) + 3, kMax}) {
    SCOPED_TRACE(size);
    src.Fill(size);
    XT_ASSERT_OK(Write({{src.addr(), r.addr, size}}));
    EXPECT_EQ(peer_.SumRange(r.addr, size), Hash64(src.data(), size));
    peer_.FillRange(r.addr, size, size + 1);
    XT_ASSERT_OK(Read({{back.addr(), r.addr, size}}));
    EXPECT_EQ(Hash64(back.data(), size), peer_.SumRange(r.addr, size));
  }
  XT_ASSERT_OK(engine_.GetPeerInfo(peer_.name(), &info));
  EXPECT_GT(info.BytesVia(info.transport), 2 * kMax);
}

TEST_F(IntegrationUcx, LargeBatchOfSmallDescriptors) { ScatteredRoundTrip(10000, 512); }

TEST_F(IntegrationUcx, SeveralThreadsOverSeveralLinks) { ConcurrentWrites(4, 4 << 20, 1); }

TEST_F(IntegrationUcx, RangeOutsideTheRegionsIsRefusedAndTheLinkStaysUsable) {
  const PeerRegion r = peer_.Alloc(1 << 20);
  LocalBuffer src(1 << 20);
  src.Fill(6);
  const xfer::Status s = Write({{src.addr(), r.addr + (1 << 20) - 100, 4096}});
  EXPECT_EQ(s.code(), StatusCode::kRemoteAccessDenied) << s.ToString();
  XT_ASSERT_OK(Write({{src.addr(), r.addr, 1 << 20}}));
  EXPECT_EQ(peer_.Sum(r), src.Hash());
}

TEST_F(IntegrationUcx, RegistrationAfterConnectIsReachable) {
  // The region (and its remote key) is registered after the session started.
  const PeerRegion late = peer_.Alloc(256 << 10, "late");
  LocalBuffer src(256 << 10);
  src.Fill(7);
  XT_ASSERT_OK(Write({{src.addr(), late.addr, 256 << 10}}));
  EXPECT_EQ(peer_.Sum(late), src.Hash());
  // Deregistered: refused, not written.
  Reply d = peer_.Call("dereg " + std::to_string(late.handle));
  ASSERT_TRUE(d.ok) << d.line;
  EXPECT_EQ(Write({{src.addr(), late.addr, 4096}}).code(), StatusCode::kRemoteAccessDenied);
}

TEST_F(IntegrationUcx, PeerKilledDuringATransferFailsTheRequest) {
  constexpr uint64_t kLen = 64 << 20;
  const PeerRegion r = peer_.Alloc(kLen);
  LocalBuffer src(kLen);
  src.Fill(8);
  std::vector<TransferDesc> d;
  for (int i = 0; i < 16; ++i) d.push_back({src.addr(), r.addr, kLen});  // ~1 GiB in all
  xfer::RequestHandle h = 0;
  XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kWrite, d, 60s, &h));
  std::this_thread::sleep_for(50ms);
  peer_.KillNow();
  const auto t0 = Clock::now();
  xfer::RequestStatus st;
  const xfer::Status w = engine_.Wait(h, 20s, &st);
  EXPECT_LT(SecondsSince(t0), 10.0) << "a dead peer must end the request promptly";
  EXPECT_TRUE(st.state == xfer::RequestState::kFailed || st.state == xfer::RequestState::kCompleted)
      << w.ToString();
  if (st.state == xfer::RequestState::kFailed) {
    EXPECT_EQ(w.code(), StatusCode::kConnectionLost) << w.ToString();
  }
}

// One thread keeps many requests in flight (the caller posts them; Wait drives the link):
// every byte lands, and reads back.
TEST_F(IntegrationUcx, ManyRequestsInFlightFromOneThread) {
  constexpr int kRequests = 64;
  constexpr uint64_t kBlock = 64 << 10;
  const PeerRegion r = peer_.Alloc(kRequests * kBlock);
  LocalBuffer src(kRequests * kBlock), back(kRequests * kBlock);
  src.Fill(21);
  for (Op op : {Op::kWrite, Op::kRead}) {
    SCOPED_TRACE(op == Op::kWrite ? "WRITE" : "READ");
    std::vector<xfer::RequestHandle> hs(kRequests);
    for (int i = 0; i < kRequests; ++i) {
      const uint64_t local = (op == Op::kWrite ? src : back).addr() + i * kBlock;
      XT_ASSERT_OK(
          engine_.TransferAsync(peer_.name(), op, {{local, r.addr + i * kBlock, kBlock}}, 30s, &hs[i]));
    }
    for (auto h : hs) {
      const Outcome o = WaitFor(engine_, h, 30s);
      XT_EXPECT_OK(o.wait);
      EXPECT_EQ(o.status.state, RequestState::kCompleted);
    }
  }
  EXPECT_EQ(peer_.Sum(r), src.Hash());
  EXPECT_EQ(back.Hash(), src.Hash());
}

// The target deregisters a region while requests into it are in flight: once its DeregisterMem
// returned, no byte of ours lands there (over UCX's tcp emulation a late put would even write
// into memory the target reuses), and the target lives on.
TEST_F(IntegrationUcx, DeregistrationWaitsForRequestsInFlight) {
  constexpr uint64_t kMiB = 1 << 20, kLen = 32 * kMiB;
  const PeerRegion big = peer_.Alloc(kLen, "doomed");
  LocalBuffer src(kMiB);
  src.Fill(5);
  std::vector<xfer::RequestHandle> hs;  // 8 passes over the region: ~0.5 s of writes here
  for (uint64_t off = 0; off < 8 * kLen; off += kMiB) {
    xfer::RequestHandle h = 0;
    XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kWrite, {{src.addr(), big.addr + off % kLen, kMiB}},
                                       60s, &h));
    hs.push_back(h);
  }
  // The peer fills the region with seed 4 the moment its DeregisterMem returns.
  const Reply dereg = peer_.Call("dereg " + std::to_string(big.handle) + " 4", 30s);
  EXPECT_TRUE(dereg.ok) << dereg.line;
  int completed = 0;
  for (auto h : hs) {
    const Outcome o = WaitFor(engine_, h, 30s);
    ASSERT_NE(o.status.state, RequestState::kWaiting) << "request never ended";
    if (o.status.state == RequestState::kCompleted) {
      ++completed;
    } else {
      EXPECT_EQ(o.wait.code(), StatusCode::kRemoteAccessDenied) << o.wait.ToString();
    }
  }
  std::printf("%d of %zu requests completed before the deregistration\n", completed, hs.size());
  LocalBuffer reused(kLen);
  reused.Fill(4);
  EXPECT_EQ(peer_.Sum(big), reused.Hash()) << "a WRITE landed after the target's DeregisterMem returned";
  EXPECT_TRUE(peer_.Call("ping").ok) << "the target died";
}

// Different host ids: ucx is preferred over tcp when both sides offer it. (UCX on loopback
// alone: an interface another test adds for a moment, which UCX would offer, may be gone, or
// refuse, when this one connects.)
TEST(IntegrationUcxChoice, PreferredOverTcpForAnotherHost) {
  ::setenv("UCX_NET_DEVICES", "lo", 1);  // (the peer inherits it)
  struct Unset {
    ~Unset() { ::unsetenv("UCX_NET_DEVICES"); }
  } unset;
  std::string err;
  PeerProcess other;
  PeerOptions po;
  po.host_id = "fake-host-B";
  po.extra_args = {"--ucx", "on"};
  ASSERT_TRUE(other.Start(po, &err)) << err;
  xfer::EngineOptions eo;
  eo.host_id = "fake-host-A";
  eo.ucx.mode = xfer::UcxMode::kOn;
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0", eo));
  XT_ASSERT_OK(e.Connect(other.name(), 10s));
  xfer::PeerInfo info;
  XT_ASSERT_OK(e.GetPeerInfo(other.name(), &info));
  EXPECT_EQ(info.transport, "ucx");
  const PeerRegion r = other.Alloc(1 << 20);
  LocalBuffer src(1 << 20);
  src.Fill(78);
  XT_ASSERT_OK(e.TransferSync(other.name(), Op::kWrite, {{src.addr(), r.addr, src.len()}}, 10s));
  EXPECT_EQ(other.Sum(r), src.Hash());
}

}  // namespace
}  // namespace xfer_test
