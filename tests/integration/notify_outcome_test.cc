// Failure notifications between real processes (EngineOptions::notify.outcomes): on every
// transport, a notified request that times out, is canceled or fails at the target tells the
// target how it ended, with the descriptors that landed, once, in order with completed ones;
// an unnotified one tells nothing.
#include <algorithm>
#include <sstream>
#include <thread>

#include "raw_peer.h"
#include "test_common.h"

namespace xfer_test {
namespace {

using namespace std::chrono_literals;

// One notification as the peer's "notifies" reply spells it.
struct Told {
  std::string message;
  std::string outcome = "COMPLETED";
  std::vector<uint64_t> landed;
};

// Takes what the peer has queued: "OK <n> <sender>#<inc>:<message>[!<OUTCOME>:<i,j,...>] ...".
std::vector<Told> TakeNotifies(PeerProcess& peer) {
  const Reply r = peer.Call("notifies");
  EXPECT_TRUE(r.ok) << r.line;
  std::vector<Told> out;
  for (size_t w = 1; w < r.words.size(); ++w) {
    const std::string& word = r.words[w];
    std::string text = word.substr(word.find(':', word.find('#')) + 1);
    Told t;
    const size_t bang = text.find('!');
    t.message = text.substr(0, bang);
    if (bang != std::string::npos) {
      const std::string rest = text.substr(bang + 1);
      const size_t colon = rest.find(':');
      t.outcome = rest.substr(0, colon);
      std::stringstream list(rest.substr(colon + 1));
      for (std::string i; std::getline(list, i, ',');) t.landed.push_back(std::stoull(i));
    }
    out.push_back(std::move(t));
  }
  EXPECT_EQ(out.size(), r.u64(0)) << r.line;
  return out;
}

struct Setup {
  std::string name;
  std::string forced;  // EngineOptions::transport of the initiator
  bool staged = false;
  std::string region = "host";  // "host" or "shm" (AllocMem)
  bool ring = true;             // completed requests' notifications through a same-host ring
};
void PrintTo(const Setup& s, std::ostream* os) { *os << s.name; }

class NotifyOutcomes : public PeerFixture, public ::testing::WithParamInterface<Setup> {
 protected:
  // A request far too long to finish in time: 32768 descriptors of 256 KiB (8 GiB) over a
  // 64 MiB region, block k % 256 written with the same bytes each time.
  static constexpr uint64_t kBlocks = 256, kB = 256 << 10, kN = 128 * kBlocks;

