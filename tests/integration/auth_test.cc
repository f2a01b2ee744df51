// Peer authentication (EngineOptions::secret): engines that share a secret connect and move
// data; a peer without it, with another one, replaying a recorded handshake, or naming another
// engine in its hello is refused before it learns anything, and the engine keeps serving the
// others. The attacker is a raw control connection that speaks the wire format itself.
#include <stdlib.h>
#include <unistd.h>

#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <thread>

#include "control/auth.h"
#include "control/session.h"
#include "raw_peer.h"
#include "test_common.h"
#include "transport/tcp/tcp_wire.h"
#include "util/crypto.h"
#include "util/net.h"

namespace xfer_test {
namespace {

using namespace std::chrono_literals;
using xfer::Op;
using xfer::StatusCode;
namespace wire = xfer::wire;
using Clock = std::chrono::steady_clock;

const std::string kSecret = "correct horse battery staple, 32";
const std::string kOther = "another secret of thirty-two b..";

xfer::EngineOptions With(const std::string& secret) {
  xfer::EngineOptions o;
  o.secret = secret;
  return o;
}

class Auth : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!xfer::crypto::Available()) GTEST_SKIP() << "this build has no libsodium";
    char dir[] = "/tmp/xfer-auth-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    std::ofstream(dir_ + "/secret", std::ios::binary) << kSecret;
    std::string error;
    PeerOptions o;
    o.extra_args = {"--secret-file", dir_ + "/secret"};
    ASSERT_TRUE(peer_.Start(o, &error)) << error;
    region_ = peer_.Alloc(1 << 20, "kv");
  }
  void TearDown() override {
    if (!dir_.empty()) {
      unlink((dir_ + "/secret").c_str());
      rmdir(dir_.c_str());
    }
  }
  // A legitimate engine can still connect and move bytes.
  void ExpectServed() {
    xfer::Engine good;
    XT_ASSERT_OK(good.Initialize("127.0.0.1", With(kSecret)));
    XT_ASSERT_OK(good.Connect(peer_.name(), 10s));
    LocalBuffer src(4096);
    src.Fill(3);
    XT_EXPECT_OK(good.TransferSync(peer_.name(), Op::kWrite, {{src.addr(), region_.addr, 4096}}, 10s));
    EXPECT_EQ(peer_.SumRange(region_.addr, 4096), Hash64(src.data(), 4096));
  }

  std::string dir_;
  PeerProcess peer_;
  PeerRegion region_;
};

