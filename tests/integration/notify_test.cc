// Notifications between real processes: each arrives after its request's data, on every
// transport, in the order the requests completed; none for a request that did not complete; a
// full queue refuses (never drops); and the per-descriptor results of requests that failed.
#include <csignal>
#include <cstdlib>
#include <thread>

#include "notified_stream.h"
#include "test_common.h"
#include "transport/common/cuda/cuda_api.h"

namespace xfer_test {
namespace {

using namespace std::chrono_literals;

// The watcher's counts, from the peer's "watched" reply.
struct Watched {
  uint64_t seen = 0, bad_data = 0, out_of_order = 0, reordered = 0, other = 0;
  std::string line;
};
Watched WatchedBy(PeerProcess& peer, uint64_t count) {
  const Reply r = peer.Call("watched " + std::to_string(count) + " 60000", 90s);
  EXPECT_TRUE(r.ok) << r.line;
  return {r.u64(0), r.u64(1), r.u64(2), r.u64(3), r.u64(4), r.line};
}

// ---------------------------------------------------------------- every transport
// How one transport is set up: the initiator's options, the target's, its memory, and the
// route (PeerInfo::moved) the bytes must have taken.
struct Setup {
  std::string name;
  std::string forced;           // EngineOptions::transport of the initiator
  bool staged = false;          // staging = always
  std::string region = "host";  // "host" (alloc), "shm" (AllocMem), "gpu" (cudaMalloc'd)
  std::string route;            // where the bytes must show in PeerInfo::moved
  bool ring = true;             // notifications through a same-host ring (else the session)
};

void PrintTo(const Setup& s, std::ostream* os) { *os << s.name; }

class NotifyOver : public PeerFixture, public ::testing::WithParamInterface<Setup> {
 protected:
  void SetUp() override {
    if (GetParam().region == "gpu") {
      std::string why;
      if (!xfer::transport::cuda::Available(&why)) GTEST_SKIP() << "no GPU: " << why;
    }
    if (GetParam().forced == "ucx") ::setenv("UCX_TLS", "tcp", 1);  // (the peer inherits it)
    PeerFixture::SetUp();
  }
  void TearDown() override { ::unsetenv("UCX_TLS"); }
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o;
    o.transport = GetParam().forced;
    o.streams = 4;
    o.tcp.links = 3;
    if (GetParam().staged) o.staging = xfer::Staging::kAlways;
    if (!GetParam().ring) o.notify.ring_bytes = 0;
    return o;
  }
  PeerOptions RemoteOptions() override {
    PeerOptions o;
    if (GetParam().forced == "ucx") o.extra_args = {"--ucx", "on"};
    return o;
  }
  PeerRegion Region(uint64_t len) {
    if (GetParam().region == "shm") return peer_.ShmAlloc(len);
    if (GetParam().region == "gpu") return peer_.DeviceAlloc(len, -1, "", true);
    return peer_.Alloc(len);
  }
  void ExpectRoute() {
    xfer::PeerInfo info;
    XT_ASSERT_OK(engine_.GetPeerInfo(peer_.name(), &info));
    EXPECT_GT(info.BytesVia(GetParam().route), 0u) << "the bytes did not go via " << GetParam().route;
  }
};

constexpr uint64_t kRequests = 10000, kBlock = 4096;

TEST_P(NotifyOver, EveryWriteNotificationFindsItsDataInPlace) {
  const PeerRegion r = Region(kRequests * kBlock);
  LocalBuffer src(kRequests * kBlock);
  ASSERT_TRUE(peer_.Call("watch").ok);
  const StreamResult res =
      RunNotifiedStream(engine_, peer_.name(), Op::kWrite, src.addr(), r.addr, {kBlock}, kRequests, 8);
  EXPECT_EQ(res.completed, kRequests) << res.first_error;
  const Watched w = WatchedBy(peer_, kRequests);
  EXPECT_EQ(w.seen, kRequests) << w.line;
  EXPECT_EQ(w.bad_data, 0u) << w.line;
  EXPECT_EQ(w.out_of_order, 0u) << w.line;
  ExpectRoute();
}

TEST_P(NotifyOver, EveryReadNotificationComesAfterTheDataLeft) {
  const PeerRegion r = Region(kRequests * kBlock);
  peer_.Fill(r, 7);
  LocalBuffer dst(kRequests * kBlock);
  ASSERT_TRUE(peer_.Call("watch").ok);  // overwrites each block as its notification arrives
  const StreamResult res =
      RunNotifiedStream(engine_, peer_.name(), Op::kRead, dst.addr(), r.addr, {kBlock}, kRequests, 8, 7);
  EXPECT_EQ(res.completed, kRequests) << res.first_error;
  EXPECT_EQ(res.bad_reads, 0u) << "a block was overwritten before its READ had finished";
  const Watched w = WatchedBy(peer_, kRequests);
  EXPECT_EQ(w.seen, kRequests) << w.line;
  EXPECT_EQ(w.out_of_order, 0u) << w.line;
  ExpectRoute();
}

INSTANTIATE_TEST_SUITE_P(
    Transports, NotifyOver,
    ::testing::Values(Setup{"shm", "", false, "shm", "shm"}, Setup{"cma", "cma", false, "host", "cma"},
                      Setup{"tcp", "tcp", false, "host", "tcp"},
                      Setup{"tcp_session", "tcp", false, "host", "tcp", false},
#ifdef XFER_TEST_UCX
                      Setup{"ucx", "ucx", false, "host", "ucx"},
#endif
                      Setup{"staged", "", true, "host", "staged"},
                      Setup{"Gpu", "", false, "gpu", "cuda"}),  // (device_check.sh runs "Gpu")
    [](const auto& info) { return info.param.name; });

// ---------------------------------------------------------------- order
class NotifyOrder : public PeerFixture {
 protected:
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o;
    o.transport = "tcp";
    o.streams = 4;
    o.tcp.links = 4;
    return o;
  }
};