  void SetUp() override {
    if (GetParam().forced == "ucx") ::setenv("UCX_TLS", "tcp", 1);  // (the peer inherits it)
    PeerFixture::SetUp();
    src_ = std::make_unique<LocalBuffer>(kBlocks * kB);
    src_->Fill(21);
  }
  void TearDown() override { ::unsetenv("UCX_TLS"); }
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o;
    o.transport = GetParam().forced;
    o.streams = 2;
    o.batch_bytes = kB;
    if (GetParam().staged) o.staging = xfer::Staging::kAlways;
    if (!GetParam().ring) o.notify.ring_bytes = 0;
    return o;
  }
  PeerOptions RemoteOptions() override { return OutcomesTarget(GetParam().forced); }
  PeerRegion Region() {
    return GetParam().region == "shm" ? peer_.ShmAlloc(kBlocks * kB) : peer_.Alloc(kBlocks * kB);
  }
  std::vector<TransferDesc> Long(const PeerRegion& r) const {
    std::vector<TransferDesc> d;
    for (uint64_t k = 0; k < kN; ++k)
      d.push_back({src_->addr() + (k % kBlocks) * kB, r.addr + (k % kBlocks) * kB, kB});
    return d;
  }
  xfer::RequestHandle Start(const std::vector<TransferDesc>& d, std::chrono::milliseconds t,
                            std::optional<std::string> notify) {
    xfer::TransferOptions o;
    o.notify = std::move(notify);
    xfer::RequestHandle h = 0;
    EXPECT_TRUE(engine_.TransferAsync(peer_.name(), Op::kWrite, d, t, o, &h).ok());
    return h;
  }
  // The blocks of the landed descriptors hold the source's bytes.
  void ExpectLandedInPlace(const PeerRegion& r, const std::vector<uint64_t>& landed) {
    std::vector<bool> checked(kBlocks);
    for (uint64_t k : landed) {
      if (checked[k % kBlocks]) continue;
      checked[k % kBlocks] = true;
      ASSERT_EQ(peer_.SumRange(r.addr + (k % kBlocks) * kB, kB),
                Hash64(src_->data() + (k % kBlocks) * kB, kB))
          << "descriptor " << k;
    }
  }
  std::unique_ptr<LocalBuffer> src_;
};

TEST_P(NotifyOutcomes, EachRequestThatDidNotCompleteTellsTheTargetOnceInOrder) {
  const PeerRegion r = Region();
  const std::vector<TransferDesc> d = Long(r);
  const std::vector<TransferDesc> one = {d[0]};
  xfer::TransferOptions first;
  first.notify = "first";
  XT_ASSERT_OK(engine_.TransferSync(peer_.name(), Op::kWrite, one, 30s, first));

  const Outcome timed_out = WaitFor(engine_, Start(d, 50ms, "timed-out"));
  ASSERT_EQ(timed_out.status.state, RequestState::kTimeout) << timed_out.status.status.ToString();
  const Outcome unnotified = WaitFor(engine_, Start(d, 50ms, std::nullopt));
  ASSERT_EQ(unnotified.status.state, RequestState::kTimeout) << unnotified.status.status.ToString();
  const xfer::RequestHandle h = Start(d, 60s, "canceled");
  std::this_thread::sleep_for(20ms);
  XT_ASSERT_OK(engine_.Cancel(h));
  const Outcome canceled = WaitFor(engine_, h);
  ASSERT_EQ(canceled.status.state, RequestState::kCanceled) << canceled.status.status.ToString();

  xfer::TransferOptions last;
  last.notify = "last";
  XT_ASSERT_OK(engine_.TransferSync(peer_.name(), Op::kWrite, one, 30s, last));
  const std::vector<Told> told = TakeNotifies(peer_);
  ASSERT_EQ(told.size(), 4u);
  EXPECT_EQ(told[0].message, "first");
  EXPECT_EQ(told[0].outcome, "COMPLETED");
  EXPECT_EQ(told[1].message, "timed-out");
  EXPECT_EQ(told[1].outcome, "TIMED_OUT");
  EXPECT_EQ(told[1].landed, timed_out.status.landed);
  EXPECT_EQ(told[2].message, "canceled");
  EXPECT_EQ(told[2].outcome, "CANCELED");
  EXPECT_EQ(told[2].landed, canceled.status.landed);
  EXPECT_EQ(told[3].message, "last");
  EXPECT_EQ(told[3].outcome, "COMPLETED");
  EXPECT_TRUE(told[3].landed.empty());
  ExpectLandedInPlace(r, told[1].landed);
  ExpectLandedInPlace(r, told[2].landed);
}

// The target deregisters (frees) the region while a notified request writes into it: the request
// fails, and the target hears of it with what landed before.
TEST_P(NotifyOutcomes, ARequestTheTargetRefusedMidwayTellsItWhatLanded) {
  const PeerRegion r = Region();
  const xfer::RequestHandle h = Start(Long(r), 60s, "refused");
  std::this_thread::sleep_for(20ms);
  const char* const release = GetParam().region == "shm" ? "free " : "dereg ";  // (AllocMem: FreeMem)
  const Reply dereg = peer_.Call(release + std::to_string(r.handle), 60s);
  ASSERT_TRUE(dereg.ok) << dereg.line;
  const Outcome refused = WaitFor(engine_, h);
  ASSERT_EQ(refused.status.state, RequestState::kFailed) << refused.status.status.ToString();
  EXPECT_EQ(refused.status.status.code(), StatusCode::kRemoteAccessDenied)
      << refused.status.status.ToString();
  ASSERT_TRUE(PollUntil([&] { return peer_.Call("metric xfer_notifications_queued").u64(0) == 1; }, 10s));
  const std::vector<Told> told = TakeNotifies(peer_);
  ASSERT_EQ(told.size(), 1u);
  EXPECT_EQ(told[0].message, "refused");
  EXPECT_EQ(told[0].outcome, "FAILED");
  EXPECT_EQ(told[0].landed, refused.status.landed);
  EXPECT_LT(told[0].landed.size(), kN);
}

INSTANTIATE_TEST_SUITE_P(Transports, NotifyOutcomes,
                         ::testing::Values(Setup{"shm", "", false, "shm"}, Setup{"cma", "cma"},
                                           Setup{"tcp", "tcp"},
                                           Setup{"tcp_session", "tcp", false, "host", false},
#ifdef XFER_TEST_UCX
                                           Setup{"ucx", "ucx"},
#endif
                                           Setup{"staged", "", true}),
                         [](const auto& info) { return info.param.name; });

// ---------------------------------------------------------------- through a same-host ring
// With the target stopped (SIGSTOP), notified requests to it begin and end in its ring: each
// completes at once, a timed-out one tells its outcome there too (the requests after it do not
// wait), until the ring is full; then they begin or end over the session, and wait. Once the
// target runs again it finds every one, once, in the order they ended.
class NotifyOutcomeRing : public PeerFixture {
 protected:
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o = SmallRingOptions();
    o.batch_bytes = 256 << 10;
    return o;
  }
  PeerOptions RemoteOptions() override { return Stoppable(OutcomesTarget("")); }
};

