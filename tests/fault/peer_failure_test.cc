// Peer failure with real processes: kill -9 during transfers, restart at the same name, hung
// (SIGSTOP) peers, graceful exits. Both sides use a 100 ms heartbeat and a 1 s timeout.
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "test_common.h"

namespace xfer_test {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kMiB = 1ull << 20;
constexpr int kHeartbeatMs = 100;
constexpr int kHeartbeatTimeoutMs = 1000;
// Detection must happen within the heartbeat timeout; allow scheduling slack (2 shared cores,
// sanitizers).
constexpr double kDetectSeconds = 3.0;

PeerOptions FastHeartbeat(const std::string& name = "127.0.0.1:0") {
  PeerOptions o;
  o.name = name;
  o.heartbeat_ms = kHeartbeatMs;
  o.heartbeat_timeout_ms = kHeartbeatTimeoutMs;
  return o;
}

class FaultPeerFailure : public PeerFixture {
 protected:
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o;
    o.heartbeat_interval = std::chrono::milliseconds(kHeartbeatMs);
    o.heartbeat_timeout = std::chrono::milliseconds(kHeartbeatTimeoutMs);
    return o;
  }
  PeerOptions RemoteOptions() override { return FastHeartbeat(); }

  bool Connected(const std::string& name) {
    xfer::PeerInfo info;
    return engine_.GetPeerInfo(name, &info).ok();
  }

  // Starts a peer at exactly `name`; retries briefly in case the port is not yet free.
  void StartAt(PeerProcess* p, const std::string& name) {
    std::string err;
    const auto t0 = Clock::now();
    int retries = 0;
    while (!p->Start(FastHeartbeat(name), &err)) {
      ASSERT_LT(SecondsSince(t0), 10.0) << "could not restart a peer at " << name << ": " << err;
      ++retries;
      std::this_thread::sleep_for(100ms);
    }
    // Counted, not timed: a slow machine may take long to start a peer that binds at once.
    if (retries > 4) {
      ADD_FAILURE() << "restarting at " << name << " needed " << retries
                    << " retries (listen socket without SO_REUSEADDR?): " << err;
    }
    ASSERT_EQ(p->name(), name);
  }

  // Connects to a restarted peer at `name` and proves the new incarnation works.
  void ExpectNewIncarnationWorks(const std::string& name, const xfer::PeerInfo& old) {
    PeerProcess fresh;
    ASSERT_NO_FATAL_FAILURE(StartAt(&fresh, name));
    XT_ASSERT_OK(engine_.Connect(name, 10s));
    xfer::PeerInfo info;
    XT_ASSERT_OK(engine_.GetPeerInfo(name, &info));
    EXPECT_NE(info.incarnation, old.incarnation) << "restarted peer has the old incarnation";
    EXPECT_EQ(info.pid, fresh.pid());
    EXPECT_NE(info.pid, old.pid);
    EXPECT_EQ(info.transport, "cma");
    // Nothing of the old incarnation's regions survives.
    std::vector<xfer::RegionInfo> regions;
    XT_ASSERT_OK(engine_.GetRemoteRegions(name, &regions));
    EXPECT_TRUE(regions.empty()) << regions.size() << " stale regions from the old incarnation";
    const PeerRegion r = fresh.Alloc(4 * kMiB, "reborn");
    ASSERT_NE(r.addr, 0u);
    LocalBuffer src(r.len), back(r.len);
    src.Fill(808);
    XT_ASSERT_OK(engine_.TransferSync(name, Op::kWrite, {{src.addr(), r.addr, r.len}}, 10s));
    XT_ASSERT_OK(engine_.TransferSync(name, Op::kRead, {{back.addr(), r.addr, r.len}}, 10s));
    EXPECT_EQ(fresh.Sum(r), src.Hash());
    EXPECT_EQ(std::memcmp(back.data(), src.data(), r.len), 0);
  }

