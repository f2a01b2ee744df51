// The buffer pool between two processes, with host memory standing in for GPU memory
// (EngineOptions::staging = "always"): the initiator copies each batch into a staging buffer
// and sends it, and a tcp target receives into a staging buffer and copies out. The buffers
// are few and small here, so requests wait for them and large ones pass in many pieces.
#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "test_common.h"

namespace xfer_test {
namespace {

using namespace std::chrono_literals;

// The transports under the pool in this build: tcp, cma, and ucx where it is built.
std::vector<const char*> Staged(std::vector<const char*> transports) {
#ifdef XFER_HAVE_UCX
  transports.push_back("ucx");
#endif
  return transports;
}
std::string ParamName(const ::testing::TestParamInfo<const char*>& p) { return p.param; }

// For a ucx fixture: UCX_TLS=tcp (before either engine starts: the peer inherits it), as
// between hosts without RDMA, and the peer's ucx on (no RDMA device here). Restores UCX_TLS.
struct UcxOverTcp {
  explicit UcxOverTcp(const char* transport) : ucx(std::string(transport) == "ucx") {
    if (!ucx) return;
    if (const char* was = std::getenv("UCX_TLS")) saved = was;
    ::setenv("UCX_TLS", "tcp", 1);
  }
  ~UcxOverTcp() {
    if (!ucx) return;
    if (saved) {
      ::setenv("UCX_TLS", saved->c_str(), 1);
    } else {
      ::unsetenv("UCX_TLS");
    }
  }
  // The peer's arguments: staging always, and ucx on for ucx.
  std::vector<std::string> PeerArgs(std::vector<std::string> args) const {
    if (ucx) args.insert(args.end(), {"--ucx", "on"});
    return args;
  }
  const bool ucx;
  std::optional<std::string> saved;
};

// Param: the transport under the pool ("tcp": both sides stage; "cma", "ucx": only this side
// does; ucx over UCX's tcp transport, as between hosts without RDMA).
class IntegrationStaging : public PeerFixture, public ::testing::WithParamInterface<const char*> {
 protected:
  const UcxOverTcp tls_{GetParam()};
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o;
    o.transport = GetParam();
    o.staging = xfer::Staging::kAlways;
    o.staging_buffers = 2;
    o.staging_buffer_bytes = 256 << 10;
    o.streams = 3;  // more workers than buffers: some wait for one
    return o;
  }
  PeerOptions RemoteOptions() override {
    PeerOptions o;
    o.extra_args = tls_.PeerArgs({"--staging", "always"});
    return o;
  }
  double BuffersInUse() {
    xfer::MetricsSnapshot m;
    XT_EXPECT_OK(engine_.GetMetrics(&m));
    EXPECT_NE(m.Find("xfer_staging_buffers_in_use"), nullptr);
    return m.Sum("xfer_staging_buffers_in_use");
  }
  xfer::PeerInfo Info() {
    xfer::PeerInfo info;
    EXPECT_TRUE(engine_.GetPeerInfo(peer_.name(), &info).ok());
    return info;
  }
};

TEST_P(IntegrationStaging, RandomDataOfEverySizeTakesThePool) {
  const uint64_t moved = RoundTripsOfEverySize();
  const xfer::PeerInfo info = Info();
  EXPECT_EQ(info.transport, GetParam());
  EXPECT_EQ(info.BytesVia("staged"), moved);
  EXPECT_EQ(info.BytesVia(info.transport), 0u);
  // ...after the pool, over the transport.
  ASSERT_EQ(info.staged_via.size(), 1u);
  EXPECT_EQ(info.staged_via[0].path, GetParam());
  EXPECT_EQ(info.staged_via[0].bytes, moved);
}

TEST_P(IntegrationStaging, LargeBatchesOfSmallDescriptors) { ScatteredRoundTrip(10000, 1024); }

TEST_P(IntegrationStaging, ManyThreadsShareTwoBuffers) { ConcurrentWrites(6, 2 << 20, 3); }

TEST_P(IntegrationStaging, AsyncRequestsAllLand) {
  constexpr int kRequests = 8;
  constexpr uint64_t kLen = 2 << 20;
  const PeerRegion r = peer_.Alloc(kRequests * kLen);
  LocalBuffer src(kRequests * kLen);
  src.Fill(77);
  std::vector<xfer::RequestHandle> hs(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kWrite,
                                       {{src.addr() + i * kLen, r.addr + i * kLen, kLen}}, 30s, &hs[i]));
  }
  for (auto h : hs) {
    const Outcome o = WaitFor(engine_, h);
    XT_EXPECT_OK(o.wait);
  }
  EXPECT_EQ(peer_.Sum(r), src.Hash());
}