TEST_F(NotifyOutcomeRing, WhileTheTargetIsStoppedRequestsBeginAndEndInItsRing) {
  constexpr uint64_t kLen = 64 << 20;
  const PeerRegion r = peer_.ShmAlloc(kLen);
  LocalBuffer src(kLen);
  src.Fill(6);
  XT_ASSERT_OK(engine_.SendNotify(peer_.name(), "first", 10s));  // (answered: the ring is open)
  peer_.Signal(SIGSTOP);
  std::vector<std::string> sent = {"first"};
  auto notified = [&](const std::string& message) {
    xfer::TransferOptions o;
    o.notify = message;
    sent.push_back(message);
    return o;
  };
  for (int i = 0; i < 10; ++i) {
    const std::string m = "c" + std::to_string(i);
    const xfer::Status done =
        engine_.TransferSync(peer_.name(), Op::kWrite, {{src.addr(), r.addr, 4096}}, 5s, notified(m));
    ASSERT_TRUE(done.ok()) << m << " waited for the stopped target: " << done.ToString();
  }
  // 8 GiB in 128 descriptors, far past its deadline: its end, with a short landed list, fits
  // in the ring.
  const std::vector<TransferDesc> long_request(128, {src.addr(), r.addr, kLen});
  xfer::RequestHandle h = 0;
  XT_ASSERT_OK(
      engine_.TransferAsync(peer_.name(), Op::kWrite, long_request, 30ms, notified("timed-out"), &h));
  const Outcome timed_out = WaitFor(engine_, h);
  ASSERT_EQ(timed_out.status.state, RequestState::kTimeout) << timed_out.status.status.ToString();
  std::vector<xfer::RequestHandle> waiting;  // (until the ring is full: then one waits)
  for (int i = 0; waiting.empty() && i < 200; ++i) {
    XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kWrite, {{src.addr(), r.addr, 64}}, 30s,
                                       notified("f" + std::to_string(i)), &h));
    const Outcome f = WaitFor(engine_, h, 200ms);
    if (f.wait.code() == StatusCode::kTimeout) waiting.push_back(h);
  }
  ASSERT_EQ(waiting.size(), 1u) << "the ring never filled";
  const size_t after_it = sent.size() - (std::find(sent.begin(), sent.end(), "timed-out") - sent.begin()) - 1;
  EXPECT_GT(after_it, 4u) << "the requests after the timed-out one waited: its end went over the session";
  xfer::TransferOptions more;
  more.notify = "over-the-session";
  sent.push_back("over-the-session");
  XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kWrite, {{src.addr(), r.addr, 64}}, 30s, more, &h));
  waiting.push_back(h);
  peer_.Signal(SIGCONT);
  for (xfer::RequestHandle w : waiting) {
    const Outcome out = WaitFor(engine_, w);
    EXPECT_EQ(out.status.state, RequestState::kCompleted) << out.status.status.ToString();
  }
  const std::vector<Told> told = TakeNotifies(peer_);
  ASSERT_EQ(told.size(), sent.size());
  for (size_t k = 0; k < sent.size(); ++k) {
    EXPECT_EQ(told[k].message, sent[k]) << "notification " << k;
    EXPECT_EQ(told[k].outcome, sent[k] == "timed-out" ? "TIMED_OUT" : "COMPLETED") << sent[k];
  }
  const auto t = std::find(sent.begin(), sent.end(), "timed-out") - sent.begin();
  EXPECT_EQ(told[t].landed, timed_out.status.landed);
  EXPECT_TRUE(TakeNotifies(peer_).empty()) << "a notification too many";
}