  // Runs DeregisterMem with a deadline; a hang fails the test instead of wedging it.
  void ExpectDeregisterReturns(xfer::MemHandle h, std::chrono::seconds limit) {
    auto done = std::make_shared<std::promise<xfer::Status>>();
    std::future<xfer::Status> f = done->get_future();
    std::thread([this, h, done] { done->set_value(engine_.DeregisterMem(h)); }).detach();
    if (f.wait_for(limit) != std::future_status::ready) {
      ADD_FAILURE() << "DeregisterMem blocked for more than " << limit.count()
                    << " s after the peer died or hung";
      // Free the peer so the engine can make progress, then give it one more chance.
      peer_.KillNow();
      if (f.wait_for(20s) != std::future_status::ready) {
        std::fprintf(stderr, "DeregisterMem still blocked; aborting the test process\n");
        std::_Exit(1);
      }
    }
    XT_EXPECT_OK(f.get());
  }
};

// kill -9 of the target while a 2 GiB request runs; the request fails with kConnectionLost
// within the heartbeat timeout, and a restarted target at the same name works.
class FaultKillDuringTransfer : public FaultPeerFailure, public ::testing::WithParamInterface<Op> {};

TEST_P(FaultKillDuringTransfer, RequestFailsConnectionLostThenRestartWorks) {
  const Op op = GetParam();
  constexpr uint64_t kPiece = 64 * kMiB;
  constexpr int kSlots = 4;
  const PeerRegion r = peer_.Alloc(kSlots * kPiece, "victim");
  ASSERT_NE(r.addr, 0u);
  LocalBuffer local(kPiece);
  local.Fill(1);
  std::vector<TransferDesc> d;
  for (int i = 0; i < 32; ++i) d.push_back({local.addr(), r.addr + (i % kSlots) * kPiece, kPiece});
  const std::string name = peer_.name();
  xfer::PeerInfo old;
  XT_ASSERT_OK(engine_.GetPeerInfo(name, &old));

  xfer::RequestHandle req = 0;
  XT_ASSERT_OK(engine_.TransferAsync(name, op, d, 60s, &req));
  std::this_thread::sleep_for(5ms);
  const auto killed_at = Clock::now();
  peer_.Signal(SIGKILL);
  const Outcome o = WaitFor(engine_, req, 10s);
  const double took = SecondsSince(killed_at);
  ASSERT_NE(o.status.state, RequestState::kWaiting) << "request still running 10 s after kill";
  ASSERT_NE(o.status.state, RequestState::kCompleted)
      << "2 GiB finished within 5 ms: the test did not kill during the transfer";
  EXPECT_EQ(o.status.state, RequestState::kFailed) << xfer::RequestStateName(o.status.state);
  EXPECT_EQ(o.wait.code(), StatusCode::kConnectionLost) << o.wait.ToString();
  EXPECT_EQ(o.status.status.code(), StatusCode::kConnectionLost) << o.status.status.ToString();
  EXPECT_LT(took, kDetectSeconds) << "request took " << took << " s to fail after kill -9";
  ASSERT_TRUE(peer_.WaitExit(10s));

  // The session goes away within the heartbeat timeout; new requests are refused.
  EXPECT_TRUE(PollUntil([&] { return !Connected(name); },
                        std::chrono::milliseconds(static_cast<int>(kDetectSeconds * 1000))))
      << "session to a dead peer still listed";
  const xfer::Status after = engine_.TransferSync(name, op, {{local.addr(), r.addr, 64}}, 5s);
  EXPECT_TRUE(after.code() == StatusCode::kNotConnected || after.code() == StatusCode::kConnectionLost)
      << after.ToString();

  ExpectNewIncarnationWorks(name, old);
}

INSTANTIATE_TEST_SUITE_P(Ops, FaultKillDuringTransfer, ::testing::Values(Op::kWrite, Op::kRead),
                         [](const ::testing::TestParamInfo<Op>& i) {
                           return i.param == Op::kWrite ? std::string("Write") : std::string("Read");
                         });