TEST_P(IntegrationStaging, RemoteRangeRefusedAndTargetUnchanged) { RefusalMovesNothing(); }

TEST_P(IntegrationStaging, DeadlinePassesMidRequest) {
  constexpr uint64_t kLen = 64 << 20;
  const PeerRegion r = peer_.Alloc(kLen);
  LocalBuffer src(kLen);
  std::vector<TransferDesc> d(16, TransferDesc{src.addr(), r.addr, kLen});  // 1 GiB in all
  std::vector<xfer::RegionInfo> known;  // catch up with the new region first: 50 ms is for moving
  XT_ASSERT_OK(engine_.GetRemoteRegions(peer_.name(), &known));
  const auto t0 = Clock::now();
  XT_EXPECT_CODE(Write(d, 50ms), StatusCode::kTimeout);
  EXPECT_LT(SecondsSince(t0), 5.0);
  // Every buffer comes back: the request's batches ended, none holds one.
  EXPECT_EQ(BuffersInUse(), 0.0);
  XT_EXPECT_OK(Write({{src.addr(), r.addr, 4096}}));  // and the pool still serves
  EXPECT_EQ(BuffersInUse(), 0.0);
}

// A READ whose deadline passes mid-request: the same, the other way (the copies out of the
// buffers follow the receives).
TEST_P(IntegrationStaging, ReadDeadlinePassesMidRequest) {
  constexpr uint64_t kLen = 64 << 20;
  const PeerRegion r = peer_.Alloc(kLen);
  LocalBuffer dst(kLen);
  std::vector<TransferDesc> d(16, TransferDesc{dst.addr(), r.addr, kLen});
  std::vector<xfer::RegionInfo> known;
  XT_ASSERT_OK(engine_.GetRemoteRegions(peer_.name(), &known));
  const auto t0 = Clock::now();
  XT_EXPECT_CODE(Read(d, 50ms), StatusCode::kTimeout);
  EXPECT_LT(SecondsSince(t0), 5.0);
  EXPECT_EQ(BuffersInUse(), 0.0);
  peer_.FillRange(r.addr, 4096, 5);
  XT_EXPECT_OK(Read({{dst.addr(), r.addr, 4096}}));
  EXPECT_EQ(Hash64(dst.data(), 4096), peer_.SumRange(r.addr, 4096));
}

// The target deregisters the region a long WRITE moves into: the request ends within seconds,
// well before its 60 s deadline, and this engine then moves another request. (Over ucx a batch
// waits for the target's answer to its staging move, which only this engine's control thread
// hears; the RegionRemove ahead of that answer makes the control thread wait for the batch,
// so the fence must give up on it.)
TEST_P(IntegrationStaging, TargetDeregistersMidRequestEndsItPromptly) {
  constexpr uint64_t kLen = 64 << 20;
  const PeerRegion r = peer_.Alloc(kLen);
  const PeerRegion other = peer_.Alloc(4096);
  LocalBuffer src(kLen);
  std::vector<TransferDesc> d(64, TransferDesc{src.addr(), r.addr, kLen});  // 4 GiB in all
  std::vector<xfer::RegionInfo> known;
  XT_ASSERT_OK(engine_.GetRemoteRegions(peer_.name(), &known));
  xfer::RequestHandle h = 0;
  XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kWrite, d, 60s, &h));
  std::this_thread::sleep_for(200ms);
  const auto t0 = Clock::now();
  EXPECT_TRUE(peer_.Call("dereg " + std::to_string(r.handle), 30s).ok);
  const Outcome o = WaitFor(engine_, h, 30s);
  EXPECT_EQ(o.status.state, RequestState::kFailed) << o.wait.ToString();
  EXPECT_LT(SecondsSince(t0), 15.0);
  XT_EXPECT_OK(Write({{src.addr(), other.addr, 4096}}));
}

