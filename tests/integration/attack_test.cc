// The attacks of docs/security.md, one after another, against one engine with a secret while
// a legitimate peer keeps moving bytes to it over tcp: each attack is refused or survived, and
// the legitimate transfers go on completing while the attacker holds on to what it took. The
// attacker speaks the wire protocol itself (raw_peer.h); where an attack needs the secret (an
// insider: a claimed pid, a reader that never reads, a trickling writer, 100,000 regions), it
// has it. (A claim to be this very process needs another process: hostile_test.cc.)
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "raw_peer.h"
#include "test_common.h"
#include "util/crypto.h"

namespace xfer_test {
namespace {

using namespace std::chrono_literals;
using xfer::Op;
namespace wire = xfer::wire;
namespace net = xfer::net;
using Clock = std::chrono::steady_clock;

const std::string kSecret = "the attack test's secret, 32 byt";
const std::string kWrong = "not the attack test's secret.....";

class Attacks : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!xfer::crypto::Available()) GTEST_SKIP() << "this build has no libsodium";
    xfer::EngineOptions o;
    o.secret = kSecret;
    o.heartbeat_timeout = 2000ms;  // (both engines: the target is flooded, under ASan too)
    o.max_unsent_bytes = 1 << 20;  // (the reader that never reads reaches it sooner)
    XT_ASSERT_OK(target_.Initialize("127.0.0.1:0", o));
    XT_ASSERT_OK(target_.RegisterMem(region_.data(), region_.len(), xfer::MemType::kHost, &region_handle_));
    o.transport = "tcp";
    XT_ASSERT_OK(legit_.Initialize("127.0.0.1:0", o));
    XT_ASSERT_OK(legit_.Connect(target_.LocalName(), 10s));
    src_.Fill(1);
    mover_ = std::thread([this] { Move(); });
  }
  void TearDown() override {
    stop_.store(true);
    if (mover_.joinable()) mover_.join();
    std::lock_guard l(mu_);
    EXPECT_TRUE(failures_.empty()) << "a legitimate transfer failed: " << failures_.front();
  }

  // The legitimate peer: WRITE 64 KiB into the target's region and READ it back, again and
  // again, over tcp.
  void Move() {
    LocalBuffer back(src_.len());
    while (!stop_.load()) {
      const TransferDesc d{src_.addr(), region_.addr(), src_.len()},
          r{back.addr(), region_.addr(), back.len()};
      xfer::Status s = legit_.TransferSync(target_.LocalName(), Op::kWrite, {d}, 10s);
      if (s.ok()) s = legit_.TransferSync(target_.LocalName(), Op::kRead, {r}, 10s);
      if (s.ok() && back.Hash() != src_.Hash())
        s = {xfer::StatusCode::kDataCorrupted, "READ back other bytes"};
      if (!s.ok()) {
        std::lock_guard l(mu_);
        failures_.push_back(s.ToString());
        return;
      }
      ++moved_;
    }
  }

  // Runs an attack, which returns what it holds on to; the legitimate peer must complete
  // transfers while it does. Its rate then (and once, before the first attack) is printed.
  void During(const char* attack, const std::function<std::shared_ptr<void>()>& run) {
    SCOPED_TRACE(attack);
    if (!measured_before_) {
      measured_before_ = true;
      PrintRate("(none yet)");
    }
    std::shared_ptr<void> held = run();
    const uint64_t before = moved_.load();
    EXPECT_TRUE(PollUntil([&] { return moved_.load() >= before + 5; }, 10s))
        << "the legitimate peer stalled during: " << attack;
    PrintRate(attack);
  }
  // The legitimate peer's WRITE and READ back, in MB/s over the next half second.
  void PrintRate(const char* attack) {
    const uint64_t from = moved_.load();
    const auto t0 = Clock::now();
    std::this_thread::sleep_for(500ms);
    const double mbps = static_cast<double>((moved_.load() - from) * 2 * src_.len()) / 1e6 / SecondsSince(t0);
    std::printf("[ attack ] %-55s legitimate peer: %7.1f MB/s\n", attack, mbps);
  }
  bool measured_before_ = false;

  // An authenticated raw session (the attacker knows the secret) and the target's hello.
  std::unique_ptr<RawSession> Insider(const wire::Hello& ours, wire::Hello* theirs,
                                      std::string* key = nullptr) {
    auto raw = std::make_unique<RawSession>(target_.LocalName());
    xfer::control::Handshake hs(kSecret, true, ours.name, ours.incarnation);
    bool verified = false;
    raw->Authenticate(hs, &verified);
    EXPECT_TRUE(verified);
    *theirs = raw->Hello(ours);
    EXPECT_FALSE(theirs->name.empty()) << "the target did not answer an authenticated hello";
    if (key != nullptr) *key = KeyOf(hs);
    return raw;
  }

  xfer::Engine target_, legit_;
  LocalBuffer region_{4 << 20}, src_{64 << 10};
  xfer::MemHandle region_handle_ = 0;
  std::thread mover_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> moved_{0};
  std::mutex mu_;
  std::vector<std::string> failures_;
};