// Large and small requests in flight together over four links and four streams: each
// notification is queued in the order its request completed, so never before that of a
// request the initiator had seen complete before it started this one (the watcher checks
// each against the one its message names). Whether small requests overtook large ones here
// (completion order, not submission order) is printed; it depends on the scheduling.
TEST_F(NotifyOrder, NoNotificationOvertakesAnEarlierCompletion) {
  const std::vector<uint64_t> sizes = {4 << 20, 4096, 4096, 4096, 4096, 4096, 4096, 4096};
  constexpr uint64_t kCount = 400;
  const PeerRegion r = peer_.Alloc(StreamBytes(sizes, kCount));
  LocalBuffer src(StreamBytes(sizes, kCount));
  ASSERT_TRUE(peer_.Call("watch").ok);
  const StreamResult res =
      RunNotifiedStream(engine_, peer_.name(), Op::kWrite, src.addr(), r.addr, sizes, kCount, 16);
  EXPECT_EQ(res.completed, kCount) << res.first_error;
  const Watched w = WatchedBy(peer_, kCount);
  EXPECT_EQ(w.seen, kCount) << w.line;
  EXPECT_EQ(w.bad_data, 0u) << w.line;
  EXPECT_EQ(w.out_of_order, 0u) << w.line;
  std::printf("notifications that overtook an earlier-started request's: %llu of %llu\n",
              static_cast<unsigned long long>(w.reordered), static_cast<unsigned long long>(w.seen));
}

// ---------------------------------------------------------------- refusals and endings
class Notifications : public PeerFixture {
 protected:
  PeerOptions RemoteOptions() override {
    PeerOptions o;
    o.extra_args = {"--notify-queue", "4"};
    o.heartbeat_timeout_ms = 10000;  // a target stopped for a while is not declared dead
    return o;
  }
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o;
    o.transport = "tcp";      // the target's own threads move the data: SIGSTOP holds it
    o.notify.ring_bytes = 0;  // over the session: the target's queue and its bounds
    o.heartbeat_timeout = 10s;
    o.streams = 1;
    o.tcp.links = 1;
    o.batch_bytes = 256 << 10;
    return o;
  }
  uint64_t Queued() { return peer_.Call("notifies").u64(0); }
};