// The peer registers and removes a region of its own, again and again, while staged batches
// go to another: none fails. (Over ucx they wait for the peer's staging answers, which the
// control thread reads; its fence for each removal passes them by rather than waiting for
// them until its deadline and then failing them.)
TEST_P(IntegrationStaging, ThePeersOtherRegionsComingAndGoingFailNothing) {
  constexpr uint64_t kLen = 16 << 20;
  const PeerRegion r = peer_.Alloc(kLen);
  LocalBuffer src(kLen);
  src.Fill(5);
  std::vector<xfer::RegionInfo> known;
  XT_ASSERT_OK(engine_.GetRemoteRegions(peer_.name(), &known));
  std::atomic<bool> stop{false};
  int done = 0;
  std::string failed;
  std::thread writer([&] {
    while (!stop.load() && failed.empty()) {
      const xfer::Status s = Write({{src.addr(), r.addr, kLen}}, 30s);
      if (s.ok()) {
        ++done;
      } else {
        failed = s.ToString();
      }
    }
  });
  for (int k = 0; k < 5; ++k) {
    const PeerRegion other = peer_.Alloc(4096);
    std::this_thread::sleep_for(50ms);
    EXPECT_TRUE(peer_.Call("dereg " + std::to_string(other.handle), 30s).ok);
  }
  stop = true;
  writer.join();
  EXPECT_TRUE(failed.empty()) << failed;
  EXPECT_GT(done, 0);
  EXPECT_EQ(peer_.SumRange(r.addr, kLen), src.Hash());
}

// Peer `peer_` is stopped (SIGSTOP) while a staged batch moves to it, and a fence has to give up
// on that batch; `other`, which answers, takes staged WRITEs of three threads meanwhile.
class IntegrationStagingStopped : public IntegrationStaging {
 protected:
  static constexpr uint64_t kLen = 4 << 20;
  void SetUp() override {
    IntegrationStaging::SetUp();
    r_ = peer_.Alloc(kLen);
    std::vector<xfer::RegionInfo> known;
    XT_ASSERT_OK(engine_.GetRemoteRegions(peer_.name(), &known));
    std::string err;
    ASSERT_TRUE(other_.Start(RemoteOptions(), &err)) << err;
    XT_ASSERT_OK(engine_.Connect(other_.name(), 10s));
    theirs_ = other_.Alloc(4096);
    into_ = other_.Alloc(kLen);
    ASSERT_TRUE(PollUntil(
        [&] {
          std::vector<xfer::RegionInfo> regions;
          return engine_.GetRemoteRegions(other_.name(), &regions).ok() && regions.size() == 2;
        },
        10s));
    // A first WRITE opens the way (ucx: the peer lends its staging slots), so that the next
    // batch moves at once, into a peer that no longer answers.
    XT_ASSERT_OK(Write({{src_.addr(), r_.addr, 4096}}));
  }
  // Stops the peer, then starts one batch to it (the streams other than its own carry the
  // writers' batches meanwhile).
  void StopThePeerMidBatch() {
    peer_.Signal(SIGSTOP);
    XT_ASSERT_OK(
        engine_.TransferAsync(peer_.name(), Op::kWrite, {{src_.addr(), r_.addr, kLen}}, 60s, &stalled_));
    std::this_thread::sleep_for(300ms);  // (what went on the wire stalls)
  }
  // Three threads WRITE to `other` until StopWriters, each into its part of `into_`.
  void StartWriters() {
    for (uint64_t k = 0; k < 3; ++k) {
      writers_.emplace_back([this, k] {
        const uint64_t part = kLen / 4;
        while (!stop_.load()) {
          const xfer::Status s = engine_.TransferSync(
              other_.name(), Op::kWrite, {{src_.addr() + k * part, into_.addr + k * part, part}}, 30s);
          if (s.ok()) {
            ++written_;
            continue;
          }
          std::lock_guard lock(failed_mu_);
          failed_ = s.ToString();
          return;
        }
      });
    }
  }
  std::string StopWriters() {
    stop_ = true;
    for (auto& w : writers_) w.join();
    writers_.clear();
    std::lock_guard lock(failed_mu_);
    return failed_;
  }
  void TearDown() override {
    StopWriters();
    peer_.Signal(SIGCONT);
    IntegrationStaging::TearDown();
  }

  LocalBuffer src_{kLen};
  PeerRegion r_, theirs_, into_;
  PeerProcess other_;
  xfer::RequestHandle stalled_ = 0;
  std::vector<std::thread> writers_;
  std::atomic<bool> stop_{false};
  std::atomic<int> written_{0};
  std::mutex failed_mu_;
  std::string failed_;  // failed_mu_
};