// While the target is stopped, a request whose beginning goes over the session (its record
// does not fit in what is left of the ring), then one begun in the ring; then the target runs
// and the session ends: the target reads the ring before the first one's beginning, yet
// reports both lost in the order they began.
TEST_F(NotifyOutcomeRing, LostRequestsComeInTheOrderTheyBeganWhicheverWayTheyBegan) {
  constexpr uint64_t kLen = 64 << 20;
  const PeerRegion r = peer_.ShmAlloc(kLen);
  LocalBuffer src(kLen);
  XT_ASSERT_OK(engine_.SendNotify(peer_.name(), "first", 10s));  // (answered: the ring is open)
  ASSERT_EQ(TakeNotifies(peer_).size(), 1u);                     // (its ring is empty now)
  peer_.Signal(SIGSTOP);
  // 252 records of 16 bytes leave 64 of the ring's 4096: room for the beginning of "B" (24
  // bytes), not for that of a 60-byte message (80).
  for (int i = 0; i < 252; ++i)
    XT_ASSERT_OK(engine_.SendNotify(peer_.name(), "f" + std::to_string(i % 10), 5s));
  const std::vector<TransferDesc> long_request(1024, {src.addr(), r.addr, kLen});  // 64 GiB
  xfer::RequestHandle h1 = 0, h2 = 0;
  xfer::TransferOptions over_session, in_ring;
  over_session.notify = std::string(60, 'A');
  in_ring.notify = "B";
  XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kWrite, long_request, 30s, over_session, &h1));
  XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kWrite, long_request, 30s, in_ring, &h2));
  peer_.Signal(SIGCONT);
  XT_ASSERT_OK(engine_.Disconnect(peer_.name()));
  std::vector<Told> told;
  ASSERT_TRUE(PollUntil(
      [&] {
        for (Told& t : TakeNotifies(peer_)) told.push_back(std::move(t));
        return told.size() >= 254;
      },
      10s))
      << told.size() << " notifications, the last " << told.back().message << " " << told.back().outcome;
  ASSERT_EQ(told.size(), 254u);
  EXPECT_EQ(told[252].message, over_session.notify);
  EXPECT_EQ(told[252].outcome, "INITIATOR_LOST");
  EXPECT_EQ(told[253].message, "B");
  EXPECT_EQ(told[253].outcome, "INITIATOR_LOST");
}