TEST_F(Notifications, AFullQueueRefusesUntilDrainedAndTheDataStillLands) {
  for (int i = 0; i < 4; ++i) XT_ASSERT_OK(engine_.SendNotify(peer_.name(), "n" + std::to_string(i), 5s));
  XT_EXPECT_CODE(engine_.SendNotify(peer_.name(), "n4", 5s), StatusCode::kResourceExhausted);
  const PeerRegion r = peer_.Alloc(4 << 20);
  LocalBuffer src(4 << 20);
  src.Fill(3);
  std::vector<TransferDesc> d;
  for (uint64_t k = 0; k < 4; ++k) d.push_back({src.addr() + k * (1 << 20), r.addr + k * (1 << 20), 1 << 20});
  xfer::RequestStatus st;
  xfer::TransferOptions o;
  o.notify = "ready";
  XT_EXPECT_CODE(engine_.TransferSync(peer_.name(), Op::kWrite, d, 30s, o, &st),
                 StatusCode::kResourceExhausted);
  EXPECT_EQ(st.state, RequestState::kFailed);
  EXPECT_EQ(st.landed, (std::vector<uint64_t>{0, 1, 2, 3}))
      << "the data landed; only the notification was refused";
  EXPECT_EQ(peer_.Sum(r), src.Hash());
  const Reply got = peer_.Call("notifies");
  ASSERT_TRUE(got.ok) << got.line;
  ASSERT_EQ(got.u64(0), 4u) << got.line;
  EXPECT_NE(got.line.find(":n0 "), std::string::npos) << got.line;
  EXPECT_NE(got.line.find(":n3"), std::string::npos) << got.line;
  XT_EXPECT_OK(engine_.SendNotify(peer_.name(), "again", 5s));
  XT_EXPECT_OK(engine_.TransferSync(peer_.name(), Op::kWrite, d, 30s, o));
  EXPECT_EQ(Queued(), 2u);
}

// A request that times out or is canceled before its data moved delivers nothing, even once
// the target can take notifications again; the descriptors that did land are reported.
TEST_F(Notifications, NoNotificationForARequestThatTimedOutOrWasCanceled) {
  constexpr uint64_t kN = 64, kB = 256 << 10;  // a batch each (batch_bytes)
  const PeerRegion r = peer_.Alloc(kN * kB);
  std::vector<xfer::RegionInfo> known;
  XT_ASSERT_OK(engine_.GetRemoteRegions(peer_.name(), &known));  // before the target stops
  LocalBuffer src(kN * kB);
  src.Fill(5);
  std::vector<TransferDesc> d;
  for (uint64_t k = 0; k < kN; ++k) d.push_back({src.addr() + k * kB, r.addr + k * kB, kB});
  xfer::TransferOptions o;
  o.notify = "must-not-arrive";
  for (const bool cancel : {false, true}) {
    SCOPED_TRACE(cancel ? "cancel" : "deadline");
    peer_.Signal(SIGSTOP);
    xfer::RequestHandle h = 0;
    XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kWrite, d, cancel ? 30s : 300ms, o, &h));
    std::this_thread::sleep_for(100ms);
    if (cancel) XT_ASSERT_OK(engine_.Cancel(h));
    std::this_thread::sleep_for(300ms);
    peer_.Signal(SIGCONT);
    const Outcome out = WaitFor(engine_, h);
    EXPECT_EQ(out.status.state, cancel ? RequestState::kCanceled : RequestState::kTimeout)
        << out.status.status.ToString();
    // One link, one stream: most batches were dropped. Canceled: those already sent landed once
    // the target woke; past the deadline, their connection was given up.
    const auto& landed = out.status.landed;
    EXPECT_LT(landed.size(), kN);
    if (cancel) {
      EXPECT_TRUE(!landed.empty() && landed[0] == 0) << landed.size();
    }
    for (uint64_t k : landed) {
      EXPECT_EQ(peer_.SumRange(r.addr + k * kB, kB), Hash64(src.data() + k * kB, kB)) << k;
    }
    XT_ASSERT_OK(engine_.SendNotify(peer_.name(), "marker", 10s));  // ordered after anything sent before
    const Reply got = peer_.Call("notifies");
    EXPECT_EQ(got.u64(0), 1u) << got.line;
    EXPECT_EQ(got.line.find("must-not-arrive"), std::string::npos) << got.line;
  }
}