// The other peer deregisters a region, which this engine's control thread fences: it is
// confirmed within a heartbeat timeout (3 s), and the stopped peer's request ends long before
// its 60 s deadline (cma's batches need nothing of the peer: they complete). Over ucx a batch
// whose put waited for the stopped peer's acknowledgement held that fence, and with it the
// control thread, until the deadline: its link could not be interrupted.
TEST_P(IntegrationStagingStopped, AStoppedPeerHoldsNoFenceOfTheControlThread) {
  StopThePeerMidBatch();
  const auto t0 = Clock::now();
  const Reply dereg = other_.Call("dereg " + std::to_string(theirs_.handle), 30s);
  const double took = SecondsSince(t0);
  const Outcome o = WaitFor(engine_, stalled_, 30s);
  EXPECT_TRUE(dereg.ok) << dereg.line;
  EXPECT_LT(took, 5.0) << "the other peer's deregistration waited for the stopped peer's batch";
  EXPECT_NE(o.status.state, RequestState::kWaiting) << "the request still waits, 30 s on";
  EXPECT_LT(SecondsSince(t0), 20.0);
}

// This engine deregisters a region of its own while the writers write: the fence (on the
// caller's thread) gives up on the stopped peer's batch, and no WRITE to the other peer, which
// answers, fails. Over ucx a late fence failed every batch waiting for a staging answer, from
// any peer.
TEST_P(IntegrationStagingStopped, AStoppedPeerFailsNoBatchOfAnotherPeer) {
  LocalBuffer mine(4096);
  xfer::MemHandle h = 0;
  XT_ASSERT_OK(engine_.RegisterMem(mine.data(), mine.len(), xfer::MemType::kHost, &h));
  StartWriters();
  StopThePeerMidBatch();
  const int before = written_.load();
  const auto t0 = Clock::now();
  XT_EXPECT_OK(engine_.DeregisterMem(h));
  const double took = SecondsSince(t0);
  std::this_thread::sleep_for(200ms);
  const std::string failed = StopWriters();
  EXPECT_LT(took, 10.0) << "DeregisterMem waited for the stopped peer's batch";
  EXPECT_TRUE(failed.empty()) << "a WRITE to the peer that answers failed: " << failed;
  EXPECT_GT(written_.load(), before) << "no WRITE to the peer that answers completed meanwhile";
}

INSTANTIATE_TEST_SUITE_P(Transports, IntegrationStagingStopped, ::testing::ValuesIn(Staged({"tcp", "cma"})),
                         ParamName);

INSTANTIATE_TEST_SUITE_P(Transports, IntegrationStaging, ::testing::ValuesIn(Staged({"tcp", "cma"})),
                         ParamName);

// Both engines stage toward each other at once, each with one staging buffer that its own
// outgoing batches hold while they wait for the other side: the targets stage with buffers of
// their own, so neither waits for the other's.
class IntegrationStagingBothWays : public PeerFixture {
 protected:
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o;
    o.transport = "tcp";
    o.staging = xfer::Staging::kAlways;
    o.staging_buffers = 1;
    o.staging_buffer_bytes = 256 << 10;
    return o;
  }
  PeerOptions RemoteOptions() override {
    PeerOptions o;
    o.extra_args = {"--staging", "always", "--staging-buffers", "1", "--transport", "tcp"};
    return o;
  }
};

TEST_F(IntegrationStagingBothWays, NeitherWaitsForTheOthersBuffers) {
  constexpr int kRequests = 4;
  constexpr uint64_t kLen = 4 << 20;
  LocalBuffer mine(kRequests * kLen), src(kRequests * kLen);
  src.Fill(3);
  xfer::MemHandle h = 0;
  XT_ASSERT_OK(engine_.RegisterMem(mine.data(), mine.len(), xfer::MemType::kHost, &h));
  const PeerRegion theirs = peer_.Alloc(kRequests * kLen);
  const PeerRegion their_src = peer_.Alloc(kRequests * kLen);
  peer_.Fill(their_src, 4);
  // The peer's requests toward us, then ours toward it, all in flight together.
  std::vector<uint64_t> their_requests;
  for (int i = 0; i < kRequests; ++i) {
    const Reply r = peer_.Call("axfer write " + engine_.LocalName() + " 20000 " +
                               std::to_string(their_src.addr + i * kLen) + " " +
                               std::to_string(mine.addr() + i * kLen) + " " + std::to_string(kLen));
    ASSERT_TRUE(r.ok) << r.line;
    their_requests.push_back(r.u64(0));
  }
  std::vector<xfer::RequestHandle> ours(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    XT_ASSERT_OK(engine_.TransferAsync(
        peer_.name(), Op::kWrite, {{src.addr() + i * kLen, theirs.addr + i * kLen, kLen}}, 20s, &ours[i]));
  }
  const auto t0 = Clock::now();
  for (auto h2 : ours) XT_EXPECT_OK(WaitFor(engine_, h2).wait);
  for (auto req : their_requests) {
    const Reply r = peer_.Call("wait " + std::to_string(req) + " 20000");
    EXPECT_TRUE(r.ok && r.words.size() >= 2 && r.words[0] == "COMPLETED") << r.line;
  }
  // ~0.05 s here, ~1 s under ASan on a loaded machine; a deadlock would hit the 20 s deadlines.
  EXPECT_LT(SecondsSince(t0), 10.0) << "the engines waited for each other's buffers";
  EXPECT_EQ(peer_.Sum(theirs), src.Hash());
  EXPECT_EQ(peer_.SumRange(their_src.addr, their_src.len), mine.Hash());
  XT_EXPECT_OK(engine_.DeregisterMem(h));
}

