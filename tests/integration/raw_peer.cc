#include "raw_peer.h"

#include <gtest/gtest.h>

#include <cstring>

#include "transport/remote_region.h"
#include "transport/tcp/tcp_wire.h"

namespace xfer_test {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
namespace wire = xfer::wire;
namespace net = xfer::net;

RawSession::RawSession(const std::string& name) {
  net::Address a;
  EXPECT_TRUE(net::ParseAddress(name, &a).ok());
  net::Fd fd;
  EXPECT_TRUE(net::ConnectTcp(a, Clock::now() + 5s, &fd).ok());
  s = std::make_shared<xfer::control::Session>(std::move(fd), true, name);
}

void RawSession::Send(const wire::Message& m) {
  EXPECT_TRUE(s->Send(m).ok());
  EXPECT_TRUE(s->FlushUntil(Clock::now() + 5s).ok());
}

wire::AuthProof RawSession::Authenticate(xfer::control::Handshake& hs, bool* verified) {
  Send(hs.Mine());
  wire::Message theirs, answer;
  EXPECT_TRUE(s->ReadOne(Clock::now() + 5s, &theirs).ok());
  const auto* challenge = std::get_if<wire::AuthChallenge>(&theirs);
  EXPECT_TRUE(challenge != nullptr) << "no challenge from the engine";
  if (challenge == nullptr) return {};
  hs.TheirChallenge(*challenge);
  hs.set_dialled(xfer::net::PeerOf(s->fd()));  // (as an engine's Connect: where we reached it)
  const wire::AuthProof mine = hs.Proof();
  Send(mine);
  bool ok = false;
  if (s->ReadOne(Clock::now() + 5s, &answer).ok()) {
    const auto* proof = std::get_if<wire::AuthProof>(&answer);
    ok = proof != nullptr && hs.Verify(*proof);
    if (proof == nullptr) early.push_back(answer);
  }
  if (verified != nullptr) *verified = ok;
  return mine;
}

wire::Hello RawSession::Hello(const wire::Hello& ours) {
  Send(ours);
  wire::Message m;
  if (s->ReadOne(Clock::now() + 5s, &m).ok()) {
    if (auto* h = std::get_if<wire::Hello>(&m)) return *h;
    early.push_back(m);
  }
  return {};
}

std::vector<wire::Message> RawSession::ReadAll() {
  std::vector<wire::Message> got = early;
  wire::Message m;
  while (s->ReadOne(Clock::now() + 10s, &m).ok()) got.push_back(m);
  return got;
}

wire::Hello HelloOf(const std::string& name, uint64_t incarnation) {
  wire::Hello h;
  h.name = name;
  h.incarnation = incarnation;
  h.host_id = "attacker";
  h.pid = 1;
  return h;
}

bool AnyHello(const std::vector<wire::Message>& frames) {
  for (const auto& f : frames) {
    if (std::holds_alternative<wire::Hello>(f)) return true;
  }
  return false;
}

std::string GoodbyeReason(const std::vector<wire::Message>& frames) {
  for (const auto& f : frames) {
    if (auto* b = std::get_if<wire::Goodbye>(&f)) return b->reason;
  }
  return "(no goodbye)";
}

void ExpectRefused(RawSession& raw, const wire::Hello& hello, const std::string& reason) {
  if (raw.s->Send(hello).ok()) (void)raw.s->FlushUntil(Clock::now() + 5s);  // (it may have closed)
  const auto frames = raw.ReadAll();
  EXPECT_FALSE(AnyHello(frames)) << "the engine sent its hello (regions, ports) to a stranger";
  EXPECT_EQ(GoodbyeReason(frames), reason);
}

void ExpectReplayRefused(const std::string& engine, const wire::AuthChallenge& challenge,
                         const wire::AuthProof& proof, const wire::Hello& hello) {
  RawSession replay(engine);
  replay.Send(challenge);
  wire::Message fresh;
  EXPECT_TRUE(replay.s->ReadOne(Clock::now() + 5s, &fresh).ok());
  EXPECT_TRUE(std::holds_alternative<wire::AuthChallenge>(fresh)) << "no fresh challenge";
  replay.Send(proof);
  ExpectRefused(replay, hello, "authentication failed");
}

uint16_t DataPortOf(const wire::Hello& engine) {
  const std::string* blob = xfer::transport::FindBlob(engine.backends, "tcp");
  uint16_t port = 0;
  if (blob != nullptr && blob->size() == sizeof port) std::memcpy(&port, blob->data(), sizeof port);
  return port;
}

bool OpenDataConnection(const wire::Hello& engine, uint64_t me, const std::string& key, net::Fd* fd,
                        uint32_t* verdict) {
  namespace tcp = xfer::transport::tcp_wire;
  const auto deadline = Clock::now() + 5s;
  const uint16_t port = DataPortOf(engine);
  EXPECT_NE(port, 0) << "the engine offers no tcp data port";
  if (port == 0 || !net::ConnectTcp(net::Address{"127.0.0.1", port, true}, deadline, fd).ok()) return false;
  const auto hello = tcp::DataHello(engine.incarnation, me);
  if (!net::SendAll(fd->get(), hello.data(), hello.size(), deadline).ok()) return false;
  if (!key.empty()) {
    uint8_t nonce[xfer::crypto::kNonceBytes];
    if (!net::RecvAll(fd->get(), nonce, sizeof nonce, deadline).ok()) return false;
    const xfer::crypto::Mac proof = tcp::DataProof(key, nonce, engine.incarnation, me);
    if (!net::SendAll(fd->get(), proof.data(), proof.size(), deadline).ok()) return false;
  }
  uint8_t answer[tcp::kAcceptBytes];
  if (!net::RecvAll(fd->get(), answer, sizeof answer, deadline).ok()) return false;
  *verdict = tcp::Get<uint32_t>(answer);
  return true;
}

std::vector<uint8_t> WriteFrameHead(uint64_t addr, uint64_t len) {
  namespace tcp = xfer::transport::tcp_wire;
  std::vector<uint8_t> f(tcp::kBatchHeaderBytes + tcp::kSliceBytes, 0);
  f[0] = static_cast<uint8_t>(xfer::Op::kWrite);
  tcp::Put<uint32_t>(f.data() + 4, 1);  // one descriptor
  tcp::Put<uint64_t>(f.data() + 8, len);
  tcp::Put<uint64_t>(f.data() + 16, addr);
  tcp::Put<uint64_t>(f.data() + 24, len);
  return f;
}

std::string KeyOf(const xfer::control::Handshake& hs) {
  const xfer::crypto::Mac key = hs.SessionKey();
  return std::string(reinterpret_cast<const char*>(key.data()), key.size());
}

}  // namespace xfer_test