// A long request of one-descriptor batches (one link, one stream: they move in order) over a
// 64 MiB region, 128 times over (8 GiB): descriptor k writes block k % 256 with the same bytes
// each time. Moved polls until the initiator counted a few batches moved.
class LongRequest {
 public:
  static constexpr uint64_t kBlocks = 256, kB = 256 << 10, kN = 128 * kBlocks;
  explicit LongRequest(PeerProcess& peer) : region(peer.Alloc(kBlocks * kB)), src(kBlocks * kB) {
    src.Fill(11);
    for (uint64_t k = 0; k < kN; ++k)
      d.push_back({src.addr() + (k % kBlocks) * kB, region.addr + (k % kBlocks) * kB, kB});
  }
  static bool Moved(xfer::Engine& e, const std::string& peer, uint64_t bytes, uint64_t* seen) {
    const auto until = Clock::now() + 20s;
    xfer::PeerInfo info;
    while (Clock::now() < until) {
      if (e.GetPeerInfo(peer, &info).ok() && info.BytesVia("tcp") >= bytes) {
        *seen = info.BytesVia("tcp");
        return true;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return false;
  }
  PeerRegion region;
  LocalBuffer src;
  std::vector<TransferDesc> d;
};

// The descriptors reported landed after a deadline hold their data at the target, and are
// the first ones (in order), as many as had moved when the target stopped, or a few more.
TEST_F(Notifications, AfterADeadlineTheLandedDescriptorsAreThoseThatMoved) {
  LongRequest lr(peer_);
  xfer::RequestHandle h = 0;
  XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kWrite, lr.d, 3s, &h));
  uint64_t seen = 0;
  ASSERT_TRUE(LongRequest::Moved(engine_, peer_.name(), 4 * LongRequest::kB, &seen));
  peer_.Signal(SIGSTOP);  // the rest cannot move before the deadline
  const Outcome out = WaitFor(engine_, h);
  peer_.Signal(SIGCONT);
  ASSERT_EQ(out.status.state, RequestState::kTimeout) << out.status.status.ToString();
  const auto& landed = out.status.landed;
  ASSERT_GE(landed.size(), seen / LongRequest::kB);
  ASSERT_LT(landed.size(), LongRequest::kN);
  for (size_t k = 0; k < landed.size(); ++k) ASSERT_EQ(landed[k], k) << "one link, one stream: in order";
  for (uint64_t b = 0; b < std::min<uint64_t>(landed.size(), LongRequest::kBlocks); ++b) {
    ASSERT_EQ(peer_.SumRange(lr.region.addr + b * LongRequest::kB, LongRequest::kB),
              Hash64(lr.src.data() + b * LongRequest::kB, LongRequest::kB))
        << "block " << b;
  }
}

TEST_F(Notifications, AfterThePeerDiedTheLandedDescriptorsAreThoseThatMoved) {
  LongRequest lr(peer_);
  xfer::RequestHandle h = 0;
  xfer::TransferOptions o;
  o.notify = "never";
  XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kWrite, lr.d, 60s, o, &h));
  uint64_t seen = 0;
  ASSERT_TRUE(LongRequest::Moved(engine_, peer_.name(), 4 * LongRequest::kB, &seen));
  peer_.KillNow();
  const Outcome out = WaitFor(engine_, h);
  ASSERT_EQ(out.status.state, RequestState::kFailed) << out.status.status.ToString();
  EXPECT_EQ(out.status.status.code(), StatusCode::kConnectionLost);
  const auto& landed = out.status.landed;
  EXPECT_GE(landed.size(), seen / LongRequest::kB);
  EXPECT_LT(landed.size(), LongRequest::kN);
  for (size_t k = 0; k < landed.size(); ++k) ASSERT_EQ(landed[k], k) << "one link, one stream: in order";
}