// This engine as the target, asking for outcomes; the peer process connects to it.
class OutcomesTargetHere : public PeerFixture {
 protected:
  bool ConnectInSetUp() override { return false; }
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o;
    o.notify.outcomes = true;
    return o;
  }
};

// A request whose beginning comes over the session (too long for the ring) after the peer
// garbled its ring: the target finds the ring inconsistent as it reads it first, closes the
// session, and still reports that request lost, as any other it was told of.
class NotifyBeginBesideAGarbledRing : public OutcomesTargetHere {
 protected:
  // A ring of 4096 bytes carries messages of up to 2040 bytes; the beginning of one that long
  // does not fit in it.
  PeerOptions RemoteOptions() override {
    PeerOptions o;
    o.extra_args = {"--option", "notify.ring_bytes=4096", "--option", "notify.max_message_bytes=2040"};
    return o;
  }
};

TEST_F(NotifyBeginBesideAGarbledRing, IsReportedLost) {
  constexpr uint64_t kB = 256 << 10;
  LocalBuffer region(64 << 20);
  xfer::MemHandle h = 0;
  XT_ASSERT_OK(engine_.RegisterMem(region.data(), region.len(), xfer::MemType::kHost, &h));
  const PeerRegion src = peer_.Alloc(kB);
  ASSERT_TRUE(peer_.Call("connect " + engine_.LocalName() + " 10000").ok);
  ASSERT_TRUE(peer_.Call("notify " + engine_.LocalName() + " 10000 before").ok);  // (the ring opens)
  std::vector<xfer::Notification> got;
  XT_ASSERT_OK(engine_.WaitNotifies(&got, 10s));
  const Reply garbled = peer_.Call("garble_notify_rings");
  ASSERT_TRUE(garbled.ok) << garbled.line;
  ASSERT_GE(garbled.u64(0), 1u) << "the peer has no ring to garble";
  const std::string message(2040, 'L');
  const Reply r =
      peer_.Call("axfer write " + engine_.LocalName() + " 60000 " + std::to_string(src.addr) + " " +
                 std::to_string(region.addr()) + " " + std::to_string(kB) + " 32768 " + message);
  ASSERT_TRUE(r.ok) << r.line;
  // (Nothing here reads the ring meanwhile: the beginning's frame is what finds it garbled.)
  xfer::PeerInfo info;
  ASSERT_TRUE(PollUntil([&] { return !engine_.GetPeerInfo(peer_.name(), &info).ok(); }, 20s))
      << "the session with the peer that garbled its ring is still up";
  got.clear();
  XT_ASSERT_OK(engine_.GetNotifies(&got));
  ASSERT_EQ(got.size(), 1u) << "the request begun over the session was never reported";
  EXPECT_EQ(got[0].message, message);
  EXPECT_EQ(got[0].outcome, xfer::NotifyOutcome::kInitiatorLost);
}

// ---------------------------------------------------------------- the initiator lost
// This engine is the target; the peer process the initiator, killed with requests in flight.
class NotifyLost : public OutcomesTargetHere, public ::testing::WithParamInterface<Setup> {
 protected:
  static constexpr uint64_t kRegion = 64 << 20, kB = 256 << 10, kCount = 262144;  // 64 GiB a request

