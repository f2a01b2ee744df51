// Request life cycle against a real peer: cancel, deadline expiry, short waits, Finalize with
// requests outstanding.
#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "test_common.h"

namespace xfer_test {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kMiB = 1ull << 20;

// The transports the life cycle is checked on: the default one (shm or cma here), and ucx,
// whose requests run differently (pipelined: started on the caller's thread, driven by whoever
// waits).
#ifdef XFER_TEST_UCX
const std::vector<std::string> kTransports = {"default", "ucx"};
#else
const std::vector<std::string> kTransports = {"default"};
#endif

// A transfer big enough (256 MiB, into untouched remote pages) to be running for tens of
// milliseconds at least.
class RequestFixture : public PeerFixture {
 protected:
  virtual std::string transport() const = 0;
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o;
    if (transport() != "default") o.transport = transport();
    return o;
  }
  PeerOptions RemoteOptions() override {
    PeerOptions o;
    if (transport() == "ucx") o.extra_args = {"--ucx", "on"};  // no RDMA device: offer it anyway
    return o;
  }
  void SetUp() override {
    PeerFixture::SetUp();
    if (HasFatalFailure()) return;
    region_ = peer_.Alloc(kPieces * kPiece, "big");
    ASSERT_NE(region_.addr, 0u);
    src_ = std::make_unique<LocalBuffer>(kPiece);
    ASSERT_NE(src_->data(), nullptr);
    src_->Fill(1234);
    for (uint64_t i = 0; i < kPieces; ++i) {
      big_.push_back({src_->addr(), region_.addr + i * kPiece, kPiece});
    }
  }

  // The engine still works: a small write lands.
  void ExpectStillWorks() {
    LocalBuffer s(4096);
    s.Fill(99);
    XT_EXPECT_OK(Write({{s.addr(), region_.addr, 4096}}, 10s));
    EXPECT_EQ(peer_.SumRange(region_.addr, 4096), s.Hash());
  }

  static constexpr uint64_t kPiece = 64 * kMiB;
  static constexpr uint64_t kPieces = 4;
  PeerRegion region_;
  std::unique_ptr<LocalBuffer> src_;
  std::vector<TransferDesc> big_;
};

class IntegrationRequest : public RequestFixture, public ::testing::WithParamInterface<std::string> {
 protected:
  std::string transport() const override { return GetParam(); }
};
INSTANTIATE_TEST_SUITE_P(Transports, IntegrationRequest, ::testing::ValuesIn(kTransports),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

TEST_P(IntegrationRequest, CancelRightAwayEndsCanceledOrCompleted) {
  int canceled = 0;
  for (int round = 0; round < 3; ++round) {
    xfer::RequestHandle req = 0;
    XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kWrite, big_, 30s, &req));
    XT_EXPECT_OK(engine_.Cancel(req));
    const Outcome o = WaitFor(engine_, req, 10s);
    ASSERT_NE(o.status.state, RequestState::kWaiting)
        << "canceled request still waiting after 10 s: " << o.wait.ToString();
    if (o.status.state == RequestState::kCanceled) {
      ++canceled;
      EXPECT_EQ(o.wait.code(), StatusCode::kCanceled) << o.wait.ToString();
      EXPECT_EQ(o.status.status.code(), StatusCode::kCanceled) << o.status.status.ToString();
    } else {
      EXPECT_EQ(o.status.state, RequestState::kCompleted) << o.status.status.ToString();
      XT_EXPECT_OK(o.wait);
    }
    EXPECT_LT(o.seconds, 5.0);
    // Canceling again after the request ended and was released must not crash.
    const xfer::Status again = engine_.Cancel(req);
    EXPECT_TRUE(again.ok() || again.code() == StatusCode::kInvalidArgument) << again.ToString();
  }
  // 256 MiB canceled at once three times: at least once the cancel must take effect.
  EXPECT_GT(canceled, 0) << "Cancel never stopped a 256 MiB request";
  ExpectStillWorks();
}