TEST_F(Notifications, BadInputIsRefusedAndNothingIsSent) {
  XT_EXPECT_CODE(engine_.SendNotify(peer_.name(), std::string(4097, 'x'), 5s), StatusCode::kInvalidArgument);
  const PeerRegion r = peer_.Alloc(4096);
  LocalBuffer src(4096);
  xfer::TransferOptions big;
  big.notify = std::string(5000, 'y');
  XT_EXPECT_CODE(engine_.TransferSync(peer_.name(), Op::kWrite, {{src.addr(), r.addr, 4096}}, 5s, big),
                 StatusCode::kInvalidArgument);
  XT_EXPECT_CODE(engine_.SendNotify("127.0.0.1:1", "hi", 1s), StatusCode::kNotConnected);
  XT_EXPECT_CODE(engine_.GetNotifies(nullptr), StatusCode::kInvalidArgument);
  std::vector<xfer::Notification> none;
  const auto t0 = Clock::now();
  XT_EXPECT_CODE(engine_.WaitNotifies(&none, 50ms), StatusCode::kTimeout);
  EXPECT_LT(SecondsSince(t0), 5.0);
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(Queued(), 0u);
  XT_EXPECT_OK(engine_.SendNotify(peer_.name(), std::string(4096, 'z'), 5s));  // the limit itself is fine
  engine_.Finalize();
  XT_EXPECT_CODE(engine_.SendNotify(peer_.name(), "late", 1s), StatusCode::kInvalidArgument);
  XT_EXPECT_OK(engine_.GetNotifies(&none));  // what was queued stays readable
  XT_EXPECT_CODE(engine_.WaitNotifies(&none, 10s), StatusCode::kCanceled);
}

// ---------------------------------------------------------------- a peer that stops reading
// A target that stops reading its control connection (SIGSTOP) while 56 MB of notifications
// for it pile up: nothing blocks (not the callers, not the streams, not the control thread),
// another peer is served as usual meanwhile, and once the target reads again every request
// completes.
TEST(NotifyStalledPeer, OthersAreServedAndEverythingCompletesLater) {
  PeerProcess stalled, other;
  std::string err;
  PeerOptions po;
  // The stop lasts as long as submitting takes: seconds under ASan, half a minute on a busy
  // machine (at 30 s the session to the stopped peer ended midway, and the rest were refused).
  po.heartbeat_timeout_ms = 300000;
  ASSERT_TRUE(stalled.Start(po, &err)) << err;
  ASSERT_TRUE(other.Start(po, &err)) << err;
  xfer::Engine e;
  xfer::EngineOptions eo;
  eo.heartbeat_timeout = 300s;
  eo.notify.ring_bytes = 0;  // the notifications pile up in the control connection
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0", eo));
  XT_ASSERT_OK(e.Connect(stalled.name(), 10s));
  XT_ASSERT_OK(e.Connect(other.name(), 10s));
  const PeerRegion r = stalled.Alloc(4096);
  std::vector<xfer::RegionInfo> known;
  XT_ASSERT_OK(e.GetRemoteRegions(stalled.name(), &known));
  ASSERT_TRUE(stalled.Call("watch").ok);
  ASSERT_TRUE(PollUntil([&] { return other.Call("info " + e.LocalName()).ok; }, 5s));
  LocalBuffer src(8);
  constexpr int kN = 14000;  // x 4 KiB: more than the sockets between us hold (here ~36 MB)
  xfer::TransferOptions o;
  o.notify = std::string(4096, 'n');
  struct Resumed {  // (before the engine's end, which says goodbye to the peer, should an assert return)
    PeerProcess& peer;
    ~Resumed() { peer.Signal(SIGCONT); }
  } resumed{stalled};
  stalled.Signal(SIGSTOP);
  std::vector<xfer::RequestHandle> hs(kN);
  double longest = 0;  // one call's
  for (int i = 0; i < kN; ++i) {
    const auto t0 = Clock::now();
    XT_ASSERT_OK(e.TransferAsync(stalled.name(), Op::kWrite, {{src.addr(), r.addr, 8}}, 300s, o, &hs[i]));
    longest = std::max(longest, SecondsSince(t0));
  }
  EXPECT_LT(longest, 0.5) << "a TransferAsync call blocked on the stalled peer";
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    XT_EXPECT_OK(e.SendNotify(other.name(), "served", 5s));
    EXPECT_LT(SecondsSince(t0), 0.5) << "the other peer waited for the stalled one";
  }
  stalled.Signal(SIGCONT);
  int completed = 0;
  for (auto h : hs) completed += WaitFor(e, h).status.state == RequestState::kCompleted;
  EXPECT_EQ(completed, kN);
  const Watched w = WatchedBy(stalled, kN);
  EXPECT_EQ(w.other, static_cast<uint64_t>(kN)) << w.line;
  EXPECT_EQ(other.Call("notifies").u64(0), 5u);
}

