// Failure notifications between real processes (EngineOptions::notify.outcomes): on every
// transport, a notified request that times out, is canceled or fails at the target tells the
// target how it ended, with the descriptors that landed, once, in order with completed ones;
// an unnotified one tells nothing.
#include <sstream>
#include <thread>

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
  PeerOptions RemoteOptions() override {
    PeerOptions o;
    o.extra_args = {"--option", "notify.outcomes=true"};
    if (GetParam().forced == "ucx") o.extra_args.insert(o.extra_args.end(), {"--ucx", "on"});
    return o;
  }
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