TEST_P(IntegrationRequest, EndStateSaysWhetherTheBytesMoved) {
  // One batch, canceled at once or a little later: either it was dropped (kCanceled, the
  // target untouched) or it ran (kCompleted, every byte there); never kCanceled with the data
  // moved, whichever moment the cancel lands in.
  constexpr uint64_t kLen = 128 << 10;  // one shm piece: one batch (and above the inline limit)
  LocalBuffer src(kLen);
  int canceled = 0;
  for (int round = 0; round < 30; ++round) {
    src.Fill(round);
    peer_.FillRange(region_.addr, kLen, 1000 + round);
    const uint64_t before = peer_.SumRange(region_.addr, kLen);
    xfer::RequestHandle req = 0;
    XT_ASSERT_OK(
        engine_.TransferAsync(peer_.name(), Op::kWrite, {{src.addr(), region_.addr, kLen}}, 10s, &req));
    const auto cancel_at = Clock::now() + std::chrono::microseconds(round % 10 * 15);
    while (Clock::now() < cancel_at) {
    }
    XT_EXPECT_OK(engine_.Cancel(req));
    const Outcome o = WaitFor(engine_, req, 10s);
    const uint64_t after = peer_.SumRange(region_.addr, kLen);
    if (o.status.state == RequestState::kCanceled) {
      ++canceled;
      EXPECT_EQ(after, before) << "round " << round << ": canceled, but the data moved";
    } else {
      EXPECT_EQ(o.status.state, RequestState::kCompleted) << o.status.status.ToString();
      EXPECT_EQ(after, src.Hash()) << "round " << round;
    }
  }
  std::printf("canceled %d of 30\n", canceled);
}

TEST_P(IntegrationRequest, CancelWhilePollingStatus) {
  xfer::RequestHandle req = 0;
  XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kRead, big_, 30s, &req));
  // READ into src_ from the region: src_ is only scratch here.
  std::this_thread::sleep_for(2ms);
  XT_EXPECT_OK(engine_.Cancel(req));
  xfer::RequestStatus st;
  const auto t0 = Clock::now();
  for (;;) {
    XT_ASSERT_OK(engine_.GetTransferStatus(req, &st));
    if (st.state != RequestState::kWaiting) break;
    ASSERT_LT(SecondsSince(t0), 10.0) << "canceled request never ended";
    std::this_thread::sleep_for(200us);
  }
  EXPECT_TRUE(st.state == RequestState::kCanceled || st.state == RequestState::kCompleted)
      << xfer::RequestStateName(st.state) << " " << st.status.ToString();
  ExpectStillWorks();
}

TEST_P(IntegrationRequest, CancelAfterCompletionChangesNothing) {
  LocalBuffer s(4096);
  s.Fill(5);
  xfer::RequestHandle req = 0;
  XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kWrite, {{s.addr(), region_.addr, 4096}}, 10s, &req));
  // Let it finish without consuming its status: the peer's sum changes when it landed.
  ASSERT_TRUE(PollUntil([&] { return peer_.SumRange(region_.addr, 4096) == s.Hash(); }, 10s));
  std::this_thread::sleep_for(20ms);
  XT_EXPECT_OK(engine_.Cancel(req));
  const Outcome o = WaitFor(engine_, req, 10s);
  XT_EXPECT_OK(o.wait);
  EXPECT_EQ(o.status.state, RequestState::kCompleted);
}

TEST_P(IntegrationRequest, DeadlineExpiryEndsInTimeout) {
  xfer::RequestHandle req = 0;
  const auto t0 = Clock::now();
  XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kWrite, big_, 1ms, &req));
  const Outcome o = WaitFor(engine_, req, 30s);
  EXPECT_EQ(o.status.state, RequestState::kTimeout) << o.wait.ToString();
  EXPECT_EQ(o.wait.code(), StatusCode::kTimeout) << o.wait.ToString();
  EXPECT_EQ(o.status.status.code(), StatusCode::kTimeout) << o.status.status.ToString();
  EXPECT_LT(SecondsSince(t0), 5.0) << "a 1 ms deadline took seconds to be noticed";

  // The same with TransferSync.
  XT_EXPECT_CODE(engine_.TransferSync(peer_.name(), Op::kRead, big_, 1ms), StatusCode::kTimeout);
  ExpectStillWorks();
}