// ---------------------------------------------------------------- same-host rings
// This engine's ring to the peer holds 4 KiB (36 notifications of 100 bytes, 112 a record).
class NotifyRings : public PeerFixture {
 protected:
  xfer::EngineOptions LocalOptions() override { return SmallRingOptions(); }
  PeerOptions RemoteOptions() override { return Stoppable({}); }
  static std::string Message(int i) {
    std::string m = "n" + std::to_string(i) + ":";
    return m + std::string(100 - m.size(), '.');
  }
};

// With the target stopped (SIGSTOP), notifications are still queued at it, at once, until its
// ring is full; then they go over the session and wait for it. Once it runs again it finds
// every one, in the order they were sent.
TEST_F(NotifyRings, WhileTheTargetIsStoppedTheyQueueInItsRingThenWait) {
  const PeerRegion r = peer_.ShmAlloc(1 << 20);
  std::vector<xfer::RegionInfo> known;
  XT_ASSERT_OK(engine_.GetRemoteRegions(peer_.name(), &known));
  // Over the session, after the ring's offer: once answered, the ring is open.
  XT_ASSERT_OK(engine_.SendNotify(peer_.name(), "first", 10s));
  peer_.Signal(SIGSTOP);
  for (int i = 0; i < 36; ++i) XT_ASSERT_OK(engine_.SendNotify(peer_.name(), Message(i), 10s));
  // The ring is full: the next one waits for the stopped target's answer.
  XT_EXPECT_CODE(engine_.SendNotify(peer_.name(), Message(36), 300ms), StatusCode::kTimeout);
  LocalBuffer src(1 << 20);
  src.Fill(4);
  xfer::TransferOptions o;
  o.notify = Message(37);
  xfer::RequestHandle h = 0;
  XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kWrite, {{src.addr(), r.addr, 1 << 20}}, 30s, o, &h));
  std::this_thread::sleep_for(100ms);
  xfer::RequestStatus st;
  XT_ASSERT_OK(engine_.GetTransferStatus(h, &st));
  EXPECT_EQ(st.state, RequestState::kWaiting) << "completed while the target could queue nothing";
  peer_.Signal(SIGCONT);
  const Outcome out = WaitFor(engine_, h);
  EXPECT_EQ(out.status.state, RequestState::kCompleted) << out.status.status.ToString();
  EXPECT_EQ(peer_.Sum(r), src.Hash());
  const Reply got = peer_.Call("notifies");
  ASSERT_TRUE(got.ok) << got.line;
  ASSERT_EQ(got.u64(0), 39u) << got.line;
  size_t at = got.line.find(":first ");
  for (int i = 0; i < 38 && at != std::string::npos; ++i) {
    const size_t next = got.line.find(":n" + std::to_string(i) + ":");
    EXPECT_GT(next, at) << "n" << i << " out of order: " << got.line;
    at = next;
  }
  XT_EXPECT_OK(engine_.SendNotify(peer_.name(), "again", 5s));  // through the ring again
  EXPECT_EQ(peer_.Call("notifies").u64(0), 1u);
}

