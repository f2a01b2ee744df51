// Malformed control-plane input from a raw TCP socket: the engine drops the offending
// connection, survives, and keeps serving normal peers.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "control/wire.h"
#include "test_common.h"

namespace xfer_test {
namespace {

using namespace std::chrono_literals;

// The frame header as src/control/wire.h documents it (little-endian):
//   magic u32 "XFR1" | version u16 | type u16 | payload length u32
constexpr uint32_t kMagic = 0x31524658;
constexpr uint16_t kVersion = xfer::wire::kVersion;
constexpr uint16_t kTypeHello = 1;
constexpr uint16_t kTypeHeartbeat = 7;

void PutU16(std::vector<uint8_t>* b, uint16_t v) {
  for (int i = 0; i < 2; ++i) b->push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void PutU32(std::vector<uint8_t>* b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b->push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void PutU64(std::vector<uint8_t>* b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b->push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void PutStr(std::vector<uint8_t>* b, const std::string& s) {
  PutU32(b, static_cast<uint32_t>(s.size()));
  b->insert(b->end(), s.begin(), s.end());
}
std::vector<uint8_t> Header(uint32_t magic, uint16_t version, uint16_t type, uint32_t len) {
  std::vector<uint8_t> b;
  PutU32(&b, magic);
  PutU16(&b, version);
  PutU16(&b, type);
  PutU32(&b, len);
  return b;
}

int PortOf(const std::string& name) { return std::atoi(name.c_str() + name.rfind(':') + 1); }

// A raw TCP client.
class RawConn {
 public:
  explicit RawConn(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    connected_ = fd_ >= 0 && connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    const int one = 1;
    if (connected_) setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ~RawConn() {
    if (fd_ >= 0) close(fd_);
  }
  bool connected() const { return connected_; }
  bool Send(const std::vector<uint8_t>& b) {
    size_t off = 0;
    while (off < b.size()) {
      const ssize_t n = send(fd_, b.data() + off, b.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;  // the engine may already have closed: fine
      off += static_cast<size_t>(n);
    }
    return true;
  }
  // True once the other side closed (EOF or reset) within timeout; data it sends is drained.
  bool WaitClosed(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char buf[4096];
      const ssize_t n = recv(fd_, buf, sizeof buf, 0);
      if (n == 0) return true;
      if (n < 0 && errno != EINTR && errno != EAGAIN) return true;
    }
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

struct BadInput {
  std::string name;
  std::vector<uint8_t> bytes;
  bool must_close;  // a malformed frame closes the connection
};

std::vector<BadInput> BadInputs() {
  std::vector<BadInput> v;
  {
    std::vector<uint8_t> g(4096);
    std::mt19937 rng(7);
    for (auto& c : g) c = static_cast<uint8_t>(rng());
    v.push_back({"random garbage", g, true});
  }
  {
    const std::string http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    v.push_back({"http request", std::vector<uint8_t>(http.begin(), http.end()), true});
  }
  v.push_back({"huge length", Header(kMagic, kVersion, kTypeHello, 0xFFFFFFFFu), true});
  v.push_back({"length just over the cap", Header(kMagic, kVersion, kTypeHello, (64u << 20) + 1), true});
  v.push_back({"wrong version", Header(kMagic, 0xFFFF, kTypeHello, 0), true});
  v.push_back({"unknown type", Header(kMagic, kVersion, 0x7777, 0), true});
  v.push_back({"zeros", std::vector<uint8_t>(64, 0), true});
  {
    // A hello whose first string claims 4 GiB.
    std::vector<uint8_t> b = Header(kMagic, kVersion, kTypeHello, 16);
    PutU32(&b, 0xFFFFFFF0u);
    PutU32(&b, 0);
    PutU64(&b, 0);
    v.push_back({"hello with a huge string", b, true});
  }
  {
    // A plausible hello whose region count is absurd.
    std::vector<uint8_t> p;
    PutStr(&p, "127.0.0.1:1");
    PutU64(&p, 0x1234);
    PutStr(&p, "evil-host");
    PutU32(&p, 1);
    PutU64(&p, 0);
    PutU32(&p, 1);
    PutStr(&p, "cma");
    PutU32(&p, 0xFFFFFFFFu);
    std::vector<uint8_t> b = Header(kMagic, kVersion, kTypeHello, static_cast<uint32_t>(p.size()));
    b.insert(b.end(), p.begin(), p.end());
    v.push_back({"hello with a huge region count", b, true});
  }
  // Protocol violations and truncations: the engine need not close, but must survive.
  v.push_back({"heartbeat before hello", Header(kMagic, kVersion, kTypeHeartbeat, 0), false});
  {
    std::vector<uint8_t> b = Header(kMagic, kVersion, kTypeHello, 100);
    b.resize(b.size() + 10, 0xAB);
    v.push_back({"truncated payload", b, false});
  }
  {
    std::vector<uint8_t> b = Header(kMagic, kVersion, kTypeHello, 0);
    b.resize(5);
    v.push_back({"truncated header", b, false});
  }
  return v;
}

// Sends every bad input to `port`, one connection each.
void SendAllBadInputs(int port) {
  for (const BadInput& in : BadInputs()) {
    SCOPED_TRACE(in.name);
    RawConn c(port);
    ASSERT_TRUE(c.connected()) << "could not connect to port " << port;
    c.Send(in.bytes);
    if (in.must_close) {
      EXPECT_TRUE(c.WaitClosed(5s)) << "the engine kept a connection open after: " << in.name;
    }
  }
}

class IntegrationMalformed : public PeerFixture {};

TEST_F(IntegrationMalformed, GarbageToPeerListenPortLeavesItServing) {
  const PeerRegion r = peer_.Alloc(1 << 20, "m");
  ASSERT_NE(r.addr, 0u);
  SendAllBadInputs(peer_.port());
  ASSERT_TRUE(peer_.Call("ping", 10s).ok) << "the peer died from malformed input";

  // The session opened before the garbage still works ...
  LocalBuffer src(1 << 20);
  src.Fill(61);
  XT_EXPECT_OK(Write({{src.addr(), r.addr, src.len()}}, 10s));
  EXPECT_EQ(peer_.Sum(r), src.Hash());
  // ... and a new engine can connect and transfer.
  xfer::Engine fresh;
  XT_ASSERT_OK(fresh.Initialize("127.0.0.1:0"));
  XT_ASSERT_OK(fresh.Connect(peer_.name(), 10s));
  src.Fill(62);
  XT_EXPECT_OK(fresh.TransferSync(peer_.name(), Op::kWrite, {{src.addr(), r.addr, src.len()}}, 10s));
  EXPECT_EQ(peer_.Sum(r), src.Hash());
  // Nothing of the garbage became a peer.
  Reply spoof = peer_.Call("info 127.0.0.1:1");
  EXPECT_FALSE(spoof.ok) << "a malformed hello created a session: " << spoof.line;
}

TEST_F(IntegrationMalformed, GarbageToOurListenPortLeavesUsServing) {
  LocalBuffer mine(1 << 20);
  xfer::MemHandle h = 0;
  XT_ASSERT_OK(engine_.RegisterMem(mine.data(), mine.len(), xfer::MemType::kHost, &h, "ours"));
  SendAllBadInputs(PortOf(engine_.LocalName()));

  // Our outbound session survived, and the peer can use it to write into us.
  const uint64_t pbuf = peer_.Buf(mine.len());
  peer_.FillRange(pbuf, mine.len(), 63);
  Reply w = peer_.Xfer("write", engine_.LocalName(), 10000, pbuf, mine.addr(), mine.len());
  EXPECT_TRUE(w.ok) << w.line;
  LocalBuffer want(mine.len());
  want.Fill(63);
  EXPECT_EQ(mine.Hash(), want.Hash());

  // A second peer process connects to us afresh and writes.
  PeerProcess second;
  std::string err;
  ASSERT_TRUE(second.Start({}, &err)) << err;
  Reply c = second.Call("connect " + engine_.LocalName() + " 10000");
  ASSERT_TRUE(c.ok) << c.line;
  const uint64_t sbuf = second.Buf(4096);
  second.FillRange(sbuf, 4096, 64);
  w = second.Xfer("write", engine_.LocalName(), 10000, sbuf, mine.addr(), 4096);
  EXPECT_TRUE(w.ok) << w.line;
  LocalBuffer want2(4096);
  want2.Fill(64);
  EXPECT_EQ(Hash64(mine.data(), 4096), want2.Hash());
  XT_EXPECT_OK(engine_.DeregisterMem(h));
}

TEST_F(IntegrationMalformed, IdleAndHalfSentConnectionsDoNotBlockOthers) {
  // Three raw connections parked on the peer's port: silent, half a header, half a payload.
  RawConn silent(peer_.port());
  RawConn half_header(peer_.port());
  RawConn half_payload(peer_.port());
  ASSERT_TRUE(silent.connected() && half_header.connected() && half_payload.connected());
  std::vector<uint8_t> h = Header(kMagic, kVersion, kTypeHello, 64);
  half_payload.Send(std::vector<uint8_t>(h.begin(), h.end()));
  h.resize(7);
  half_header.Send(h);

  xfer::Engine fresh;
  XT_ASSERT_OK(fresh.Initialize("127.0.0.1:0"));
  const auto t0 = Clock::now();
  XT_ASSERT_OK(fresh.Connect(peer_.name(), 5s));
  EXPECT_LT(SecondsSince(t0), 3.0) << "a stalled raw connection delayed a real Connect";
  const PeerRegion r = peer_.Alloc(4096);
  LocalBuffer src(4096);
  src.Fill(65);
  XT_EXPECT_OK(fresh.TransferSync(peer_.name(), Op::kWrite, {{src.addr(), r.addr, 4096}}, 10s));
  EXPECT_EQ(peer_.Sum(r), src.Hash());
  // The existing session is unaffected too.
  XT_EXPECT_OK(Write({{src.addr(), r.addr, 4096}}, 10s));
}

TEST_F(IntegrationMalformed, ManyShortConnectionsLeaveThePeerServing) {
  for (int i = 0; i < 200; ++i) {
    RawConn c(peer_.port());
    ASSERT_TRUE(c.connected()) << "connection " << i << " refused: listener died?";
    if (i % 2 == 0) c.Send(Header(kMagic, kVersion, static_cast<uint16_t>(i), 3));
  }
  ASSERT_TRUE(peer_.Call("ping", 10s).ok);
  const PeerRegion r = peer_.Alloc(4096);
  LocalBuffer src(4096);
  src.Fill(66);
  XT_EXPECT_OK(Write({{src.addr(), r.addr, 4096}}, 10s));
  EXPECT_EQ(peer_.Sum(r), src.Hash());
}

}  // namespace
}  // namespace xfer_test

namespace xfer_test {
namespace {

// A session that said a proper hello, then sends a malformed notification frame: only that
// session is closed; the peer keeps serving others, notifications included.
TEST_F(IntegrationMalformed, BadNotificationFramesCloseOnlyTheirSession) {
  namespace wire = xfer::wire;
  auto payload_of = [](const wire::Message& m) {
    std::vector<uint8_t> f = wire::Encode(m);
    return std::vector<uint8_t>(f.begin() + wire::kHeaderSize, f.end());
  };
  auto frame = [](uint16_t type, const std::vector<uint8_t>& payload) {
    std::vector<uint8_t> b = Header(kMagic, kVersion, type, static_cast<uint32_t>(payload.size()));
    b.insert(b.end(), payload.begin(), payload.end());
    return b;
  };
  const uint16_t kNotify = static_cast<uint16_t>(wire::MsgType::kNotify);
  const uint16_t kAck = static_cast<uint16_t>(wire::MsgType::kNotifyAck);
  std::vector<std::pair<std::string, std::vector<uint8_t>>> bad;
  {
    std::vector<uint8_t> p;
    PutU64(&p, 1);
    PutU32(&p, wire::kMaxNotify + 1);  // a message past the cap (and past the frame)
    bad.push_back({"oversize message", frame(kNotify, p)});
  }
  {
    std::vector<uint8_t> p = payload_of(wire::Notify{2, "abc"});
    p.pop_back();
    bad.push_back({"truncated message", frame(kNotify, p)});
  }
  {
    std::vector<uint8_t> p = payload_of(wire::NotifyAck{3, xfer::StatusCode::kOk, ""});
    p[8] = 200;
    bad.push_back({"unknown status code", frame(kAck, p)});
  }
  bad.push_back({"answer to nothing", wire::Encode(wire::NotifyAck{77, xfer::StatusCode::kOk, ""})});
  // (well formed, but the peer did not ask for requests' begins and ends: notify.outcomes is off)
  bad.push_back({"begin not asked for", wire::Encode(wire::NotifyBegin{4, "x"})});
  bad.push_back(
      {"end not asked for", wire::Encode(wire::NotifyEnded{5, 4, xfer::NotifyOutcome::kFailed, {0}})});
  uint64_t incarnation = 0xbad0;
  for (const auto& [name, bytes] : bad) {
    SCOPED_TRACE(name);
    RawConn c(peer_.port());
    ASSERT_TRUE(c.connected());
    wire::Hello hello;
    hello.name = "127.0.0.1:" + std::to_string(UnusedPort());
    hello.incarnation = ++incarnation;
    hello.host_id = "another-host";
    hello.pid = 1;
    ASSERT_TRUE(c.Send(wire::Encode(hello)));
    ASSERT_TRUE(c.Send(bytes));
    EXPECT_TRUE(c.WaitClosed(5s)) << "the peer kept the session open";
  }
  ASSERT_TRUE(peer_.Call("ping", 10s).ok) << "the peer died from a malformed notification";
  XT_EXPECT_OK(engine_.SendNotify(peer_.name(), "still-here", 10s));
  const Reply got = peer_.Call("notifies");
  EXPECT_EQ(got.u64(0), 1u) << got.line;
}

}  // namespace
}  // namespace xfer_test
