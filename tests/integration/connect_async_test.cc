// Engine::ConnectAsync: one thread connects to many peers at once, each outcome polled.
#include <netinet/in.h>
#include <sys/socket.h>

#include "test_common.h"
#include "util/net.h"

namespace xfer_test {
namespace {

using namespace std::chrono_literals;

// Polls every handle until each reported done (bounded); returns the outcomes in order.
std::vector<xfer::Status> AwaitAll(xfer::Engine& e, const std::vector<xfer::ConnectHandle>& handles,
                                   std::chrono::milliseconds timeout = 30s) {
  std::vector<xfer::Status> out(handles.size());
  std::vector<bool> done(handles.size(), false);
  EXPECT_TRUE(PollUntil(
      [&] {
        bool all = true;
        for (size_t i = 0; i < handles.size(); ++i) {
          if (done[i]) continue;
          xfer::ConnectStatus st;
          const xfer::Status s = e.GetConnectStatus(handles[i], &st);
          EXPECT_TRUE(s.ok()) << s.ToString();
          if (!s.ok() || st.done) {
            done[i] = true;
            out[i] = s.ok() ? st.status : s;
          } else {
            all = false;
          }
        }
        return all;
      },
      timeout))
      << "a ConnectAsync never ended";
  return out;
}

// A port that completes TCP handshakes (the kernel's backlog) and never says a word.
struct SilentListener {
  xfer::net::Fd fd;
  std::string name;
  SilentListener() {
    xfer::net::Address a, bound;
    EXPECT_TRUE(xfer::net::ParseAddress("127.0.0.1:0", &a).ok());
    EXPECT_TRUE(xfer::net::Listen(a, &fd, &bound).ok());
    name = bound.ToString();
  }
};

TEST(ConnectAsync, OneThreadConnectsToManyPeersAtOnce) {
  constexpr int kPeers = 6;
  std::vector<std::unique_ptr<PeerProcess>> peers;
  for (int i = 0; i < kPeers; ++i) {
    peers.push_back(std::make_unique<PeerProcess>());
    std::string err;
    ASSERT_TRUE(peers.back()->Start({}, &err)) << err;
  }
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0"));
  std::vector<xfer::ConnectHandle> handles;
  for (auto& p : peers) {
    xfer::ConnectHandle h = 0;
    XT_ASSERT_OK(e.ConnectAsync(p->name(), 10s, &h));
    handles.push_back(h);
  }
  xfer::ConnectHandle refused = 0;  // nobody listens there
  XT_ASSERT_OK(e.ConnectAsync("127.0.0.1:" + std::to_string(UnusedPort()), 10s, &refused));
  handles.push_back(refused);
  const auto outcomes = AwaitAll(e, handles);
  for (int i = 0; i < kPeers; ++i) XT_EXPECT_OK(outcomes[i]);
  EXPECT_EQ(outcomes.back().code(), StatusCode::kConnectionLost) << outcomes.back().ToString();

  // Connected for real: a transfer to each, and the handles are released once reported done.
  for (auto& p : peers) {
    const PeerRegion r = p->Alloc(4096);
    p->Fill(r, 9);
    LocalBuffer into(4096);
    XT_ASSERT_OK(e.TransferSync(p->name(), Op::kRead, {{into.addr(), r.addr, 4096}}, 10s));
    EXPECT_EQ(into.Hash(), p->Sum(r));
  }
  xfer::ConnectStatus st;
  XT_EXPECT_CODE(e.GetConnectStatus(handles[0], &st), StatusCode::kInvalidArgument);
  XT_EXPECT_CODE(e.GetConnectStatus(987654, &st), StatusCode::kInvalidArgument);
  XT_EXPECT_CODE(e.ConnectAsync(peers[0]->name(), 1s, nullptr), StatusCode::kInvalidArgument);
  xfer::ConnectHandle again = 0;
  XT_ASSERT_OK(e.ConnectAsync(peers[0]->name(), 5s, &again));
  EXPECT_EQ(AwaitAll(e, {again})[0].code(), StatusCode::kAlreadyConnected);
}

TEST(ConnectAsync, ABurstRunsAtOnceWhateverThreadsAreIdle) {
  // 8 connects to a port that never answers (each waits out its 1 s timeout) right after one
  // that left an idle connect thread: they run together, ~1 s in all, not one after another.
  std::vector<SilentListener> silent(8);  // (one each: a second connect to one address is ALREADY_CONNECTED)
  PeerProcess peer;
  std::string err;
  ASSERT_TRUE(peer.Start({}, &err)) << err;
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0"));
  xfer::ConnectHandle first = 0;
  XT_ASSERT_OK(e.ConnectAsync(peer.name(), 10s, &first));
  XT_EXPECT_OK(AwaitAll(e, {first})[0]);  // (its thread is idle now)
  std::vector<xfer::ConnectHandle> burst(8);
  const auto t0 = Clock::now();
  for (size_t i = 0; i < burst.size(); ++i) XT_ASSERT_OK(e.ConnectAsync(silent[i].name, 1s, &burst[i]));
  for (const auto& s : AwaitAll(e, burst)) EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.ToString();
  EXPECT_LT(SecondsSince(t0), 4.0) << "the burst ran one connect at a time";
}

TEST(ConnectAsync, TimeoutsHoldAndFinalizeEndsConnectsStillWaiting) {
  SilentListener silent;
  xfer::Engine e;
  xfer::EngineOptions o;
  o.heartbeat_interval = 200ms;
  o.heartbeat_timeout = 1000ms;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0", o));
  xfer::ConnectHandle h = 0;
  XT_ASSERT_OK(e.ConnectAsync(silent.name, 300ms, &h));
  const auto t0 = Clock::now();
  EXPECT_EQ(AwaitAll(e, {h})[0].code(), StatusCode::kTimeout);
  EXPECT_LT(SecondsSince(t0), 5.0);

  // 40 connects that would each wait 20 s: 16 run, the rest wait for a thread. Finalize
  // cancels those and ends the running ones (heartbeat timeout: 1 s), not 20 s later.
  std::vector<SilentListener> more(40);
  std::vector<xfer::ConnectHandle> handles(40);
  for (size_t i = 0; i < handles.size(); ++i) XT_ASSERT_OK(e.ConnectAsync(more[i].name, 20s, &handles[i]));
  std::this_thread::sleep_for(100ms);
  const auto t1 = Clock::now();
  e.Finalize();
  EXPECT_LT(SecondsSince(t1), 5.0);
  int canceled = 0;
  for (const auto& s : AwaitAll(e, handles, 5s)) {
    EXPECT_FALSE(s.ok());
    canceled += s.code() == StatusCode::kCanceled ? 1 : 0;
  }
  EXPECT_GE(canceled, 24);
  XT_EXPECT_CODE(e.ConnectAsync(silent.name, 1s, &h), StatusCode::kInvalidArgument);  // finalized
}

}  // namespace
}  // namespace xfer_test