  PeerOptions RemoteOptions() override {
    PeerOptions o;
    o.extra_args = {"--streams", "2"};
    if (!GetParam().forced.empty())
      o.extra_args.insert(o.extra_args.end(), {"--transport", GetParam().forced});
    if (GetParam().staged) o.extra_args.insert(o.extra_args.end(), {"--staging", "always"});
    if (!GetParam().ring) o.extra_args.insert(o.extra_args.end(), {"--notify-ring", "0"});
    return o;
  }
  // The region the peer writes into: AllocMem memory for shm, registered memory otherwise.
  uint64_t Region() {
    xfer::MemHandle h = 0;
    if (GetParam().region == "shm") {
      void* p = nullptr;
      EXPECT_TRUE(engine_.AllocMem(kRegion, xfer::MemType::kHost, &p, &h).ok());
      return reinterpret_cast<uint64_t>(p);
    }
    registered_ = std::make_unique<LocalBuffer>(kRegion);
    EXPECT_TRUE(engine_.RegisterMem(registered_->data(), kRegion, xfer::MemType::kHost, &h).ok());
    return registered_->addr();
  }
  // Waits until `count` notifications have come, or 20 s passed.
  std::vector<xfer::Notification> Await(size_t count) {
    std::vector<xfer::Notification> got;
    const auto until = Clock::now() + 20s;
    while (got.size() < count && Clock::now() < until) (void)engine_.WaitNotifies(&got, 1s);
    return got;
  }
  std::unique_ptr<LocalBuffer> registered_;
};

TEST_P(NotifyLost, AKilledInitiatorsNotifiedRequestsEachEndAsLostInOrder) {
  const uint64_t region = Region();
  const PeerRegion src = peer_.Alloc(kB);
  ASSERT_TRUE(peer_.Call("connect " + engine_.LocalName() + " 10000").ok);
  const std::string to = engine_.LocalName(), at = " " + std::to_string(src.addr) + " ";
  auto xfer = [&](const char* cmd, uint64_t count, const std::string& message) {
    return peer_.Call(std::string(cmd) + " write " + to + " 60000" + at + std::to_string(region) + " " +
                      std::to_string(kB) + " " + std::to_string(count) +
                      (message.empty() ? "" : " " + message));
  };
  const Reply first = xfer("xfer", 1, "first");
  ASSERT_TRUE(first.ok) << first.line;
  for (const char* message : {"lost-1", "", "lost-2"}) {  // (the second one carries none)
    const Reply r = xfer("axfer", kCount, message);
    ASSERT_TRUE(r.ok) << r.line;
  }
  std::this_thread::sleep_for(50ms);  // (under way: bytes are moving)
  peer_.KillNow();
  const std::vector<xfer::Notification> got = Await(3);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].message, "first");
  EXPECT_EQ(got[0].outcome, xfer::NotifyOutcome::kCompleted);
  EXPECT_EQ(got[1].message, "lost-1");
  EXPECT_EQ(got[1].outcome, xfer::NotifyOutcome::kInitiatorLost);
  EXPECT_TRUE(got[1].landed.empty());
  EXPECT_EQ(got[2].message, "lost-2");
  EXPECT_EQ(got[2].outcome, xfer::NotifyOutcome::kInitiatorLost);
  EXPECT_EQ(got[1].sender_incarnation, got[0].sender_incarnation);
  std::vector<xfer::Notification> more;
  EXPECT_EQ(engine_.WaitNotifies(&more, 300ms).code(), StatusCode::kTimeout) << "a notification too many";

  // A restarted initiator at the same place is told apart by its incarnation.
  PeerProcess again;
  std::string err;
  ASSERT_TRUE(again.Start(RemoteOptions(), &err)) << err;
  const PeerRegion src2 = again.Alloc(kB);
  ASSERT_TRUE(again.Call("connect " + to + " 10000").ok);
  const Reply r = again.Call("xfer write " + to + " 60000 " + std::to_string(src2.addr) + " " +
                             std::to_string(region) + " " + std::to_string(kB) + " 1 again");
  ASSERT_TRUE(r.ok) << r.line;
  const std::vector<xfer::Notification> later = Await(1);
  ASSERT_EQ(later.size(), 1u);
  EXPECT_EQ(later[0].message, "again");
  EXPECT_NE(later[0].sender_incarnation, got[0].sender_incarnation);
}