// A peer that writes nonsense into its ring to us loses its session; this engine serves on.
// (Both with the default limits: a peer whose messages may be larger than this engine takes
// is refused its ring, and its notifications go over the session.) The nonsense: a write index
// no ring can have; or, in a ring that carries requests' beginnings and ends (this engine
// asked for outcomes), a record of a kind that does not exist.
struct Garbling {
  std::string name;
  std::string command;  // the peer's
  bool outcomes = false;
};
void PrintTo(const Garbling& g, std::ostream* os) { *os << g.name; }
class NotifyGarbledRing : public PeerFixture, public ::testing::WithParamInterface<Garbling> {
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o;
    o.notify.outcomes = GetParam().outcomes;
    return o;
  }
};
TEST_P(NotifyGarbledRing, ClosesItsSessionOnly) {
  ASSERT_TRUE(peer_.Call("notify " + engine_.LocalName() + " 10000 before").ok);  // (the ring opens)
  ASSERT_TRUE(peer_.Call("notify " + engine_.LocalName() + " 10000 in-ring").ok);
  std::vector<xfer::Notification> got;
  while (got.size() < 2) XT_ASSERT_OK(engine_.WaitNotifies(&got, 10s));
  EXPECT_EQ(got[1].message, "in-ring");
  const Reply garbled = peer_.Call(GetParam().command);
  ASSERT_TRUE(garbled.ok) << garbled.line;
  ASSERT_GE(garbled.u64(0), 1u) << "the peer has no ring to garble";
  got.clear();
  XT_EXPECT_OK(engine_.GetNotifies(&got));
  EXPECT_TRUE(got.empty()) << got[0].message;
  xfer::PeerInfo info;
  EXPECT_TRUE(PollUntil([&] { return !engine_.GetPeerInfo(peer_.name(), &info).ok(); }, 10s))
      << "the session with the peer that garbled its ring is still up";
  PeerProcess other;
  std::string err;
  ASSERT_TRUE(other.Start({}, &err)) << err;
  XT_ASSERT_OK(engine_.Connect(other.name(), 10s));
  XT_EXPECT_OK(engine_.SendNotify(other.name(), "still serving", 10s));
  EXPECT_EQ(other.Call("notifies").u64(0), 1u);
  ASSERT_TRUE(other.Call("notify " + engine_.LocalName() + " 10000 still-heard").ok);
  got.clear();
  XT_ASSERT_OK(engine_.WaitNotifies(&got, 10s));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].message, "still-heard");
}
INSTANTIATE_TEST_SUITE_P(Nonsense, NotifyGarbledRing,
                         ::testing::Values(Garbling{"index", "garble_notify_rings", false},
                                           Garbling{"record_of_no_kind", "garble_notify_records", true}),
                         [](const auto& info) { return info.param.name; });

class NotifyRingFromPeer : public PeerFixture {};

// Two threads wait at once; one gives up (its timeout) while the other still waits: the next
// notification from the peer's ring still wakes the one that waits.
TEST_F(NotifyRingFromPeer, AWaiterLeavingDoesNotLeaveTheOtherAsleep) {
  ASSERT_TRUE(peer_.Call("notify " + engine_.LocalName() + " 10000 opens-the-ring").ok);
  std::vector<xfer::Notification> got;
  XT_ASSERT_OK(engine_.WaitNotifies(&got, 10s));
  double waited = 0;
  std::vector<xfer::Notification> mine;
  std::thread patient([&] {
    const auto t0 = Clock::now();
    XT_EXPECT_OK(engine_.WaitNotifies(&mine, 20s));  // (a wake-up lost shows as the whole 20 s)
    waited = SecondsSince(t0);
  });
  std::this_thread::sleep_for(100ms);
  std::vector<xfer::Notification> none;
  XT_EXPECT_CODE(engine_.WaitNotifies(&none, 300ms), StatusCode::kTimeout);  // asleep, then gone
  ASSERT_TRUE(peer_.Call("notify " + engine_.LocalName() + " 10000 one").ok);
  patient.join();
  ASSERT_EQ(mine.size(), 1u);
  EXPECT_EQ(mine[0].message, "one");
  EXPECT_LT(waited, 15.0) << "the waiter slept through the notification";
}

// ---------------------------------------------------------------- this process as the target
TEST(NotifyTarget, ANotificationToItselfIsQueuedAtOnce) {
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0"));
  XT_ASSERT_OK(e.SendNotify(e.LocalName(), "me", 1s));
  std::vector<xfer::Notification> got;
  XT_ASSERT_OK(e.WaitNotifies(&got, 1s));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].sender, e.LocalName());
  EXPECT_EQ(got[0].message, "me");
}