TEST_P(IntegrationRequest, ZeroTimeoutDeadlineIsAlreadyDue) {
  xfer::RequestHandle req = 0;
  const xfer::Status s = engine_.TransferAsync(peer_.name(), Op::kWrite, big_, 0ms, &req);
  if (s.ok()) {
    const Outcome o = WaitFor(engine_, req, 30s);
    EXPECT_EQ(o.status.state, RequestState::kTimeout) << o.wait.ToString();
    EXPECT_EQ(o.wait.code(), StatusCode::kTimeout);
  } else {
    EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.ToString();
  }
  ExpectStillWorks();
}

TEST_P(IntegrationRequest, ShortWaitOnRunningRequestIsNotADeadline) {
  xfer::RequestHandle req = 0;
  XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kWrite, big_, 60s, &req));
  xfer::RequestStatus st;
  st.state = RequestState::kFailed;  // must be overwritten with kWaiting
  XT_EXPECT_CODE(engine_.Wait(req, 1ms, &st), StatusCode::kTimeout);
  EXPECT_EQ(st.state, RequestState::kWaiting);
  // The request is still alive and ends normally.
  const Outcome o = WaitFor(engine_, req, 30s);
  XT_EXPECT_OK(o.wait);
  EXPECT_EQ(o.status.state, RequestState::kCompleted);
  for (uint64_t i = 0; i < kPieces; ++i) {
    EXPECT_EQ(peer_.SumRange(region_.addr + i * kPiece, kPiece), src_->Hash()) << "piece " << i;
  }
}

TEST_P(IntegrationRequest, FinalizeWithRequestsOutstanding) {
  std::vector<xfer::RequestHandle> reqs(4);
  for (auto& r : reqs) XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kWrite, big_, 60s, &r));
  const auto t0 = Clock::now();
  engine_.Finalize();
  EXPECT_LT(SecondsSince(t0), 10.0) << "Finalize took too long with requests outstanding";
  // Afterwards the handles are dead or report a terminal state; nothing crashes or hangs.
  for (auto r : reqs) {
    xfer::RequestStatus st;
    const xfer::Status s = engine_.GetTransferStatus(r, &st);
    if (s.ok()) {
      EXPECT_TRUE(st.state == RequestState::kCanceled || st.state == RequestState::kCompleted)
          << xfer::RequestStateName(st.state);
    } else {
      EXPECT_TRUE(s.code() == StatusCode::kNotConnected || s.code() == StatusCode::kInvalidArgument)
          << s.ToString();
    }
  }
  // The peer still works and sees the goodbye.
  EXPECT_TRUE(peer_.Call("ping").ok);
}

TEST_P(IntegrationRequest, FinalizeWhileOtherThreadsTransferAndConnect) {
  // Threads keep transferring (sync, and async with a wait) and connecting to a second peer
  // and disconnecting from it while another thread calls Finalize: every call ends with a
  // clear status, and nothing crashes or hangs (run under the sanitizers too).
  PeerProcess other;
  std::string err;
  ASSERT_TRUE(other.Start(RemoteOptions(), &err)) << err;
  std::atomic<bool> stop{false};
  std::atomic<int> calls{0};
  std::mutex mu;
  std::vector<std::string> unexpected;
  auto check = [&](const xfer::Status& s, const char* what) {
    ++calls;
    const auto c = s.code();
    if (c == StatusCode::kOk || c == StatusCode::kCanceled || c == StatusCode::kInvalidArgument ||
        c == StatusCode::kConnectionLost || c == StatusCode::kNotConnected ||
        c == StatusCode::kAlreadyConnected) {
      return;
    }
    std::lock_guard l(mu);
    unexpected.push_back(std::string(what) + ": " + s.ToString());
  };
  LocalBuffer small(4096);
  std::vector<std::thread> threads;
  threads.emplace_back([&] {
    while (!stop.load()) check(Write({{small.addr(), region_.addr, small.len()}}, 10s), "TransferSync");
  });
  threads.emplace_back([&] {
    while (!stop.load()) {
      xfer::RequestHandle r = 0;
      const std::vector<TransferDesc> some(big_.begin(), big_.begin() + 4);
      xfer::Status s = engine_.TransferAsync(peer_.name(), Op::kWrite, some, 10s, &r);
      check(s, "TransferAsync");
      if (s.ok()) check(engine_.Wait(r, 10s), "Wait");
    }
  });
  threads.emplace_back([&] {
    while (!stop.load()) {
      check(engine_.Connect(other.name(), 5s), "Connect");
      check(engine_.Disconnect(other.name()), "Disconnect");
    }
  });
  std::this_thread::sleep_for(300ms);
  const auto t0 = Clock::now();
  engine_.Finalize();
  EXPECT_LT(SecondsSince(t0), 10.0);
  std::this_thread::sleep_for(100ms);  // (calls after Finalize, too)
  stop.store(true);
  for (auto& t : threads) t.join();
  EXPECT_GT(calls.load(), 3);
  EXPECT_TRUE(unexpected.empty()) << unexpected.front();
  EXPECT_TRUE(peer_.Call("ping").ok);
  EXPECT_TRUE(other.Call("ping").ok);
}