TEST_F(FaultPeerFailure, ManyOutstandingRequestsAllEndAfterKill) {
  const PeerRegion r = peer_.Alloc(64 * kMiB, "many");
  ASSERT_NE(r.addr, 0u);
  LocalBuffer src(kMiB);
  src.Fill(2);
  std::vector<xfer::RequestHandle> reqs;
  // 64 MiB each, 12.8 GB in all: far more than moves while the requests are submitted (on
  // a fast machine, or a slow ASan build, 8 MiB each had all finished before the kill).
  for (int i = 0; i < 200; ++i) {
    xfer::RequestHandle req = 0;
    std::vector<TransferDesc> d(64, TransferDesc{src.addr(), r.addr + (i % 64) * kMiB, kMiB});
    XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kWrite, d, 60s, &req));
    reqs.push_back(req);
  }
  const auto killed_at = Clock::now();
  peer_.Signal(SIGKILL);
  int completed = 0, lost = 0;
  for (auto req : reqs) {
    const Outcome o = WaitFor(engine_, req, 10s);
    ASSERT_NE(o.status.state, RequestState::kWaiting) << "a request hung after kill -9";
    if (o.status.state == RequestState::kCompleted) {
      ++completed;
    } else {
      ++lost;
      EXPECT_EQ(o.status.state, RequestState::kFailed);
      EXPECT_EQ(o.wait.code(), StatusCode::kConnectionLost) << o.wait.ToString();
    }
  }
  EXPECT_LT(SecondsSince(killed_at), kDetectSeconds + 1.0);
  EXPECT_GT(lost, 0) << "all 200 requests completed before the kill landed";
  RecordProperty("completed", completed);
  RecordProperty("lost", lost);
}

TEST_F(FaultPeerFailure, KilledIdlePeerIsDroppedAndItsSuccessorConnects) {
  const std::string name = peer_.name();
  xfer::PeerInfo old;
  XT_ASSERT_OK(engine_.GetPeerInfo(name, &old));
  const auto killed_at = Clock::now();
  peer_.KillNow();
  EXPECT_TRUE(PollUntil([&] { return !Connected(name); }, 5s));
  EXPECT_LT(SecondsSince(killed_at), kDetectSeconds) << "dead idle peer detected too late";
  ExpectNewIncarnationWorks(name, old);
}

TEST_F(FaultPeerFailure, RestartedPeerBeforeDetectionIsANewPeer) {
  // Kill and restart at once; Connect may race the old session's teardown but must end up
  // on the new incarnation within the heartbeat timeout.
  const std::string name = peer_.name();
  xfer::PeerInfo old;
  XT_ASSERT_OK(engine_.GetPeerInfo(name, &old));
  peer_.KillNow();
  PeerProcess fresh;
  ASSERT_NO_FATAL_FAILURE(StartAt(&fresh, name));
  const auto t0 = Clock::now();
  xfer::Status s;
  while (!(s = engine_.Connect(name, 2s)).ok()) {
    ASSERT_EQ(s.code(), StatusCode::kAlreadyConnected) << s.ToString();
    ASSERT_LT(SecondsSince(t0), kDetectSeconds) << "stale session to the dead incarnation kept";
    std::this_thread::sleep_for(20ms);
  }
  xfer::PeerInfo info;
  XT_ASSERT_OK(engine_.GetPeerInfo(name, &info));
  EXPECT_NE(info.incarnation, old.incarnation);
  EXPECT_EQ(info.pid, fresh.pid());
  const PeerRegion r = fresh.Alloc(kMiB);
  LocalBuffer src(kMiB);
  src.Fill(3);
  XT_EXPECT_OK(engine_.TransferSync(name, Op::kWrite, {{src.addr(), r.addr, kMiB}}, 10s));
  EXPECT_EQ(fresh.Sum(r), src.Hash());
}