// What a same-host peer's ring holds is queued past the queue's bounds, but once: moved into a
// full queue, it stays full until the application takes notifications, so a sender that goes
// on sending is refused instead of filling its ring into the queue again and again; nor does a
// new session bring a new ring while the queue is full.
TEST(NotifyTarget, ARingCannotFillAFullQueueAgainAndAgain) {
  xfer::EngineOptions to = SmallRingOptions();
  to.notify.queue_messages = 16;
  to.notify.queue_bytes = 8192;
  xfer::Engine target, sender;
  XT_ASSERT_OK(target.Initialize("127.0.0.1:0", to));
  XT_ASSERT_OK(sender.Initialize("127.0.0.1:0", SmallRingOptions()));
  std::vector<std::string> queued;
  for (int session = 0; session < 2; ++session) {
    XT_ASSERT_OK(sender.Connect(target.LocalName(), 10s));
    for (int i = 0; i < 1000; ++i) {
      const std::string m = "m" + std::to_string(session) + "." + std::to_string(i);
      const xfer::Status s = sender.SendNotify(target.LocalName(), m, 10s);
      if (s.ok())
        queued.push_back(m);
      else
        ASSERT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
    }
    XT_ASSERT_OK(sender.Disconnect(target.LocalName()));
  }
  XT_ASSERT_OK(sender.Connect(target.LocalName(), 10s));
  // At most the bounds and one ring of the shortest records (16 bytes of its 4096 each).
  EXPECT_LE(queued.size(), 16u + 4096 / 16) << "the ring was moved into the full queue again and again";
  std::vector<xfer::Notification> got;
  XT_ASSERT_OK(target.GetNotifies(&got));
  ASSERT_EQ(got.size(), queued.size());
  for (size_t k = 0; k < got.size(); ++k) EXPECT_EQ(got[k].message, queued[k]);
  XT_EXPECT_OK(sender.SendNotify(target.LocalName(), "again", 10s));  // (taken: room again)
  XT_ASSERT_OK(target.GetNotifies(&got));
  EXPECT_EQ(got.back().message, "again");
}

// What a dead sender queued stays readable, its request that was cut short sends nothing, and
// its successor on the same address is told apart by its incarnation.
TEST(NotifyTarget, ADeadSendersNotificationsStayAndARestartedOneIsToldApart) {
  xfer::Engine target;
  XT_ASSERT_OK(target.Initialize("127.0.0.1:0"));
  LocalBuffer mem(64 << 20);
  xfer::MemHandle h = 0;
  XT_ASSERT_OK(target.RegisterMem(mem.data(), mem.len(), xfer::MemType::kHost, &h));
  const std::string name = "127.0.0.1:" + std::to_string(UnusedPort());
  std::vector<xfer::Notification> got;
  for (int life = 0; life < 2; ++life) {
    PeerProcess sender;
    std::string err;
    PeerOptions po;
    po.name = name;
    po.extra_args = {"--transport", "tcp"};
    ASSERT_TRUE(sender.Start(po, &err)) << err;
    ASSERT_TRUE(sender.Call("connect " + target.LocalName()).ok);
    const uint64_t src = sender.Alloc(64 << 20).addr;
    ASSERT_TRUE(sender
                    .Call("xfer write " + target.LocalName() + " 30000 " + std::to_string(src) + " " +
                          std::to_string(mem.addr()) + " 4096 1 before" + std::to_string(life))
                    .ok);
    // 4 GiB, then death a moment in: that request's notification must never come.
    ASSERT_TRUE(sender
                    .Call("axfer write " + target.LocalName() + " 60000 " + std::to_string(src) + " " +
                          std::to_string(mem.addr()) + " " + std::to_string(64 << 20) + " 64 cut-short")
                    .ok);
    std::this_thread::sleep_for(50ms);
    sender.KillNow();
  }
  std::this_thread::sleep_for(500ms);
  XT_ASSERT_OK(target.GetNotifies(&got));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].message, "before0");
  EXPECT_EQ(got[1].message, "before1");
  EXPECT_EQ(got[0].sender, name);
  EXPECT_EQ(got[1].sender, name);
  EXPECT_NE(got[0].sender_incarnation, got[1].sender_incarnation);
}

}  // namespace
}  // namespace xfer_test