TEST_P(IntegrationRequest, DisconnectWithRequestInFlight) {
  xfer::RequestHandle req = 0;
  XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kWrite, big_, 60s, &req));
  XT_EXPECT_OK(engine_.Disconnect(peer_.name()));
  const Outcome o = WaitFor(engine_, req, 10s);
  ASSERT_NE(o.status.state, RequestState::kWaiting) << "request outlived its session by 10 s";
  if (o.status.state != RequestState::kCompleted) {
    EXPECT_TRUE(o.wait.code() == StatusCode::kConnectionLost || o.wait.code() == StatusCode::kCanceled ||
                o.wait.code() == StatusCode::kNotConnected)
        << o.wait.ToString();
  }
  XT_EXPECT_CODE(Write({{src_->addr(), region_.addr, 64}}, 5s), StatusCode::kNotConnected);
  XT_ASSERT_OK(engine_.Connect(peer_.name(), 10s));
  ExpectStillWorks();
}

TEST_P(IntegrationRequest, WaitCancelAndPollFromSeveralThreads) {
  for (int round = 0; round < 5; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    xfer::RequestHandle req = 0;
    XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kWrite, big_, 60s, &req));
    // Two waiters, one poller and one canceler on the same handle. Exactly one of the three
    // observers gets the terminal state; the others see the handle released. Nobody hangs.
    std::atomic<int> terminal{0}, released{0}, other{0};
    auto classify = [&](const xfer::Status& s, RequestState st) {
      if (s.code() == StatusCode::kInvalidArgument) {
        released++;
      } else if (st == RequestState::kCanceled || st == RequestState::kCompleted) {
        terminal++;
      } else {
        other++;
      }
    };
    std::vector<std::thread> threads;
    for (int w = 0; w < 2; ++w) {
      threads.emplace_back([&] {
        xfer::RequestStatus st;
        const xfer::Status s = engine_.Wait(req, 20s, &st);
        classify(s, st.state);
      });
    }
    threads.emplace_back([&] {
      xfer::RequestStatus st;
      const auto t0 = Clock::now();
      for (;;) {
        const xfer::Status s = engine_.GetTransferStatus(req, &st);
        if (!s.ok() || st.state != RequestState::kWaiting) return classify(s, st.state);
        if (SecondsSince(t0) > 20) return classify(s, st.state);
        std::this_thread::sleep_for(100us);
      }
    });
    threads.emplace_back([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(round));
      const xfer::Status s = engine_.Cancel(req);
      EXPECT_TRUE(s.ok() || s.code() == StatusCode::kInvalidArgument) << s.ToString();
    });
    const auto t0 = Clock::now();
    for (auto& t : threads) t.join();
    EXPECT_LT(SecondsSince(t0), 10.0);
    EXPECT_EQ(terminal.load(), 1) << "released " << released.load() << ", other " << other.load();
    EXPECT_EQ(other.load(), 0);
  }
  ExpectStillWorks();
}