template <class T>
std::shared_ptr<void> Hold(T&& t) {
  return std::make_shared<std::decay_t<T>>(std::forward<T>(t));
}

TEST_F(Attacks, EachIsRefusedOrSurvivedWhileALegitimatePeerTransfers) {
  During("no secret", [&] {
    RawSession raw(target_.LocalName());
    ExpectRefused(raw, HelloOf("127.0.0.1:11", 11), "authentication required");
    return nullptr;
  });

  During("a wrong secret", [&] {
    RawSession raw(target_.LocalName());
    xfer::control::Handshake hs(kWrong, true, "127.0.0.1:12", 12);
    raw.Authenticate(hs);
    ExpectRefused(raw, HelloOf("127.0.0.1:12", 12), "authentication failed");
    return nullptr;
  });

  During("a replayed handshake", [&] {
    wire::AuthChallenge challenge;
    wire::AuthProof proof;
    {  // recorded from a session that knew the secret
      RawSession raw(target_.LocalName());
      xfer::control::Handshake hs(kSecret, true, "127.0.0.1:13", 13);
      challenge = hs.Mine();
      proof = raw.Authenticate(hs);
    }
    ExpectReplayRefused(target_.LocalName(), challenge, proof, HelloOf("127.0.0.1:13", 13));
    return nullptr;
  });

  During("the legitimate peer's name, without the secret", [&] {
    RawSession raw(target_.LocalName());
    raw.Send(HelloOf(legit_.LocalName(), 14));
    EXPECT_FALSE(AnyHello(raw.ReadAll()));
    xfer::PeerInfo info;
    XT_EXPECT_OK(target_.GetPeerInfo(legit_.LocalName(), &info));
    EXPECT_NE(info.incarnation, 14u) << "the hijacker replaced the legitimate session";
    return nullptr;
  });

  During("a claim to be another process of this host", [&] {
    PeerProcess victim;  // its pid, host and cma cookie, from its own hello
    std::string error;
    EXPECT_TRUE(victim.Start(PeerOptions{}, &error)) << error;
    RawSession probe(victim.name());
    const wire::Hello victims = probe.Hello(HelloOf("127.0.0.1:15", 15));
    EXPECT_EQ(victims.pid, victim.pid());
    wire::Hello forged = victims, theirs;
    forged.name = "127.0.0.1:16";
    forged.incarnation = 16;
    auto raw = Insider(forged, &theirs);
    xfer::PeerInfo info;
    XT_EXPECT_OK(target_.GetPeerInfo(forged.name, &info));
    EXPECT_FALSE(info.Reaches("local") || info.Reaches("shm") || info.Reaches("cma"))
        << "a same-host path to a peer that only claimed another process: " << info.transport;
    return Hold(std::move(raw));
  });

  During("2,000 idle connections on the control and data ports", [&] {
    wire::Hello theirs;
    auto raw = Insider(HelloOf("127.0.0.1:17", 17), &theirs);
    std::vector<net::Fd> idle;
    net::Address control;
    XT_EXPECT_OK(net::ParseAddress(target_.LocalName(), &control));
    const uint16_t ports[2] = {control.port, DataPortOf(theirs)};
    rlimit fds{};  // (4,000 descriptors in this process, with the target's)
    ::getrlimit(RLIMIT_NOFILE, &fds);
    fds.rlim_cur = std::max<rlim_t>(fds.rlim_cur, std::min<rlim_t>(fds.rlim_max, 8192));
    ::setrlimit(RLIMIT_NOFILE, &fds);
    for (int i = 0; i < 2000; ++i) {
      net::Fd fd;
      if (net::ConnectTcp(net::Address{"127.0.0.1", ports[i % 2], true}, Clock::now() + 2s, &fd).ok()) {
        idle.push_back(std::move(fd));
      }
    }
    EXPECT_GT(idle.size(), 1900u);
    xfer::EngineOptions o;
    o.secret = kSecret;
    xfer::Engine newcomer;  // a new legitimate peer gets in meanwhile
    XT_EXPECT_OK(newcomer.Initialize("127.0.0.1:0", o));
    XT_EXPECT_OK(newcomer.Connect(target_.LocalName(), 5s));
    return Hold(std::make_pair(std::move(raw), std::move(idle)));
  });

  During("a reader that never reads", [&] {
    wire::Hello theirs;
    auto raw = Insider(HelloOf("127.0.0.1:18", 18), &theirs);
    int small = 4096;
    ::setsockopt(raw->s->fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    // Every region the target registers is announced to it: past 1 MiB of announcements
    // (max_unsent_bytes) unread, beyond what the sockets hold, the target closes its session.
    LocalBuffer many(16 << 20);
    std::vector<xfer::MemHandle> handles;
    const std::string tag(4000, 't');
    xfer::PeerInfo info;
    auto closed = [&] { return !target_.GetPeerInfo("127.0.0.1:18", &info).ok(); };
    for (uint64_t off = 0; off < many.len() && !(handles.size() % 64 == 0 && closed()); off += 4096) {
      xfer::MemHandle h = 0;
      XT_EXPECT_OK(target_.RegisterMem(many.data() + off, 4096, xfer::MemType::kHost, &h, tag));
      handles.push_back(h);
    }
    EXPECT_TRUE(PollUntil(closed, 10s)) << "the target kept the session of a peer that reads nothing";
    for (auto h : handles) XT_EXPECT_OK(target_.DeregisterMem(h));
    return Hold(std::move(raw));
  });

  During("a writer that trickles a byte every 100 ms", [&] {
    wire::Hello theirs;
    std::string key;
    auto raw = Insider(HelloOf("127.0.0.1:19", 19), &theirs, &key);
    LocalBuffer other(1 << 20);
    xfer::MemHandle h = 0;
    XT_EXPECT_OK(target_.RegisterMem(other.data(), other.len(), xfer::MemType::kHost, &h));
    net::Fd data;
    uint32_t verdict = 1;
    EXPECT_TRUE(OpenDataConnection(theirs, 19, key, &data, &verdict) && verdict == 0);
    const auto frame = WriteFrameHead(other.addr(), 4096);  // (its payload: trickled)
    EXPECT_TRUE(net::SendAll(data.get(), frame.data(), frame.size(), Clock::now() + 1s).ok());
    std::atomic<bool> stop{false};
    std::thread trickle([&] {
      for (int i = 0; i < 50 && !stop.load(); ++i) {
        ::send(data.get(), "x", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        std::this_thread::sleep_for(100ms);
      }
    });
    const auto t0 = Clock::now();
    XT_EXPECT_OK(target_.DeregisterMem(h));  // the region the trickle writes into
    EXPECT_LT(SecondsSince(t0), 2.8) << "DeregisterMem waited past the heartbeat timeout (2 s)";
    stop.store(true);
    trickle.join();
    return Hold(std::move(raw));
  });

  During("100,000 regions", [&] {
    wire::Hello theirs;
    auto raw = Insider(HelloOf("127.0.0.1:20", 20), &theirs);
    for (uint64_t i = 1; i <= 100000; ++i) {
      const wire::WireRegion r{
          i, xfer::RegionInfo{(1ull << 40) + i * 4096, 4096, xfer::MemType::kHost, -1, "", false}, {}};
      EXPECT_TRUE(raw->s->Send(wire::RegionAdd{r}).ok());
      if (i % 1000 == 0) {
        EXPECT_TRUE(raw->s->FlushUntil(Clock::now() + 10s).ok());
      }
    }
    raw->Send(wire::Sync{1});  // answered once the target has taken them all
    bool answered = false;
    for (wire::Message m; !answered && raw->s->ReadOne(Clock::now() + 60s, &m).ok();) {
      answered = std::holds_alternative<wire::SyncAck>(m);
    }
    EXPECT_TRUE(answered) << "the target did not take 100,000 regions within a minute";
    return Hold(std::move(raw));
  });
}

}  // namespace
}  // namespace xfer_test