TEST_F(FaultPeerFailure, HungPeerIsDetectedByHeartbeat) {
  const std::string name = peer_.name();
  const PeerRegion r = peer_.Alloc(64 * kMiB, "hung");
  ASSERT_NE(r.addr, 0u);
  LocalBuffer src(64 * kMiB);
  src.Fill(4);

  peer_.Signal(SIGSTOP);
  const auto stopped_at = Clock::now();
  // A request issued while the peer is frozen ends one way or the other (cma can still reach
  // a stopped process's memory), never hangs.
  xfer::RequestHandle req = 0;
  const xfer::Status issued =
      engine_.TransferAsync(name, Op::kWrite, {{src.addr(), r.addr, src.len()}}, 30s, &req);
  if (issued.ok()) {
    const Outcome o = WaitFor(engine_, req, 10s);
    ASSERT_NE(o.status.state, RequestState::kWaiting) << "request to a hung peer never ended";
    EXPECT_TRUE(o.status.state == RequestState::kCompleted || o.wait.code() == StatusCode::kConnectionLost)
        << o.wait.ToString();
  }

  ASSERT_TRUE(PollUntil([&] { return !Connected(name); }, 8s)) << "a SIGSTOPped peer was never declared dead";
  const double took = SecondsSince(stopped_at);
  EXPECT_LT(took, kDetectSeconds) << "hung peer detected after " << took << " s";
  // (Not 1 s: its last heartbeat may have left late, if its control thread was starved.)
  EXPECT_GT(took, 0.2) << "declared dead after " << took << " s, well before the 1 s heartbeat timeout";
  const xfer::Status after = engine_.TransferSync(name, Op::kWrite, {{src.addr(), r.addr, 64}}, 5s);
  EXPECT_TRUE(after.code() == StatusCode::kNotConnected || after.code() == StatusCode::kConnectionLost)
      << after.ToString();

  // Thawed, the same process (same incarnation) can be connected to again.
  peer_.Signal(SIGCONT);
  ASSERT_TRUE(peer_.Call("ping", 10s).ok) << "peer did not survive SIGSTOP/SIGCONT";
  const auto t0 = Clock::now();
  xfer::Status s;
  while (!(s = engine_.Connect(name, 2s)).ok()) {
    ASSERT_LT(SecondsSince(t0), 5.0) << "cannot reconnect to the thawed peer: " << s.ToString();
    std::this_thread::sleep_for(50ms);
  }
  XT_EXPECT_OK(engine_.TransferSync(name, Op::kWrite, {{src.addr(), r.addr, 4096}}, 10s));
  EXPECT_EQ(peer_.SumRange(r.addr, 4096), Hash64(src.data(), 4096));
  peer_.KillNow();
}

// A target stopped (SIGSTOP) past its heartbeat timeout reads what its peer sent meanwhile
// before it judges the peer's silence: the peer, which waited (its own timeout is long), keeps
// its session, and a notified request it began then (its beginning over the session, waiting
// in the target's socket) ends with the one notification it owes. (Resumed, the target's
// epoll_wait returns EINTR before anything is read; its heartbeat check once ran first.)
class FaultStoppedTarget : public FaultPeerFailure {
 protected:
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o = FaultPeerFailure::LocalOptions();
    o.heartbeat_timeout = 30s;
    o.notify.ring_bytes = 0;
    return o;
  }
  PeerOptions RemoteOptions() override {
    PeerOptions o = FastHeartbeat();
    o.extra_args = {"--option", "notify.outcomes=true"};
    return o;
  }
};

TEST_F(FaultStoppedTarget, ReadsWhatCameWhileItWasStoppedBeforeItJudgesItsPeer) {
  const PeerRegion r = peer_.Alloc(kMiB, "stopped");
  std::vector<xfer::RegionInfo> known;  // (current as of this call: the region is known here)
  XT_ASSERT_OK(engine_.GetRemoteRegions(peer_.name(), &known));
  LocalBuffer src(kMiB);
  src.Fill(8);
  peer_.Signal(SIGSTOP);
  xfer::TransferOptions o;
  o.notify = "while-stopped";
  xfer::RequestHandle h = 0;
  XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kWrite, {{src.addr(), r.addr, kMiB}}, 30s, o, &h));
  std::this_thread::sleep_for(std::chrono::milliseconds(3 * kHeartbeatTimeoutMs / 2));
  peer_.Signal(SIGCONT);
  const Outcome out = WaitFor(engine_, h, 20s);
  EXPECT_EQ(out.status.state, RequestState::kCompleted) << out.wait.ToString();
  EXPECT_EQ(peer_.SumRange(r.addr, kMiB), src.Hash());
  EXPECT_TRUE(peer_.Call("info " + engine_.LocalName()).ok) << "the target dropped its peer";
  const Reply got = peer_.Call("notifies");
  ASSERT_TRUE(got.ok) << got.line;
  EXPECT_EQ(got.u64(0), 1u) << got.line;
  EXPECT_NE(got.line.find(":while-stopped"), std::string::npos) << got.line;
  EXPECT_EQ(got.line.find('!'), std::string::npos) << "not completed: " << got.line;
}