// A target that stages only part of its memory, as one with GPU and host memory does: the test
// hook XFER_TEST_STAGE_TAG makes the peer stage its regions of that tag as GPU memory, and
// move the others straight. Over tcp one frame then mixes ranges the target receives or sends
// straight with staged ones (short ones gathered into one piece, long ones in several).
class IntegrationStagingPart : public PeerFixture {
 protected:
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o;
    o.transport = "tcp";
    return o;
  }
  PeerOptions RemoteOptions() override {
    PeerOptions o;
    o.env = {"XFER_TEST_STAGE_TAG=gpu"};
    return o;
  }
};

TEST_F(IntegrationStagingPart, OneBatchMixesStagedAndStraightRangesBothWays) {
  constexpr uint64_t kRegion = 24 << 20;
  const PeerRegion staged = peer_.Alloc(kRegion, "gpu"), straight = peer_.Alloc(kRegion);
  // Sizes that fall inside, on and across the target's pieces (1 MiB, in two halves of its
  // 4 MiB buffer), alternating between the two regions within each batch.
  const std::vector<uint64_t> sizes = {1, 100, 4096, 300 << 10, (1 << 20) + 7, 5 << 19, 64 << 10, 3, 2 << 20};
  std::vector<TransferDesc> d;
  uint64_t local = 0, at[2] = {0, 0};
  for (int round = 0; round < 3; ++round) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      const int k = static_cast<int>((i + round) % 2);
      d.push_back({local, (k == 0 ? staged.addr : straight.addr) + at[k], sizes[i]});
      local += sizes[i];
      at[k] += sizes[i] + 13;  // (gaps: ranges not contiguous at the target)
    }
  }
  ASSERT_LE(std::max(at[0], at[1]), kRegion);
  LocalBuffer src(local), back(local);
  src.Fill(7);
  for (auto& x : d) x.local_addr += src.addr();
  XT_ASSERT_OK(Write(d));
  for (auto& x : d) x.local_addr = back.addr() + (x.local_addr - src.addr());
  XT_ASSERT_OK(Read(d));
  EXPECT_EQ(back.Hash(), src.Hash());

  // The hook stages that region: a target with staging off refuses it, and not the other.
  PeerOptions off = RemoteOptions();
  off.extra_args = {"--staging", "off"};
  PeerProcess refusing;
  std::string err;
  ASSERT_TRUE(refusing.Start(off, &err)) << err;
  XT_ASSERT_OK(engine_.Connect(refusing.name(), std::chrono::seconds(10)));
  const PeerRegion no = refusing.Alloc(4096, "gpu"), yes = refusing.Alloc(4096);
  EXPECT_EQ(engine_.TransferSync(refusing.name(), Op::kWrite, {{src.addr(), no.addr, 4096}}, 10s).code(),
            StatusCode::kUnsupported);
  XT_EXPECT_OK(engine_.TransferSync(refusing.name(), Op::kWrite, {{src.addr(), yes.addr, 4096}}, 10s));
}

class IntegrationStagingKill : public PeerFixture, public ::testing::WithParamInterface<const char*> {
 protected:
  const UcxOverTcp tls_{GetParam()};
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o;
    o.transport = GetParam();
    o.staging = xfer::Staging::kAlways;
    o.heartbeat_interval = 100ms;
    o.heartbeat_timeout = 1000ms;
    return o;
  }
  PeerOptions RemoteOptions() override {
    PeerOptions o;
    o.extra_args = tls_.PeerArgs({"--staging", "always"});
    return o;
  }
};

TEST_P(IntegrationStagingKill, PeerKilledDuringTransferFailsConnectionLost) { KillPeerDuringLargeWrite(); }

INSTANTIATE_TEST_SUITE_P(Transports, IntegrationStagingKill, ::testing::ValuesIn(Staged({"tcp"})), ParamName);

}  // namespace
}  // namespace xfer_test
