// The tcp transport between two processes on this host (forced, or chosen because the host
// ids differ): correctness across sizes and batch shapes, several links, peer death.
#include <atomic>
#include <random>
#include <thread>

#include "test_common.h"
#include "util/checksum.h"

namespace xfer_test {
namespace {

using namespace std::chrono_literals;

class IntegrationTcp : public PeerFixture, public ::testing::WithParamInterface<bool> {
 protected:
  // Param: least-loaded link choice (true) or round-robin (false).
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o;
    o.transport = "tcp";
    o.tcp.links = 3;
    o.streams = 3;
    o.tcp.least_loaded = GetParam();
    return o;
  }
};

TEST_P(IntegrationTcp, ChosenAndMovesRandomDataOfEverySize) {
  xfer::PeerInfo info;
  XT_ASSERT_OK(engine_.GetPeerInfo(peer_.name(), &info));
  EXPECT_EQ(info.transport, "tcp");
  RoundTripsOfEverySize();
}

TEST_P(IntegrationTcp, LargeBatchesOfSmallDescriptors) { ScatteredRoundTrip(10000, 1024); }

TEST_P(IntegrationTcp, ManyThreadsAtOnce) { ConcurrentWrites(6, 4 << 20, 5); }

TEST_P(IntegrationTcp, RemoteRangeRefusedAndTargetUnchanged) { RefusalMovesNothing(); }

INSTANTIATE_TEST_SUITE_P(Links, IntegrationTcp, ::testing::Values(false, true),
                         [](const auto& p) { return p.param ? "LeastLoaded" : "RoundRobin"; });

// EngineOptions::tcp.checksum: every batch carries its payload's checksum, checked by the side
// that receives it (direct, and staged through the buffer pools of both sides).
class IntegrationTcpChecksum : public PeerFixture, public ::testing::WithParamInterface<bool> {
 protected:
  void SetUp() override {
    if (!xfer::checksum::Available())
      GTEST_SKIP() << "built without libxxhash (scripts/setup.sh installs libxxhash-dev)";
    PeerFixture::SetUp();
  }
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o;
    o.transport = "tcp";
    o.tcp.checksum = true;
    if (GetParam()) o.staging = xfer::Staging::kAlways;
    return o;
  }
  PeerOptions RemoteOptions() override {
    PeerOptions o;
    if (GetParam()) o.extra_args = {"--staging", "always"};
    return o;
  }
};

TEST_P(IntegrationTcpChecksum, MovesRandomDataOfEverySize) { RoundTripsOfEverySize(); }

TEST_P(IntegrationTcpChecksum, LargeBatchesOfSmallDescriptors) { ScatteredRoundTrip(10000, 1024); }

INSTANTIATE_TEST_SUITE_P(Paths, IntegrationTcpChecksum, ::testing::Values(false, true),
                         [](const auto& p) { return p.param ? "Staged" : "Direct"; });

// slice_bytes and batch_bytes past what one tcp frame may carry (1 GiB) are cut to it: a
// WRITE of 1.25 GiB in one descriptor lands whole (it failed CONNECTION_LOST, the target
// refusing the frame).
class IntegrationTcpHugeBatches : public PeerFixture {
 protected:
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o;
    o.transport = "tcp";
    o.slice_bytes = o.batch_bytes = 2ull << 30;
    return o;
  }
};

TEST_F(IntegrationTcpHugeBatches, AreCutToWhatAFrameCarries) {
  const uint64_t len = (1ull << 30) + (256ull << 20);
  const PeerRegion r = peer_.Alloc(len);
  LocalBuffer src(len);
  src.Fill(7);
  XT_ASSERT_OK(Write({{src.addr(), r.addr, len}}, 60s));
  EXPECT_EQ(peer_.SumRange(r.addr, len), src.Hash());
}

class IntegrationTcpKill : public PeerFixture {
 protected:
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o;
    o.transport = "tcp";
    o.heartbeat_interval = 100ms;
    o.heartbeat_timeout = 1000ms;
    return o;
  }
};

TEST_F(IntegrationTcpKill, PeerKilledDuringTransferFailsConnectionLost) { KillPeerDuringLargeWrite(); }

}  // namespace
}  // namespace xfer_test