TEST_F(FaultPeerFailure, DeregisterNotBlockedByHungPeer) {
  // The peer knows our region; then it freezes. Our DeregisterMem must not wait on it forever.
  LocalBuffer mine(kMiB);
  xfer::MemHandle h = 0;
  XT_ASSERT_OK(engine_.RegisterMem(mine.data(), mine.len(), xfer::MemType::kHost, &h, "ours"));
  Reply regions = peer_.Call("regions " + engine_.LocalName());
  ASSERT_TRUE(regions.ok && regions.u64(0) == 1) << regions.line;
  peer_.Signal(SIGSTOP);
  const auto t0 = Clock::now();
  ExpectDeregisterReturns(h, 10s);
  EXPECT_LT(SecondsSince(t0), kDetectSeconds + 1.0);
  peer_.Signal(SIGCONT);
}

TEST_F(FaultPeerFailure, InitiatorKilledWhileWritingIntoUs) {
  // Roles swapped: the peer writes into our memory and dies mid-way.
  constexpr uint64_t kLen = 64 * kMiB;
  LocalBuffer mine(kLen);
  xfer::MemHandle h = 0;
  XT_ASSERT_OK(engine_.RegisterMem(mine.data(), kLen, xfer::MemType::kHost, &h, "ours"));
  const uint64_t pbuf = peer_.Buf(kLen);
  ASSERT_NE(pbuf, 0u);
  Reply a = peer_.Call("axfer write " + engine_.LocalName() + " 60000 " + std::to_string(pbuf) + " " +
                       std::to_string(mine.addr()) + " " + std::to_string(kLen) + " 32");
  ASSERT_TRUE(a.ok) << a.line;
  std::this_thread::sleep_for(5ms);
  const std::string peer_name = peer_.name();
  peer_.KillNow();
  // Our engine drops the dead inbound peer, and our region can be deregistered promptly.
  EXPECT_TRUE(PollUntil(
      [&] {
        xfer::PeerInfo info;
        return !engine_.GetPeerInfo(peer_name, &info).ok();
      },
      std::chrono::milliseconds(static_cast<int>(kDetectSeconds * 1000))));
  ExpectDeregisterReturns(h, 10s);
  // And a new peer can still connect to us.
  PeerProcess next;
  std::string err;
  ASSERT_TRUE(next.Start(FastHeartbeat(), &err)) << err;
  Reply c = next.Call("connect " + engine_.LocalName() + " 10000");
  EXPECT_TRUE(c.ok) << c.line;
}

TEST_F(FaultPeerFailure, HealthySessionsOutliveManyHeartbeatTimeouts) {
  // No false alarms: an idle session, and one under heavy transfer load, both stay up for
  // 2.5 heartbeat timeouts.
  const std::string name = peer_.name();
  const PeerRegion r = peer_.Alloc(64 * kMiB, "busy");
  ASSERT_NE(r.addr, 0u);
  LocalBuffer src(64 * kMiB);
  src.Fill(6);
  const auto t0 = Clock::now();
  int transfers = 0;
  while (SecondsSince(t0) < 2.5) {
    if (SecondsSince(t0) > 1.2) {
      std::this_thread::sleep_for(50ms);  // idle half
      continue;
    }
    XT_ASSERT_OK(engine_.TransferSync(name, Op::kWrite, {{src.addr(), r.addr, src.len()}}, 30s));
    ++transfers;
  }
  EXPECT_TRUE(Connected(name)) << "a healthy peer was declared dead";
  Reply back = peer_.Call("info " + engine_.LocalName());
  EXPECT_TRUE(back.ok) << "the peer dropped our healthy session: " << back.line;
  XT_EXPECT_OK(engine_.TransferSync(name, Op::kRead, {{src.addr(), r.addr, 4096}}, 10s));
  EXPECT_GT(transfers, 0);
}