// (Not ucx: without RDMA hardware UCX emulates put over TCP, and a killed initiator whose puts
// are still arriving can make UCX abort the target process, 1.13 and 1.22 alike:
// docs/transports.md, "ucx without RDMA hardware".)
INSTANTIATE_TEST_SUITE_P(Transports, NotifyLost,
                         ::testing::Values(Setup{"shm", "", false, "shm"}, Setup{"cma", "cma"},
                                           Setup{"tcp", "tcp"},
                                           Setup{"tcp_session", "tcp", false, "host", false},
                                           Setup{"staged", "", true}),
                         [](const auto& info) { return info.param.name; });

// ---------------------------------------------------------------- a full queue, a wrong peer
// A target whose queue is full when a notified request begins cannot hold its notification:
// the request still moves its data, then fails RESOURCE_EXHAUSTED with every descriptor landed,
// and the target hears nothing of it, as when a completed request's notification is refused.
TEST(NotifyOutcomeQueue, ARequestBegunWhileTheQueueIsFullFailsAfterItsData) {
  PeerProcess peer;
  std::string err;
  PeerOptions po;
  po.extra_args = {"--notify-queue", "4", "--option", "notify.outcomes=true"};
  ASSERT_TRUE(peer.Start(po, &err)) << err;
  xfer::Engine e;
  xfer::EngineOptions eo;
  eo.notify.ring_bytes = 0;  // (SendNotify's go into the target's queue, not a ring)
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0", eo));
  XT_ASSERT_OK(e.Connect(peer.name(), 10s));
  for (int k = 0; k < 4; ++k) XT_ASSERT_OK(e.SendNotify(peer.name(), "n" + std::to_string(k), 5s));
  const PeerRegion r = peer.Alloc(4 << 20);
  LocalBuffer src(4 << 20);
  src.Fill(3);
  std::vector<TransferDesc> d;
  for (uint64_t k = 0; k < 4; ++k) d.push_back({src.addr() + (k << 20), r.addr + (k << 20), 1 << 20});
  xfer::TransferOptions o;
  o.notify = "refused";
  xfer::RequestStatus st;
  XT_EXPECT_CODE(e.TransferSync(peer.name(), Op::kWrite, d, 30s, o, &st), StatusCode::kResourceExhausted);
  EXPECT_EQ(st.landed, (std::vector<uint64_t>{0, 1, 2, 3}))
      << "the data landed; only the notification was refused";
  EXPECT_EQ(peer.Sum(r), src.Hash());
  const std::vector<Told> told = TakeNotifies(peer);
  ASSERT_EQ(told.size(), 4u);
  EXPECT_EQ(told[3].message, "n3");
  o.notify = "again";
  XT_EXPECT_OK(e.TransferSync(peer.name(), Op::kWrite, d, 30s, o));  // (room again)
  const std::vector<Told> again = TakeNotifies(peer);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].message, "again");
  e.Finalize();
}