TEST_P(IntegrationRequest, TenThousandOutstandingRequests) {
  constexpr int kRequests = 10000;
  LocalBuffer s(kRequests * 8);
  s.Fill(21);
  // Registered local memory: the engine need not look the range up in /proc/self/maps.
  xfer::MemHandle h = 0;
  XT_ASSERT_OK(engine_.RegisterMem(s.data(), s.len(), xfer::MemType::kHost, &h, "src"));
  std::vector<xfer::RequestHandle> reqs;
  reqs.reserve(kRequests);
  int exhausted = 0;
  const auto t0 = Clock::now();
  for (int i = 0; i < kRequests; ++i) {
    xfer::RequestHandle req = 0;
    const xfer::Status st = engine_.TransferAsync(peer_.name(), Op::kWrite,
                                                  {{s.addr() + i * 8, region_.addr + i * 8, 8}}, 60s, &req);
    if (st.code() == StatusCode::kResourceExhausted) {
      ++exhausted;
      continue;
    }
    XT_ASSERT_OK(st);
    reqs.push_back(req);
  }
  const double issue_s = SecondsSince(t0);
  const auto t1 = Clock::now();
  for (auto req : reqs) {
    const Outcome o = WaitFor(engine_, req, 30s);
    ASSERT_TRUE(o.wait.ok()) << o.wait.ToString();
  }
  RecordProperty("issue_us_per_request", std::to_string(issue_s * 1e6 / kRequests));
  RecordProperty("wait_us_per_request", std::to_string(SecondsSince(t1) * 1e6 / kRequests));
  if (exhausted == 0) {
    EXPECT_EQ(peer_.SumRange(region_.addr, s.len()), s.Hash());
  }
  RecordProperty("exhausted", exhausted);
}

// Once a request reports a terminal state (or Finalize returned), the engine must be done
// with its memory: the caller reuses buffers at once.
class IntegrationRequestQuiesce : public RequestFixture,
                                  public ::testing::WithParamInterface<std::tuple<std::string, int>> {
 protected:
  std::string transport() const override { return std::get<0>(GetParam()); }
};

TEST_P(IntegrationRequestQuiesce, NoByteMovesAfterTheTerminalState) {
  const int how = std::get<1>(GetParam());  // 0: Cancel, 1: deadline expiry, 2: Finalize
  for (Op op : {Op::kWrite, Op::kRead}) {
    SCOPED_TRACE(op == Op::kWrite ? "WRITE" : "READ");
    xfer::Engine e;
    XT_ASSERT_OK(e.Initialize("127.0.0.1:0", LocalOptions()));
    XT_ASSERT_OK(e.Connect(peer_.name(), 10s));
    // 16 x 64 MiB over the 256 MiB region (WRITE) or into one 64 MiB local buffer (READ).
    std::vector<TransferDesc> d;
    for (int i = 0; i < 16; ++i) d.push_back(big_[i % kPieces]);
    xfer::RequestHandle req = 0;
    XT_ASSERT_OK(e.TransferAsync(peer_.name(), op, d, how == 1 ? 20ms : 60s, &req));
    std::this_thread::sleep_for(5ms);
    if (how == 0) {
      XT_EXPECT_OK(e.Cancel(req));
    }
    if (how == 2) {
      e.Finalize();
    } else {
      const Outcome o = WaitFor(e, req, 30s);
      ASSERT_NE(o.status.state, RequestState::kWaiting);
      if (o.status.state == RequestState::kCompleted) continue;  // nothing left to check
    }
    // Reuse the memory right away, then look again a little later.
    if (op == Op::kWrite) {
      peer_.FillRange(region_.addr, kPiece, 31);
    } else {
      src_->Fill(31);
    }
    std::this_thread::sleep_for(100ms);
    LocalBuffer want(kPiece);
    want.Fill(31);
    if (op == Op::kWrite) {
      EXPECT_EQ(peer_.SumRange(region_.addr, kPiece), want.Hash())
          << "bytes still landed in the target after the request ended";
    } else {
      EXPECT_EQ(src_->Hash(), want.Hash()) << "bytes still landed in local memory after the request ended";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Ends, IntegrationRequestQuiesce,
    ::testing::Combine(::testing::ValuesIn(kTransports), ::testing::Values(0, 1, 2)),
    [](const ::testing::TestParamInfo<std::tuple<std::string, int>>& i) {
      const int how = std::get<1>(i.param);
      return std::get<0>(i.param) + "_" + (how == 0 ? "Cancel" : how == 1 ? "Deadline" : "Finalize");
    });

}  // namespace
}  // namespace xfer_test