TEST_F(FaultPeerFailure, PeerExitsGracefullyDuringTransfer) {
  constexpr uint64_t kPiece = 64 * kMiB;
  const PeerRegion r = peer_.Alloc(kPiece, "leaving");
  ASSERT_NE(r.addr, 0u);
  LocalBuffer src(kPiece);
  src.Fill(7);
  std::vector<TransferDesc> d(32, TransferDesc{src.addr(), r.addr, kPiece});
  xfer::RequestHandle req = 0;
  XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kWrite, d, 60s, &req));
  const auto t0 = Clock::now();
  ASSERT_TRUE(peer_.Send("exit"));
  const Outcome o = WaitFor(engine_, req, 10s);
  ASSERT_NE(o.status.state, RequestState::kWaiting) << "request hung while its target left";
  if (o.status.state != RequestState::kCompleted) {
    EXPECT_EQ(o.status.state, RequestState::kFailed);
    EXPECT_EQ(o.wait.code(), StatusCode::kConnectionLost) << o.wait.ToString();
  }
  EXPECT_LT(SecondsSince(t0), kDetectSeconds);
  int status = 0;
  ASSERT_TRUE(peer_.WaitExit(20s, &status)) << "peer's Finalize hung with a peer writing into it";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "peer exit status " << status;
}