// A peer that sends begins and ends an engine cannot match: refused, nothing queued for them,
// the session goes on; each peer holds at most a quarter of the queue with begun requests,
// and what it held comes back (as kInitiatorLost) when its session ends.
TEST(NotifyOutcomeQueue, BeginsAndEndsThatDoNotMatchAreRefusedAndAPeerHoldsItsShareOnly) {
  namespace wire = xfer::wire;
  xfer::Engine target;
  xfer::EngineOptions o;
  o.notify.outcomes = true;
  o.notify.queue_messages = 8;  // a peer's share: 2
  XT_ASSERT_OK(target.Initialize("127.0.0.1:0", o));
  auto raw = std::make_unique<RawSession>(target.LocalName());
  ASSERT_FALSE(raw->Hello(HelloOf("10.9.8.7:6000", 0x5eed)).name.empty());
  auto answer = [&](uint64_t seq) {
    wire::Message m;
    for (auto until = Clock::now() + 5s; raw->s->ReadOne(until, &m).ok();) {
      if (auto* ack = std::get_if<wire::NotifyAck>(&m); ack && ack->seq == seq) return ack->code;
    }
    return StatusCode::kInternal;  // (none came)
  };
  raw->Send(wire::NotifyBegin{1, "a"});
  raw->Send(wire::NotifyBegin{1, "a twin"});                                 // (the same id: ignored)
  raw->Send(wire::NotifyEnded{1, 99, xfer::NotifyOutcome::kCompleted, {}});  // never begun
  EXPECT_EQ(answer(1), StatusCode::kResourceExhausted);
  raw->Send(wire::NotifyEnded{2, 1, xfer::NotifyOutcome::kFailed, {0}});
  EXPECT_EQ(answer(2), StatusCode::kOk);
  raw->Send(wire::NotifyEnded{3, 1, xfer::NotifyOutcome::kFailed, {0}});  // ended already
  EXPECT_EQ(answer(3), StatusCode::kResourceExhausted);
  for (uint64_t id = 10; id < 20; ++id) raw->Send(wire::NotifyBegin{id, "held-" + std::to_string(id)});
  raw->Send(wire::NotifyEnded{4, 12, xfer::NotifyOutcome::kCompleted, {}});  // past its share: not held
  EXPECT_EQ(answer(4), StatusCode::kResourceExhausted);
  std::vector<xfer::Notification> got;
  XT_ASSERT_OK(target.GetNotifies(&got));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].message, "a");
  EXPECT_EQ(got[0].outcome, xfer::NotifyOutcome::kFailed);
  EXPECT_EQ(got[0].landed, (std::vector<uint64_t>{0}));
  raw.reset();  // the session ends: what it held is queued as lost
  std::vector<xfer::Notification> lost;
  for (auto until = Clock::now() + 10s; lost.size() < 2 && Clock::now() < until;)
    (void)target.WaitNotifies(&lost, 1s);
  ASSERT_EQ(lost.size(), 2u);
  EXPECT_EQ(lost[0].message, "held-10");
  EXPECT_EQ(lost[0].outcome, xfer::NotifyOutcome::kInitiatorLost);
  EXPECT_EQ(lost[1].message, "held-11");
  // Every place is back: one sender takes its most, seven, and the eighth is refused as past
  // its part, not because the queue is full.
  for (int k = 0; k < 7; ++k) XT_EXPECT_OK(target.SendNotify(target.LocalName(), "p", 5s));
  const xfer::Status eighth = target.SendNotify(target.LocalName(), "p", 5s);
  EXPECT_EQ(eighth.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(eighth.message().find("other senders"), std::string::npos) << eighth.ToString();
  target.Finalize();
}

// A target that did not ask for outcomes hears nothing of a request that did not complete
// (tests NoNotificationForARequestThatTimedOutOrWasCanceled in notify_test.cc the same over tcp),
// and an engine that asked hears of its own requests to itself.
TEST(NotifyOutcomeSelf, ARequestToItselfThatTimedOutIsQueuedWithItsOutcome) {
  xfer::Engine e;
  xfer::EngineOptions o;
  o.notify.outcomes = true;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0", o));
  constexpr uint64_t kB = 1 << 20, kN = 8192;  // 8 GiB over 1 MiB twice
  LocalBuffer a(kB), b(kB);
  xfer::MemHandle rh = 0;
  XT_ASSERT_OK(e.RegisterMem(b.data(), kB, xfer::MemType::kHost, &rh));
  std::vector<TransferDesc> d(kN, TransferDesc{a.addr(), b.addr(), kB});
  xfer::TransferOptions t;
  t.notify = "to-myself";
  xfer::RequestStatus st;
  XT_EXPECT_CODE(e.TransferSync(e.LocalName(), Op::kWrite, d, 5ms, t, &st), StatusCode::kTimeout);
  std::vector<xfer::Notification> got;
  XT_ASSERT_OK(e.GetNotifies(&got));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].message, "to-myself");
  EXPECT_EQ(got[0].outcome, xfer::NotifyOutcome::kTimedOut);
  EXPECT_EQ(got[0].landed, st.landed);
  e.Finalize();
}

}  // namespace
}  // namespace xfer_test