// A relay that knows no secret: the first connection to its port is joined, byte for byte, to
// a connection to `to` (an attacker at the address an engine dials).
class Relay {
 public:
  explicit Relay(const std::string& to) {
    xfer::net::Address bound;
    EXPECT_TRUE(xfer::net::Listen(xfer::net::Address{"127.0.0.1", 0, true}, &listener_, &bound).ok());
    name_ = bound.ToString();
    EXPECT_TRUE(xfer::net::ParseAddress(to, &to_).ok());
    thread_ = std::thread([this] { Run(); });
  }
  ~Relay() { Stop(); }
  const std::string& name() const { return name_; }
  // Stops relaying; the frames the engine at `to` sent through it.
  std::vector<xfer::wire::Message> Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    std::vector<xfer::wire::Message> frames;
    std::span<const uint8_t> rest(from_to_);
    xfer::wire::Header h;
    std::string why;
    while (rest.size() >= xfer::wire::kHeaderSize && xfer::wire::DecodeHeader(rest, &h, &why) &&
           rest.size() >= xfer::wire::kHeaderSize + h.length) {
      xfer::wire::Message m;
      if (!xfer::wire::DecodePayload(h.type, rest.subspan(xfer::wire::kHeaderSize, h.length), &m, &why))
        break;
      frames.push_back(std::move(m));
      rest = rest.subspan(xfer::wire::kHeaderSize + h.length);
    }
    return frames;
  }

 private:
  void Run() {
    pollfd l{listener_.get(), POLLIN, 0};
    if (poll(&l, 1, 10000) != 1) return;
    xfer::net::Fd a(accept(listener_.get(), nullptr, nullptr)), b;
    if (!a.valid() || !xfer::net::ConnectTcp(to_, Clock::now() + 5s, &b).ok()) return;
    while (!stop_) {
      pollfd p[2] = {{a.get(), POLLIN, 0}, {b.get(), POLLIN, 0}};
      if (poll(p, 2, 100) <= 0) continue;
      for (int i = 0; i < 2; ++i) {
        if ((p[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        char buf[65536];
        const ssize_t n = read(p[i].fd, buf, sizeof buf);
        if (n > 0 && i == 1) from_to_.insert(from_to_.end(), buf, buf + n);
        if (n <= 0 || !xfer::net::SendAll(p[1 - i].fd, buf, static_cast<size_t>(n), Clock::now() + 5s).ok())
          return;
      }
    }
  }
  xfer::net::Fd listener_;
  xfer::net::Address to_;
  std::string name_;
  std::vector<uint8_t> from_to_;  // what `to` sent (the relay's thread; read after Stop)
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST_F(Auth, EnginesThatShareTheSecretConnectAndTransfer) {
  ExpectServed();
  xfer::Engine from_file;
  xfer::EngineOptions o;
  o.secret_file = dir_ + "/secret";
  XT_ASSERT_OK(from_file.Initialize("127.0.0.1", o));
  XT_EXPECT_OK(from_file.Connect(peer_.name(), 10s));
}

TEST_F(Auth, AuthenticatedPeersMoveDataOverTcp) {
  xfer::EngineOptions o = With(kSecret);
  o.transport = "tcp";  // the data connections authenticate too
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1", o));
  XT_ASSERT_OK(e.Connect(peer_.name(), 10s));
  LocalBuffer src(1 << 20), back(1 << 20);
  src.Fill(5);
  XT_ASSERT_OK(e.TransferSync(peer_.name(), Op::kWrite, {{src.addr(), region_.addr, 1 << 20}}, 10s));
  XT_ASSERT_OK(e.TransferSync(peer_.name(), Op::kRead, {{back.addr(), region_.addr, 1 << 20}}, 10s));
  EXPECT_EQ(std::memcmp(src.data(), back.data(), 1 << 20), 0);
  xfer::PeerInfo info;
  XT_ASSERT_OK(e.GetPeerInfo(peer_.name(), &info));
  EXPECT_EQ(info.BytesVia("tcp"), 2u << 20);
}

// Two live sessions of one peer, each with its own key: we dialled the peer at an address other
// than its name (it is named by a wildcard, 0.0.0.0:port, and dialled at 127.0.0.1:port), and it
// dialled us as well (its own session, under its name; see
// Hostile.APeerWeDialledElsewhereMayOpenASessionOfItsOwn). Each session's tcp data connections
// prove the key of that session. The target took the key of the first session of the
// incarnation in key order and refused the data connections of the other ("it did not prove it
// knows its control session's key"): a transfer over that session failed (each engine's first
// in key order is the session under the wildcard name, so: the peer's WRITE over our session,
// and ours over its own). Every session, both ways.
TEST_F(Auth, EachOfTwoSessionsWithOnePeerMovesDataOverTcp) {
  PeerProcess peer;
  PeerOptions po;
  po.name = "0.0.0.0:0";
  po.extra_args = {"--secret-file", dir_ + "/secret", "--transport", "tcp"};
  std::string error;
  ASSERT_TRUE(peer.Start(po, &error)) << error;
  xfer::EngineOptions o = With(kSecret);
  o.transport = "tcp";
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("0.0.0.0:0", o));
  xfer::net::Address ours;
  ASSERT_TRUE(xfer::net::ParseAddress(e.LocalName(), &ours).ok()) << e.LocalName();
  const std::string us = "127.0.0.1:" + std::to_string(ours.port);
  const std::string dialled = "127.0.0.1:" + std::to_string(peer.port());
  XT_ASSERT_OK(e.Connect(dialled, 10s));
  const Reply c = peer.Call("connect " + us);  // (its own session: under our name, it has ours)
  ASSERT_TRUE(c.ok) << c.line;
  xfer::PeerInfo mine, its_own;
  XT_ASSERT_OK(e.GetPeerInfo(dialled, &mine));
  XT_ASSERT_OK(e.GetPeerInfo(peer.name(), &its_own));
  ASSERT_EQ(mine.incarnation, its_own.incarnation);
  ASSERT_TRUE(mine.outbound);
  ASSERT_FALSE(its_own.outbound);

  // The peer into us, over its own session (which it holds under `us`) and over ours (under
  // our name).
  LocalBuffer into(1 << 20);
  xfer::MemHandle h = 0;
  XT_ASSERT_OK(e.RegisterMem(into.data(), into.len(), xfer::MemType::kHost, &h));
  const uint64_t from = peer.Buf(into.len());
  uint64_t seed = 1;
  for (const std::string& to : {us, e.LocalName()}) {
    SCOPED_TRACE("the peer writes into us, over its session under " + to);
    peer.FillRange(from, into.len(), ++seed);
    const Reply w = peer.Xfer("write", to, 10000, from, into.addr(), into.len());
    EXPECT_TRUE(w.ok) << w.line;
    LocalBuffer want(into.len());
    want.Fill(seed);
    EXPECT_EQ(into.Hash(), want.Hash());
  }
  // We into the peer, over our session (under the address we dialled) and over its own (under
  // its name).
  const PeerRegion r = peer.Alloc(1 << 20);
  LocalBuffer src(1 << 20);
  for (const std::string& to : {dialled, peer.name()}) {
    SCOPED_TRACE("we write into the peer, over our session under " + to);
    src.Fill(++seed);
    XT_EXPECT_OK(e.TransferSync(to, Op::kWrite, {{src.addr(), r.addr, src.len()}}, 10s));
    EXPECT_EQ(peer.Sum(r), src.Hash());
  }
  XT_EXPECT_OK(e.DeregisterMem(h));
}

TEST_F(Auth, AnotherSecretIsRefusedAndTheOthersAreStillServed) {
  xfer::Engine wrong;
  XT_ASSERT_OK(wrong.Initialize("127.0.0.1", With(kOther)));
  const xfer::Status s = wrong.Connect(peer_.name(), 10s);
  EXPECT_EQ(s.code(), StatusCode::kRemoteAccessDenied) << s.ToString();
  EXPECT_NE(s.message().find("secret"), std::string::npos) << s.message();
  ExpectServed();
}

TEST_F(Auth, AnEngineWithoutTheSecretIsRefused) {
  xfer::Engine open;
  XT_ASSERT_OK(open.Initialize("127.0.0.1"));
  const xfer::Status s = open.Connect(peer_.name(), 10s);
  EXPECT_EQ(s.code(), StatusCode::kRemoteAccessDenied) << s.ToString();
  EXPECT_NE(s.message().find("authentication required"), std::string::npos) << s.message();
  ExpectServed();
}

TEST_F(Auth, AnEngineWithASecretRefusesAPeerWithout) {
  PeerProcess open_peer;
  std::string error;
  ASSERT_TRUE(open_peer.Start(PeerOptions{}, &error)) << error;
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1", With(kSecret)));
  const xfer::Status s = e.Connect(open_peer.name(), 10s);
  EXPECT_EQ(s.code(), StatusCode::kRemoteAccessDenied) << s.ToString();
  EXPECT_NE(s.message().find("no secret"), std::string::npos) << s.message();
}

TEST_F(Auth, AHelloWithoutAuthenticationLearnsNothing) {
  RawSession raw(peer_.name());
  ExpectRefused(raw, HelloOf("127.0.0.1:1", 77), "authentication required");
  ExpectServed();
}

TEST_F(Auth, ALargeFrameBeforeAuthenticatingClosesTheConnection) {
  RawSession raw(peer_.name());
  raw.Send(wire::Notify{1, std::string(60 << 10, 'x')});  // (an unauthenticated peer gets 4 KiB)
  EXPECT_TRUE(raw.ReadAll().empty()) << "the engine answered a large frame from a stranger";
  ExpectServed();
}

// The side that dials takes no more before the listener proved itself than the side that
// listens: a frame past 4 KiB ends the Connect at once. Before, it allocated any frame up to
// 64 MiB, then waited for the rest of it until the Connect's timeout.
TEST(AuthDialling, ALargeFrameBeforeTheListenerProvedItselfEndsTheConnect) {
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0", With(kSecret)));
  xfer::net::Fd listener;
  xfer::net::Address bound;
  ASSERT_TRUE(xfer::net::Listen(xfer::net::Address{"127.0.0.1", 0, true}, &listener, &bound).ok());
  const std::string name = "127.0.0.1:" + std::to_string(bound.port);
  xfer::Status connected;
  double took = 0;
  std::thread dial([&] {
    const auto t0 = Clock::now();
    connected = e.Connect(name, 5s);
    took = SecondsSince(t0);
  });
  pollfd l{listener.get(), POLLIN, 0};
  xfer::net::Fd fd(poll(&l, 1, 10000) == 1 ? accept(listener.get(), nullptr, nullptr) : -1);
  if (fd.valid()) {  // (the head of a 32 MiB frame; the rest never comes)
    const std::vector<uint8_t> big = wire::Encode(wire::Goodbye{std::string(32 << 20, 'x'), 0});
    EXPECT_TRUE(xfer::net::SendAll(fd.get(), big.data(), 4096, Clock::now() + 5s).ok());
  }
  dial.join();
  ASSERT_TRUE(fd.valid());
  EXPECT_FALSE(connected.ok());
  EXPECT_NE(connected.message().find("before authenticating"), std::string::npos) << connected.ToString();
  EXPECT_LT(took, 2.0) << connected.ToString();
}

TEST_F(Auth, AWrongProofIsRefused) {
  RawSession raw(peer_.name());
  xfer::control::Handshake hs(kOther, true, "127.0.0.1:1", 78);  // another secret
  raw.Authenticate(hs);
  ExpectRefused(raw, HelloOf("127.0.0.1:1", 78), "authentication failed");
  ExpectServed();
}

TEST_F(Auth, AReplayedHandshakeIsRefused) {
  // A legitimate handshake (this test knows the secret), recorded...
  xfer::control::Handshake hs(kSecret, true, "127.0.0.1:1", 79);
  const wire::AuthChallenge challenge = hs.Mine();  // (the proof is recorded below)
  wire::AuthProof proof;
  {
    RawSession raw(peer_.name());
    bool verified = false;
    proof = raw.Authenticate(hs, &verified);
    ASSERT_TRUE(verified);
    raw.Send(HelloOf("127.0.0.1:1", 79));
    wire::Message hello;
    ASSERT_TRUE(raw.s->ReadOne(Clock::now() + 5s, &hello).ok());
    EXPECT_TRUE(std::holds_alternative<wire::Hello>(hello)) << "the legitimate handshake failed";
    raw.Send(wire::Goodbye{"done", 0});
  }
  // ... and replayed on a new connection.
  ExpectReplayRefused(peer_.name(), challenge, proof, HelloOf("127.0.0.1:1", 79));
  ExpectServed();
}

TEST_F(Auth, AHelloNamingAnotherEngineThanItAuthenticatedAsIsRefused) {
  RawSession raw(peer_.name());
  xfer::control::Handshake hs(kSecret, true, "127.0.0.1:1", 80);
  raw.Authenticate(hs);
  raw.Send(HelloOf("127.0.0.1:2", 81));  // another name and incarnation
  const auto frames = raw.ReadAll();
  EXPECT_FALSE(AnyHello(frames));
  EXPECT_EQ(GoodbyeReason(frames), "authentication failed");
}

// The tcp data port: the hello's incarnations are no credential; the connection must answer
// the target's nonce with its control session's key. (The data format, tcp_transport.cc: a
// 64-byte hello: magic "XFD1" u32, version u16 (3), pad, target incarnation u64, initiator
// incarnation u64; with a secret the target sends a 32-byte nonce and reads a 32-byte proof,
// HMAC(session key, "xfer-data-v1" | nonce | target incarnation | initiator incarnation); then
// a 64-byte reply whose first u32 is 0 when accepted.)
TEST_F(Auth, ADataConnectionMustProveItsSessionKey) {
  // A control session of our own (this test knows the secret), for incarnations and a key.
  RawSession raw(peer_.name());
  xfer::control::Handshake hs(kSecret, true, "127.0.0.1:1", 90);
  raw.Authenticate(hs);
  const wire::Hello hello = raw.Hello(HelloOf("127.0.0.1:1", 90));
  ASSERT_NE(DataPortOf(hello), 0) << "the peer offers no tcp data port";
  const std::string session_key = KeyOf(hs);

  auto attempt = [&](const std::string& with_key) {
    xfer::net::Fd fd;
    uint32_t verdict = 1;
    return OpenDataConnection(hello, 90, with_key, &fd, &verdict) && verdict == 0;
  };
  EXPECT_FALSE(attempt(std::string(32, 'k'))) << "a data connection without the key was accepted";
  EXPECT_FALSE(attempt(kSecret)) << "the secret itself is not the session's key";
  EXPECT_TRUE(attempt(session_key)) << "the session's own key was refused";
  ExpectServed();
}

// A data connection whose control session ends between its hello and its proof (a round trip
// the peer times) is refused, and a WRITE sent over it anyway does not land: a session the
// engine ended keeps no access through a connection it was still opening.
TEST_F(Auth, ADataConnectionWhoseSessionEndedBeforeItsProofIsRefused) {
  namespace tcp = xfer::transport::tcp_wire;
  auto raw = std::make_unique<RawSession>(peer_.name());
  xfer::control::Handshake hs(kSecret, true, "127.0.0.1:1", 90);
  raw->Authenticate(hs);
  const wire::Hello hello = raw->Hello(HelloOf("127.0.0.1:1", 90));
  ASSERT_NE(DataPortOf(hello), 0) << "the peer offers no tcp data port";
  const std::string key = KeyOf(hs);
  const auto deadline = Clock::now() + 10s;
  xfer::net::Fd fd;
  ASSERT_TRUE(
      xfer::net::ConnectTcp(xfer::net::Address{"127.0.0.1", DataPortOf(hello), true}, deadline, &fd).ok());
  const auto data_hello = tcp::DataHello(hello.incarnation, 90);
  ASSERT_TRUE(xfer::net::SendAll(fd.get(), data_hello.data(), data_hello.size(), deadline).ok());
  uint8_t nonce[xfer::crypto::kNonceBytes];
  ASSERT_TRUE(xfer::net::RecvAll(fd.get(), nonce, sizeof nonce, deadline).ok());
  raw->Send(wire::Goodbye{"bye", 0});
  raw.reset();
  ASSERT_TRUE(PollUntil([&] { return !peer_.Call("info 127.0.0.1:1").ok; }, 5s)) << "the session never ended";
  const xfer::crypto::Mac proof = tcp::DataProof(key, nonce, hello.incarnation, 90);
  ASSERT_TRUE(xfer::net::SendAll(fd.get(), proof.data(), proof.size(), deadline).ok());
  uint8_t answer[tcp::kAcceptBytes];
  ASSERT_TRUE(xfer::net::RecvAll(fd.get(), answer, sizeof answer, deadline).ok());
  EXPECT_NE(tcp::Get<uint32_t>(answer), 0u) << "admitted after its session ended";
  const uint64_t before = peer_.SumRange(region_.addr, 4096);
  std::vector<uint8_t> frame = WriteFrameHead(region_.addr, 4096);
  frame.resize(frame.size() + 4096, 0xAB);
  frame.resize(frame.size() + tcp::PadFor(frame.size(), 0), 0);
  (void)xfer::net::SendAll(fd.get(), frame.data(), frame.size(), deadline);  // (may fail: closed)
  uint8_t reply[64];
  (void)xfer::net::RecvAll(fd.get(), reply, sizeof reply, Clock::now() + 2s);
  EXPECT_EQ(peer_.SumRange(region_.addr, 4096), before) << "a WRITE landed without a session";
  ExpectServed();
}

// Our own handshake reflected back to us: the relay joins our connection to our own listener,
// so each half of the handshake would see valid proofs. The acceptor refuses a peer that claims
// to be itself.
// Connect of an engine with the secret through a relay to `to` (its own name when empty);
// *from_to: the frames the engine at `to` sent through the relay.
xfer::Status ConnectThroughRelay(const std::string& to, std::vector<xfer::wire::Message>* from_to = nullptr) {
  xfer::Engine a;
  xfer::Status s = a.Initialize("127.0.0.1:0", With(kSecret));
  if (!s.ok()) return s;
  Relay relay(to.empty() ? a.LocalName() : to);
  s = a.Connect(relay.name(), 10s);
  EXPECT_EQ(s.code(), StatusCode::kRemoteAccessDenied) << s.ToString();
  if (from_to != nullptr) *from_to = relay.Stop();
  return s;
}

TEST_F(Auth, AHandshakeReflectedToItsOwnEngineIsRefused) { (void)ConnectThroughRelay(""); }

// A relay (at an address the initiator dialled) between us and another engine that has the
// secret: the proofs check out, but our proof names the relay's address, so the engine it was
// relayed to refuses it rather than take the relay for us, and proves nothing back.
TEST_F(Auth, AHandshakeRelayedToAnotherEngineIsRefusedByBoth) {
  std::vector<xfer::wire::Message> from_peer;
  const xfer::Status s = ConnectThroughRelay(peer_.name(), &from_peer);
  EXPECT_NE(s.message().find("refused our proof: authentication failed"), std::string::npos) << s.message();
  ASSERT_FALSE(from_peer.empty());
  EXPECT_TRUE(std::holds_alternative<xfer::wire::AuthChallenge>(from_peer[0]));
  for (const auto& m : from_peer) {
    EXPECT_FALSE(std::holds_alternative<xfer::wire::AuthProof>(m)) << "the engine accepted a relayed proof";
    EXPECT_FALSE(std::holds_alternative<xfer::wire::Hello>(m));
  }
  EXPECT_EQ(GoodbyeReason(from_peer), "authentication failed");
  ExpectServed();
}

// A proof for another address, sent straight to the engine (a relay that rewrote nothing but
// could not rewrite the MAC'd address): refused.
TEST_F(Auth, AProofForAnotherAddressIsRefused) {
  RawSession raw(peer_.name());
  xfer::control::Handshake hs(kSecret, true, "127.0.0.1:1", 82);
  raw.Send(hs.Mine());
  xfer::wire::Message theirs;
  ASSERT_TRUE(raw.s->ReadOne(Clock::now() + 5s, &theirs).ok());
  ASSERT_TRUE(std::holds_alternative<xfer::wire::AuthChallenge>(theirs));
  hs.TheirChallenge(std::get<xfer::wire::AuthChallenge>(theirs));
  hs.set_dialled("127.0.0.1:9");  // where a relay would have been
  raw.Send(hs.Proof());
  ExpectRefused(raw, HelloOf("127.0.0.1:1", 82), "authentication failed");
  ExpectServed();
}

// A peer engine of our own making that an engine Connects to: it authenticates, waiting
// `before_proof` before it sends its proof, then answers the engine's hello with its own after
// `before_hello`, answers every numbered goodbye, and keeps every frame it got after its proof
// (with the time it came).
class SlowAcceptor {
 public:
  SlowAcceptor(std::chrono::milliseconds before_proof, std::chrono::milliseconds before_hello) {
    xfer::net::Address bound;
    EXPECT_TRUE(xfer::net::Listen(xfer::net::Address{"127.0.0.1", 0, true}, &listener_, &bound).ok());
    name_ = "127.0.0.1:" + std::to_string(bound.port);
    thread_ = std::thread([this, before_proof, before_hello] { Serve(before_proof, before_hello); });
  }
  ~SlowAcceptor() { thread_.join(); }
  const std::string& name() const { return name_; }
  bool proved() const { return proved_.load(); }        // the engine proved itself to us
  bool got_hello() const { return got_hello_.load(); }  // and sent its hello
  std::vector<std::pair<wire::Message, Clock::time_point>> Frames() {
    thread_.join();
    thread_ = std::thread([] {});
    return frames_;
  }

 private:
  void Serve(std::chrono::milliseconds before_proof, std::chrono::milliseconds before_hello) {
    pollfd p{listener_.get(), POLLIN, 0};
    if (::poll(&p, 1, 10000) != 1) return;
    xfer::control::Session s(xfer::net::Fd(::accept(listener_.get(), nullptr, nullptr)), false, "engine");
    xfer::control::Handshake hs(kSecret, false, name_, 77);
    wire::Message m;
    if (!s.ReadOne(Clock::now() + 5s, &m).ok() || !std::holds_alternative<wire::AuthChallenge>(m)) return;
    hs.TheirChallenge(std::get<wire::AuthChallenge>(m));
    (void)s.Send(hs.Mine());
    (void)s.FlushUntil(Clock::now() + 5s);
    if (!s.ReadOne(Clock::now() + 5s, &m).ok() || !std::holds_alternative<wire::AuthProof>(m) ||
        !hs.Verify(std::get<wire::AuthProof>(m))) {
      return;
    }
    proved_.store(true);
    std::this_thread::sleep_for(before_proof);
    (void)s.Send(hs.Proof());
    (void)s.FlushUntil(Clock::now() + 5s);
    while (s.ReadOne(Clock::now() + 5s, &m).ok()) {
      frames_.emplace_back(m, Clock::now());
      if (std::holds_alternative<wire::Hello>(m)) {
        got_hello_.store(true);
        std::this_thread::sleep_for(before_hello);
        wire::Hello ours = HelloOf(name_, 77);
        ours.host_id = "elsewhere";
        ours.backends = {{"tcp", std::string("\x01\x00", 2)}};  // (a data port never used)
        (void)s.Send(ours);
      } else if (const auto* bye = std::get_if<wire::Goodbye>(&m); bye != nullptr && bye->seq != 0) {
        (void)s.Send(wire::SyncAck{bye->seq});
      }
      (void)s.FlushUntil(Clock::now() + 5s);
    }
  }

  xfer::net::Fd listener_;
  std::string name_;
  std::atomic<bool> proved_{false}, got_hello_{false};
  std::vector<std::pair<wire::Message, Clock::time_point>> frames_;
  std::thread thread_;
};

// Finalize while a Connect is under way: whether it comes before our hello went out (the
// peer's proof is late) or after (its hello is late), a peer that got our hello (our regions)
// hears our goodbye before Finalize returns. (Before: a Connect that sent its hello after
// Finalize had said goodbye to the peers it knew left that peer with our regions and no
// goodbye.)
TEST_F(Auth, FinalizeDuringAConnectLeavesNoPeerWithoutAGoodbye) {
  for (const bool late_proof : {true, false}) {
    SlowAcceptor peer(late_proof ? 500ms : 0ms, late_proof ? 0ms : 500ms);
    xfer::Engine e;
    XT_ASSERT_OK(e.Initialize("127.0.0.1", With(kSecret)));
    std::thread connect([&] { (void)e.Connect(peer.name(), 10s); });
    const auto t0 = Clock::now();
    while (!peer.proved() && Clock::now() - t0 < 10s) std::this_thread::sleep_for(1ms);
    while (!late_proof && !peer.got_hello() && Clock::now() - t0 < 10s) {  // (ours is out, theirs late)
      std::this_thread::sleep_for(1ms);
    }
    e.Finalize();
    const auto finalized = Clock::now();
    const double took = SecondsSince(t0);
    connect.join();
    bool hello = false, goodbye = false;  // (the goodbye: after the hello, before Finalize returned)
    for (const auto& [f, at] : peer.Frames()) {
      hello = hello || std::holds_alternative<wire::Hello>(f);
      goodbye = goodbye || (hello && at <= finalized && std::holds_alternative<wire::Goodbye>(f));
    }
    EXPECT_EQ(hello, !late_proof) << "our hello went out after Finalize began";
    EXPECT_TRUE(!hello || goodbye) << "the peer got our hello and no goodbye before Finalize returned";
    EXPECT_LT(took, 2.5) << "Finalize waited for a confirmation it had";
  }
}

TEST(AuthOptions, SecretsAreChecked) {
  if (!xfer::crypto::Available()) GTEST_SKIP() << "this build has no libsodium";
  xfer::Engine a, b, c;
  xfer::EngineOptions o;
  o.secret = "too short";
  XT_EXPECT_CODE(a.Initialize("127.0.0.1", o), StatusCode::kInvalidArgument);
  o.secret = kSecret;
  o.secret_file = "/etc/hostname";
  XT_EXPECT_CODE(b.Initialize("127.0.0.1", o), StatusCode::kInvalidArgument);
  o.secret.clear();
  o.secret_file = "/nonexistent/secret";
  XT_EXPECT_CODE(c.Initialize("127.0.0.1", o), StatusCode::kInvalidArgument);
  xfer::Engine d;
  o.secret_file = "/dev/zero";  // never ends: refused as too long, not read forever
  XT_EXPECT_CODE(d.Initialize("127.0.0.1", o), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace xfer_test