TEST_F(FaultPeerFailure, AutoConnectReachesRestartedPeer) {
  // With auto_connect, the first transfers after a restart reconnect by themselves.
  xfer::EngineOptions eo = LocalOptions();
  eo.auto_connect = true;
  eo.auto_connect_timeout = 2s;
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0", eo));
  const std::string name = peer_.name();
  const PeerRegion r0 = peer_.Alloc(4096);
  LocalBuffer src(4096);
  src.Fill(9);
  XT_ASSERT_OK(e.TransferSync(name, Op::kWrite, {{src.addr(), r0.addr, 4096}}, 5s));
  xfer::PeerInfo old;
  XT_ASSERT_OK(e.GetPeerInfo(name, &old));
  peer_.KillNow();
  PeerProcess fresh;
  ASSERT_NO_FATAL_FAILURE(StartAt(&fresh, name));
  const PeerRegion r = fresh.Alloc(4096);
  const auto t0 = Clock::now();
  xfer::Status s;
  while (!(s = e.TransferSync(name, Op::kWrite, {{src.addr(), r.addr, 4096}}, 5s)).ok()) {
    EXPECT_TRUE(s.code() == StatusCode::kConnectionLost || s.code() == StatusCode::kNotConnected ||
                s.code() == StatusCode::kRemoteAccessDenied)
        << s.ToString();
    ASSERT_LT(SecondsSince(t0), kDetectSeconds)
        << "auto-connect never reached the new peer: " << s.ToString();
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(fresh.Sum(r), src.Hash());
  xfer::PeerInfo info;
  XT_ASSERT_OK(e.GetPeerInfo(name, &info));
  EXPECT_NE(info.incarnation, old.incarnation);
}

TEST_F(FaultPeerFailure, TargetFinalizeStopsInitiatorWrites) {
  // The target's application frees or reuses its memory as soon as Finalize returns, so
  // Finalize must not return while a peer can still write into its regions. The target here
  // overwrites its region the moment Finalize returns; nothing may land after that.
  constexpr uint64_t kRegion = 4 * kMiB;
  LocalBuffer a(kRegion), b(kRegion);
  a.Fill(20);
  b.Fill(21);
  std::vector<TransferDesc> d;
  for (int i = 0; i < 256; ++i) d.push_back({(i % 2 ? b : a).addr(), 0, kRegion});
  LocalBuffer want(kRegion);
  want.Fill(22);
  for (int round = 0; round < 5; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    PeerProcess target;
    std::string err;
    ASSERT_TRUE(target.Start(FastHeartbeat(), &err)) << err;
    XT_ASSERT_OK(engine_.Connect(target.name(), 10s));
    const PeerRegion r = target.Alloc(kRegion, "finalized");
    ASSERT_NE(r.addr, 0u);
    for (auto& x : d) x.remote_addr = r.addr;
    xfer::RequestHandle req = 0;
    XT_ASSERT_OK(engine_.TransferAsync(target.name(), Op::kWrite, d, 60s, &req));
    std::this_thread::sleep_for(std::chrono::milliseconds(2 + round));
    const Reply fin =
        target.Call("finalize " + std::to_string(r.addr) + " " + std::to_string(kRegion) + " 22", 20s);
    ASSERT_TRUE(fin.ok) << fin.line;
    const Outcome o = WaitFor(engine_, req, 10s);
    ASSERT_NE(o.status.state, RequestState::kWaiting);
    std::this_thread::sleep_for(20ms);
    EXPECT_EQ(target.Sum(r), want.Hash())
        << "the initiator wrote into the target's memory after the target's Finalize returned "
           "(request ended "
        << xfer::RequestStateName(o.status.state) << ": " << o.wait.ToString() << ")";
    if (o.status.state != RequestState::kCompleted) {
      EXPECT_EQ(o.wait.code(), StatusCode::kConnectionLost) << o.wait.ToString();
    }
    if (HasFailure()) break;
  }
}

TEST_F(FaultPeerFailure, TargetDisconnectThenDeregisterStopsInitiatorWrites) {
  // The target hangs up on a writing initiator and then deregisters the region: once
  // DeregisterMem returned, nothing of the initiator's may land there.
  constexpr uint64_t kRegion = 4 * kMiB;
  LocalBuffer a(kRegion), b(kRegion);
  a.Fill(30);
  b.Fill(31);
  LocalBuffer want(kRegion);
  want.Fill(32);
  for (int round = 0; round < 5; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    PeerProcess target;
    std::string err;
    ASSERT_TRUE(target.Start(FastHeartbeat(), &err)) << err;
    XT_ASSERT_OK(engine_.Connect(target.name(), 10s));
    ASSERT_TRUE(PollUntil([&] { return target.Call("info " + engine_.LocalName()).ok; }, 5s));
    const PeerRegion r = target.Alloc(kRegion, "hungup");
    ASSERT_NE(r.addr, 0u);
    std::vector<TransferDesc> d;
    for (int i = 0; i < 256; ++i) d.push_back({(i % 2 ? b : a).addr(), r.addr, kRegion});
    xfer::RequestHandle req = 0;
    XT_ASSERT_OK(engine_.TransferAsync(target.name(), Op::kWrite, d, 60s, &req));
    std::this_thread::sleep_for(std::chrono::milliseconds(2 + round));
    ASSERT_TRUE(target.Send("disconnect " + engine_.LocalName()));
    ASSERT_TRUE(target.Send("dereg " + std::to_string(r.handle) + " 32"));
    const Reply disc = target.ReadReply(20s), dereg = target.ReadReply(20s);
    ASSERT_TRUE(disc.ok) << disc.line;
    ASSERT_TRUE(dereg.ok) << dereg.line;
    const Outcome o = WaitFor(engine_, req, 10s);
    ASSERT_NE(o.status.state, RequestState::kWaiting);
    std::this_thread::sleep_for(20ms);
    EXPECT_EQ(target.Sum(r), want.Hash())
        << "the initiator wrote into a region after the target disconnected it and "
           "DeregisterMem returned (request ended "
        << xfer::RequestStateName(o.status.state) << ": " << o.wait.ToString() << ")";
    if (HasFailure()) break;
  }
}

class FaultGraceful : public FaultPeerFailure {
 protected:
  // Default (3 s) heartbeat timeout on our side: prompt detection must come from the goodbye.
  xfer::EngineOptions LocalOptions() override { return {}; }
};

TEST_F(FaultGraceful, PeerExitSaysGoodbye) {
  const std::string name = peer_.name();
  const auto t0 = Clock::now();
  ASSERT_TRUE(peer_.Send("exit"));
  EXPECT_TRUE(PollUntil([&] { return !Connected(name); }, 5s));
  EXPECT_LT(SecondsSince(t0), 1.5) << "goodbye not noticed before the heartbeat timeout";
  int status = 0;
  ASSERT_TRUE(peer_.WaitExit(20s, &status)) << "peer did not exit";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "peer exit status " << status;
  LocalBuffer src(64);
  const xfer::Status s = engine_.TransferSync(name, Op::kWrite, {{src.addr(), 4096, 64}}, 5s);
  EXPECT_EQ(s.code(), StatusCode::kNotConnected) << s.ToString();
}

}  // namespace
}  // namespace xfer_test
