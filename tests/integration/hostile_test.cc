// Peers that misbehave, and what the engine does about it while it keeps serving the others.
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <future>
#include <optional>
#include <sstream>
#include <thread>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/wait.h>

#include <csignal>

#include "control/session.h"
#include "raw_peer.h"
#include "test_common.h"
#include "transport/remote_region.h"
#include "transport/tcp/tcp_wire.h"
#include "util/host.h"
#include "util/net.h"

namespace xfer_test {
namespace {

using namespace std::chrono_literals;
namespace net = xfer::net;
namespace wire = xfer::wire;
using Clock = std::chrono::steady_clock;

// CPU seconds (user + system) the process has used.
double CpuSeconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));  // after "pid (comm) "
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

std::vector<net::Fd> Connections(const std::string& host, uint16_t port, int n) {
  std::vector<net::Fd> held;
  for (int i = 0; i < n; ++i) {
    net::Fd fd;
    // (The kernel completes the connect from its backlog, whether the engine accepts or not.)
    if (net::ConnectTcp(net::Address{host, port, true}, Clock::now() + 2s, &fd).ok())
      held.push_back(std::move(fd));
  }
  return held;
}

// Out of file descriptors, both listeners (control and tcp data) stay readable while accept
// fails with EMFILE: the engine must pause accepting, not spin on it, and serve again once
// descriptors are free.
TEST(Hostile, OutOfDescriptorsAnEnginePausesAcceptingInsteadOfSpinning) {
#if defined(__SANITIZE_ADDRESS__)
  // UBSan's vptr check opens a pipe to probe memory; with no descriptor left it reports every
  // virtual call as bad and stops the peer. The normal build runs this test.
  GTEST_SKIP() << "under the sanitizers: their runtime needs file descriptors of its own";
#endif
  PeerProcess peer;
  std::string error;
  PeerOptions few_fds;
  few_fds.extra_args = {"--fd-headroom", "6"};  // (then it runs out of descriptors soon)
  ASSERT_TRUE(peer.Start(few_fds, &error)) << error;
  // A control session of our own, for the peer's data port (no secret: its hello says it).
  net::Address a;
  ASSERT_TRUE(net::ParseAddress(peer.name(), &a).ok());
  net::Fd fd;
  ASSERT_TRUE(net::ConnectTcp(a, Clock::now() + 5s, &fd).ok());
  auto s = std::make_shared<xfer::control::Session>(std::move(fd), true, peer.name());
  wire::Hello h;
  h.name = "127.0.0.1:1";
  h.incarnation = 91;
  h.host_id = "elsewhere";
  ASSERT_TRUE(s->Send(h).ok());
  ASSERT_TRUE(s->FlushUntil(Clock::now() + 5s).ok());
  wire::Message reply;
  ASSERT_TRUE(s->ReadOne(Clock::now() + 5s, &reply).ok());
  uint16_t data_port = 0;
  for (const auto& b : std::get<wire::Hello>(reply).backends) {
    if (b.backend == "tcp" && b.bytes.size() == 2) std::memcpy(&data_port, b.bytes.data(), 2);
  }
  ASSERT_NE(data_port, 0);

  auto control = Connections("127.0.0.1", static_cast<uint16_t>(peer.port()), 40);
  auto data = Connections("127.0.0.1", data_port, 40);
  std::this_thread::sleep_for(500ms);  // its descriptors run out
  const double before = CpuSeconds(peer.pid());
  std::this_thread::sleep_for(1s);
  const double used = CpuSeconds(peer.pid()) - before;
  EXPECT_LT(used, 0.3) << "the engine used " << used
                       << " s of CPU in 1 s with its descriptors gone: it spins";

  control.clear();  // descriptors free again: a legitimate peer is served
  data.clear();
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1"));
  XT_EXPECT_OK(e.Connect(peer.name(), 10s));
}

// A raw control session to an engine, our hello sent.
std::shared_ptr<xfer::control::Session> Open(const std::string& engine, const wire::Hello& hello) {
  net::Address a;
  EXPECT_TRUE(net::ParseAddress(engine, &a).ok());
  net::Fd fd;
  EXPECT_TRUE(net::ConnectTcp(a, Clock::now() + 5s, &fd).ok());
  auto s = std::make_shared<xfer::control::Session>(std::move(fd), true, engine);
  EXPECT_TRUE(s->Send(hello).ok());
  EXPECT_TRUE(s->FlushUntil(Clock::now() + 5s).ok());
  return s;
}

// A raw control session to peer: sends hello, returns what came back until the peer closed
// (after `then`, when given, is sent once the peer's hello came).
std::vector<wire::Message> Session(const std::string& peer, const wire::Hello& hello,
                                   const std::optional<wire::Message>& then = std::nullopt) {
  auto s = Open(peer, hello);
  std::vector<wire::Message> got;
  wire::Message m;
  while (s->ReadOne(Clock::now() + 10s, &m).ok()) {
    got.push_back(m);
    if (then && std::holds_alternative<wire::Hello>(m)) {
      EXPECT_TRUE(s->Send(*then).ok());
      EXPECT_TRUE(s->FlushUntil(Clock::now() + 5s).ok());
    }
  }
  return got;
}

wire::WireRegion Region(uint64_t id, uint64_t addr, uint64_t len) {
  return {id, xfer::RegionInfo{addr, len, xfer::MemType::kHost, -1, "", false}, {}};
}

// A peer's region table is checked: a hello with a region of zero length, one that wraps, or
// two regions of one id, and a RegionAdd of an id already taken, close that session (before
// anything of ours is sent, for the hello), and the engine serves the others.
TEST(Hostile, ABadRegionTableClosesOnlyItsSession) {
  PeerProcess peer;
  std::string error;
  ASSERT_TRUE(peer.Start(PeerOptions{}, &error)) << error;
  auto hello = [](std::vector<wire::WireRegion> regions) {
    wire::Hello h;
    h.name = "127.0.0.1:1";
    h.incarnation = 92;
    h.host_id = "elsewhere";
    h.regions = std::move(regions);
    return h;
  };
  for (const auto& bad : {std::vector{Region(1, 0x1000, 0)}, std::vector{Region(1, ~0ull - 8, 16)},
                          std::vector{Region(1, 0x1000, 16), Region(1, 0x2000, 16)}}) {
    const auto got = Session(peer.name(), hello(bad));
    ASSERT_EQ(got.size(), 1u) << "only a goodbye may come back";
    ASSERT_TRUE(std::holds_alternative<wire::Goodbye>(got[0]));
    EXPECT_EQ(std::get<wire::Goodbye>(got[0]).reason.rfind("bad region table", 0), 0u);
  }
  const auto got = Session(peer.name(), hello({Region(1, 0x1000, 16)}),
                           wire::Message{wire::RegionAdd{Region(1, 0x5000, 16)}});
  ASSERT_FALSE(got.empty());
  EXPECT_TRUE(std::holds_alternative<wire::Hello>(got[0]));  // then it closed, after the duplicate id
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1"));
  XT_EXPECT_OK(e.Connect(peer.name(), 10s));
}

// A hello naming another engine but carrying the incarnation of a peer that has a session (or
// the engine's own) is refused: an incarnation keys that peer's data connections, and the
// impostor's session ending would drop them. The peer's transfers go on meanwhile and after.
TEST(Hostile, AHelloWithALivePeersIncarnationIsRefused) {
  PeerProcess peer;
  std::string error;
  ASSERT_TRUE(peer.Start(PeerOptions{}, &error)) << error;
  xfer::Engine e;
  xfer::EngineOptions o;
  o.transport = "tcp";  // (data connections keyed by incarnation)
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0", o));
  XT_ASSERT_OK(e.Connect(peer.name(), 10s));
  const PeerRegion r = peer.Alloc(1 << 20);
  LocalBuffer src(1 << 20);
  src.Fill(4);
  XT_ASSERT_OK(e.TransferSync(peer.name(), Op::kWrite, {{src.addr(), r.addr, src.len()}}, 10s));
  xfer::PeerInfo info;
  XT_ASSERT_OK(e.GetPeerInfo(peer.name(), &info));
  // The peer holds a session with e (e connected to it): an impostor at e's port.
  RawSession raw(e.LocalName());
  ExpectRefused(raw, HelloOf("127.0.0.1:9", info.incarnation), "incarnation in use");
  src.Fill(5);
  XT_EXPECT_OK(e.TransferSync(peer.name(), Op::kWrite, {{src.addr(), r.addr, src.len()}}, 10s));
  EXPECT_EQ(peer.Sum(r), src.Hash());
}

// A hello that takes the name of a peer whose session is alive, under a new incarnation: the
// "peer restarted" rule used to replace the live session, and the application's next WRITEs
// to that name went to the impostor. It is refused while the peer is heard from (a restart
// shows itself by the old session ending or falling silent); the peer keeps its name.
TEST(Hostile, AHelloTakingALivePeersNameIsRefused) {
  PeerProcess peer;
  std::string error;
  ASSERT_TRUE(peer.Start(PeerOptions{}, &error)) << error;
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0"));
  const Reply c = peer.Call("connect " + e.LocalName());  // the peer's session to us (inbound here)
  ASSERT_TRUE(c.ok) << c.line;
  ASSERT_TRUE(
      PollUntil([&] { return e.Connect(peer.name(), 1s).code() == StatusCode::kAlreadyConnected; }, 5s));
  xfer::PeerInfo info;
  XT_ASSERT_OK(e.GetPeerInfo(peer.name(), &info));
  RawSession raw(e.LocalName());
  ExpectRefused(raw, HelloOf(peer.name(), info.incarnation + 1), "name in use (its session is alive)");
  xfer::PeerInfo after;
  XT_ASSERT_OK(e.GetPeerInfo(peer.name(), &after));
  EXPECT_EQ(after.incarnation, info.incarnation) << "the name went to the impostor";
  const PeerRegion r = peer.Alloc(1 << 20);
  LocalBuffer src(1 << 20);
  src.Fill(6);
  XT_ASSERT_OK(e.TransferSync(peer.name(), Op::kWrite, {{src.addr(), r.addr, src.len()}}, 10s));
  EXPECT_EQ(peer.Sum(r), src.Hash());
}

net::Fd ConnectFrom(const char* source_ip, uint16_t port);  // (below)

// Peer processes named by a wildcard address ("0.0.0.0:port") are dialled at another one
// ("127.0.0.1:port"): our session to such a peer is under that key, and a hello with its name
// and incarnation (a session of its own to us) is under its name. Over tcp, whose data
// connections into us are keyed by the peer's incarnation.
PeerOptions WildcardPeer(const std::string& host_id) {
  PeerOptions o;
  o.name = "0.0.0.0:0";
  o.host_id = host_id;  // "": this host's (its process is then looked at); else another host
  o.extra_args = {"--transport", "tcp"};
  return o;
}

uint16_t PortIn(const std::string& name) {
  net::Address a;
  EXPECT_TRUE(net::ParseAddress(name, &a).ok()) << name;
  return a.port;
}
std::string Dialled(const PeerProcess& peer) { return "127.0.0.1:" + std::to_string(peer.port()); }

// The peer writes a pattern into `into` (a region of the engine `to`): whether it landed.
::testing::AssertionResult PeerWrites(PeerProcess& peer, const std::string& to, LocalBuffer& into,
                                      uint64_t seed) {
  const uint64_t from = peer.Buf(into.len());
  peer.FillRange(from, into.len(), seed);
  const Reply w = peer.Xfer("write", to, 10000, from, into.addr(), into.len());
  if (!w.ok) return ::testing::AssertionFailure() << "the peer's WRITE into us failed: " << w.line;
  LocalBuffer want(into.len());
  want.Fill(seed);
  if (into.Hash() != want.Hash()) return ::testing::AssertionFailure() << "the peer's WRITE did not land";
  return ::testing::AssertionSuccess();
}

// A peer named by a wildcard (host_id: as WildcardPeer's), and a tcp engine named `name` that
// dialled it at 127.0.0.1.
struct DialledWildcard {
  PeerProcess peer;
  xfer::Engine e;
  ::testing::AssertionResult Start(const std::string& host_id, const std::string& name) {
    std::string error;
    if (!peer.Start(WildcardPeer(host_id), &error)) return ::testing::AssertionFailure() << error;
    xfer::EngineOptions o;
    o.transport = "tcp";
    if (xfer::Status s = e.Initialize(name, o); !s.ok()) return ::testing::AssertionFailure() << s.ToString();
    if (xfer::Status s = e.Connect(Dialled(peer), 10s); !s.ok())
      return ::testing::AssertionFailure() << s.ToString();
    return ::testing::AssertionSuccess();
  }
};

// The peer still WRITEs into `mine` (registered as h, at our name; seed: the pattern's), and
// we into it over our session to it; then h is deregistered.
void ExpectDataFlowsBothWays(PeerProcess& peer, xfer::Engine& e, LocalBuffer& mine, xfer::MemHandle h,
                             uint64_t seed) {
  EXPECT_TRUE(PeerWrites(peer, e.LocalName(), mine, seed));
  const PeerRegion r = peer.Alloc(1 << 20);
  LocalBuffer src(1 << 20);
  src.Fill(seed + 1);
  XT_EXPECT_OK(e.TransferSync(Dialled(peer), Op::kWrite, {{src.addr(), r.addr, src.len()}}, 10s));
  EXPECT_EQ(peer.Sum(r), src.Hash());
  XT_EXPECT_OK(e.DeregisterMem(h));
}

// A hello with the name and incarnation of a peer we dialled at another address than its name
// was taken for that peer's own session to us (the same engine under another key), from
// anyone: the impostor was accepted with the peer's incarnation, and when its session ended,
// the peer's data connections into us (keyed by that incarnation) were closed, its next WRITE
// into us failing. Such a hello is now that engine's only when it comes from it: from its
// process where it is on this host, else from the host we reach it at (127.0.0.2 is another).
TEST(Hostile, AHelloAsAPeerWeDialledElsewhereIsRefusedFromAnotherProcessOrHost) {
  for (const std::string host_id : {"", "another-host"}) {
    SCOPED_TRACE(host_id.empty() ? "the peer on this host" : "the peer on another host");
    DialledWildcard pair;
    ASSERT_TRUE(pair.Start(host_id, "127.0.0.1:0"));
    PeerProcess& peer = pair.peer;
    xfer::Engine& e = pair.e;
    xfer::PeerInfo info;
    XT_ASSERT_OK(e.GetPeerInfo(Dialled(peer), &info));
    ASSERT_EQ(info.name, peer.name());
    LocalBuffer mine(1 << 20);
    xfer::MemHandle h = 0;
    XT_ASSERT_OK(e.RegisterMem(mine.data(), mine.len(), xfer::MemType::kHost, &h));
    EXPECT_TRUE(PeerWrites(peer, e.LocalName(), mine, 1));

    RawSession raw(e.LocalName());
    if (!host_id.empty()) {  // (from this host, it would pass for the peer's)
      net::Fd other = ConnectFrom("127.0.0.2", PortIn(e.LocalName()));
      if (!other.valid()) GTEST_SKIP() << "cannot bind 127.0.0.2 (a second loopback address)";
      raw.s = std::make_shared<xfer::control::Session>(std::move(other), true, e.LocalName());
    }
    ExpectRefused(raw, HelloOf(peer.name(), info.incarnation), "incarnation in use");
    raw.s->Close();
    // (Once e is done with the impostor's session, whatever it made of it.)
    EXPECT_TRUE(PollUntil(
        [&] {
          xfer::PeerInfo impostor;
          return e.GetPeerInfo(peer.name(), &impostor).code() == StatusCode::kNotConnected;
        },
        5s));
    ExpectDataFlowsBothWays(peer, e, mine, h, 2);
  }
}

// What the exception above is for: the peer we dialled at another address than its name (both
// named by wildcards here) opens a session of its own to us, at another address than our name.
// Both sessions stay, each under its key with the peer's incarnation, and one of them ending
// leaves the other's data connections alone (before, its drop closed every data connection of
// that incarnation: the peer's next WRITE into us over the other session failed).
TEST(Hostile, APeerWeDialledElsewhereMayOpenASessionOfItsOwn) {
  for (const std::string host_id : {"", "another-host"}) {
    SCOPED_TRACE(host_id.empty() ? "the peer on this host" : "the peer on another host");
    DialledWildcard pair;
    ASSERT_TRUE(pair.Start(host_id, "0.0.0.0:0"));
    PeerProcess& peer = pair.peer;
    xfer::Engine& e = pair.e;
    const std::string us = "127.0.0.1:" + std::to_string(PortIn(e.LocalName()));
    const Reply c = peer.Call("connect " + us);  // (its session to e: under e's name, it has ours)
    ASSERT_TRUE(c.ok) << c.line;
    xfer::PeerInfo dialled, its_own;
    XT_ASSERT_OK(e.GetPeerInfo(Dialled(peer), &dialled));
    XT_ASSERT_OK(e.GetPeerInfo(peer.name(), &its_own));
    EXPECT_EQ(dialled.incarnation, its_own.incarnation);
    EXPECT_TRUE(dialled.outbound);
    EXPECT_FALSE(its_own.outbound);
    LocalBuffer mine(1 << 20);
    xfer::MemHandle h = 0;
    XT_ASSERT_OK(e.RegisterMem(mine.data(), mine.len(), xfer::MemType::kHost, &h));
    EXPECT_TRUE(PeerWrites(peer, us, mine, 1));
    EXPECT_TRUE(PeerWrites(peer, e.LocalName(), mine, 2));

    const Reply d = peer.Call("disconnect " + us);
    ASSERT_TRUE(d.ok) << d.line;
    EXPECT_TRUE(PollUntil(
        [&] { return e.GetPeerInfo(peer.name(), &its_own).code() == StatusCode::kNotConnected; }, 5s));
    ExpectDataFlowsBothWays(peer, e, mine, h, 3);
  }
}

// An impostor that says hello with a peer's incarnation before we have a session with that
// peer gets in (nothing tells it apart yet), and our own Connect to the peer still does. When
// the impostor's session ended, the peer's data connections into us (keyed by the incarnation)
// were closed with it, and the peer's next WRITE into us failed; they now stay while the
// peer's own session lives.
TEST(Hostile, AnImpostorWithAPeersIncarnationCutsNoneOfItsDataConnections) {
  PeerOptions po;
  po.extra_args = {"--transport", "tcp"};
  PeerProcess peer;
  std::string error;
  ASSERT_TRUE(peer.Start(po, &error)) << error;
  uint64_t incarnation = 0;
  {
    RawSession ask(peer.name());  // (its hello says it)
    incarnation = ask.Hello(HelloOf("127.0.0.1:9", 4242)).incarnation;
    ask.s->Close();
  }
  ASSERT_NE(incarnation, 0u);
  xfer::Engine e;
  xfer::EngineOptions o;
  o.transport = "tcp";
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0", o));
  RawSession impostor(e.LocalName());
  ASSERT_FALSE(impostor.Hello(HelloOf("127.0.0.1:10", incarnation)).name.empty())
      << "the impostor was refused";
  XT_ASSERT_OK(e.Connect(peer.name(), 10s));
  LocalBuffer mine(1 << 20);
  xfer::MemHandle h = 0;
  XT_ASSERT_OK(e.RegisterMem(mine.data(), mine.len(), xfer::MemType::kHost, &h));
  EXPECT_TRUE(PeerWrites(peer, e.LocalName(), mine, 1));
  impostor.s->Close();
  EXPECT_TRUE(PollUntil(
      [&] {
        xfer::PeerInfo gone;
        return e.GetPeerInfo("127.0.0.1:10", &gone).code() == StatusCode::kNotConnected;
      },
      5s));
  EXPECT_TRUE(PeerWrites(peer, e.LocalName(), mine, 2));
  XT_EXPECT_OK(e.DeregisterMem(h));
}

// A raw control session to an engine: our hello out, its hello back (the session stays open).
std::shared_ptr<xfer::control::Session> Hello(const std::string& engine, const wire::Hello& hello,
                                              wire::Hello* reply) {
  auto s = Open(engine, hello);
  wire::Message m;
  EXPECT_TRUE(s->ReadOne(Clock::now() + 5s, &m).ok());
  if (auto* h = std::get_if<wire::Hello>(&m)) *reply = *h;
  return s;
}

// Reads frames until one of type T comes (other frames are skipped), the session ends or the
// deadline passes.
template <class T>
std::optional<T> Await(xfer::control::Session& s, Clock::time_point deadline) {
  for (wire::Message m; s.ReadOne(deadline, &m).ok();) {
    if (auto* t = std::get_if<T>(&m)) return *t;
  }
  return std::nullopt;
}

// A WRITE frame that waited in the target's socket while the target could not read it (stopped
// here; in life: every serve thread busy), after which its initiator reset the connection (it
// gave up on the batch, and may have sent it again elsewhere): the target drops it, and the
// memory keeps what it held. (The kernel hands over bytes queued before a reset.)
TEST(Hostile, AFrameReadAfterItsConnectionWasResetIsDropped) {
  PeerProcess peer;
  std::string err;
  ASSERT_TRUE(peer.Start(Stoppable({}), &err)) << err;
  const PeerRegion r = peer.Alloc(4096);
  const uint64_t before = peer.SumRange(r.addr, 4096);
  const wire::Hello me = HelloOf("127.0.0.1:7", 97);
  RawSession raw(peer.name());
  const wire::Hello theirs = raw.Hello(me);
  ASSERT_FALSE(theirs.name.empty());
  net::Fd data;
  uint32_t verdict = 1;
  ASSERT_TRUE(OpenDataConnection(theirs, me.incarnation, "", &data, &verdict) && verdict == 0);
  peer.Signal(SIGSTOP);
  std::vector<uint8_t> frame = WriteFrameHead(r.addr, 4096);
  frame.resize(frame.size() + 4096, 0xAB);
  frame.resize(frame.size() + xfer::transport::tcp_wire::PadFor(frame.size(), 0), 0);
  ASSERT_TRUE(net::SendAll(data.get(), frame.data(), frame.size(), Clock::now() + 5s).ok());
  const linger reset{1, 0};  // (closed with a reset, as Stream::Abort leaves a connection)
  ASSERT_EQ(::setsockopt(data.get(), SOL_SOCKET, SO_LINGER, &reset, sizeof reset), 0);
  data.Reset();
  std::this_thread::sleep_for(50ms);
  peer.Signal(SIGCONT);
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(peer.SumRange(r.addr, 4096), before) << "a frame its initiator gave up on landed";
}

// Peers that start WRITEs into a region and trickle their payload, one byte every 100 ms,
// each connection starting 0.9 s after the one before, and that never confirm the region's
// removal: DeregisterMem still returns within the heartbeat timeout (1 s), closing what it
// must (before: it waited for one connection after the other, then a heartbeat timeout more
// for the confirmation, ~3.8 s). A legitimate peer is served meanwhile and after.
TEST(Hostile, DeregisterMemReturnsWithinTheHeartbeatTimeoutWhilePeersTrickle) {
  xfer::EngineOptions o;
  o.heartbeat_timeout = 1000ms;
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0", o));
  LocalBuffer region(1 << 20), other(1 << 20), src(4096);
  src.Fill(8);
  xfer::MemHandle h = 0, keep = 0;
  XT_ASSERT_OK(e.RegisterMem(region.data(), region.len(), xfer::MemType::kHost, &h));
  XT_ASSERT_OK(e.RegisterMem(other.data(), other.len(), xfer::MemType::kHost, &keep));
  const wire::Hello trickler = HelloOf("127.0.0.1:5", 96);
  wire::Hello theirs;
  auto session = Hello(e.LocalName(), trickler, &theirs);
  ASSERT_FALSE(theirs.name.empty());
  std::vector<net::Fd> data(3);
  for (auto& fd : data) {
    uint32_t verdict = 1;
    ASSERT_TRUE(OpenDataConnection(theirs, trickler.incarnation, "", &fd, &verdict) && verdict == 0);
  }
  const auto frame = WriteFrameHead(region.addr(), 4096);  // (its payload: trickled)
  const auto t0 = Clock::now();
  std::atomic<bool> done{false};
  double took = 0;
  std::thread deregister;
  size_t started = 0;
  while (!done.load() && SecondsSince(t0) < 8) {
    if (started < data.size() && SecondsSince(t0) >= 0.9 * static_cast<double>(started)) {
      EXPECT_TRUE(net::SendAll(data[started++].get(), frame.data(), frame.size(), Clock::now() + 1s).ok());
    }
    for (size_t i = 0; i < started; ++i) ::send(data[i].get(), "x", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)session->Send(wire::Heartbeat{});  // (the session itself stays alive)
    (void)session->FlushUntil(Clock::now() + 100ms);
    if (!deregister.joinable() && SecondsSince(t0) >= 0.1) {
      deregister = std::thread([&] {
        const auto d0 = Clock::now();
        XT_EXPECT_OK(e.DeregisterMem(h));
        took = SecondsSince(d0);
        done.store(true);
      });
    }
    std::this_thread::sleep_for(100ms);
  }
  deregister.join();
  EXPECT_LT(took, 1.8) << "DeregisterMem waited past the heartbeat timeout";
  data.clear();
  xfer::Engine legit;
  XT_ASSERT_OK(legit.Initialize("127.0.0.1"));
  XT_ASSERT_OK(legit.Connect(e.LocalName(), 10s));
  XT_EXPECT_OK(legit.TransferSync(e.LocalName(), Op::kWrite, {{src.addr(), other.addr(), src.len()}}, 10s));
  EXPECT_EQ(std::memcmp(other.data(), src.data(), src.len()), 0);
}

// A peer whose hello offers a tcp data port where it answers the handshake and then reads
// nothing, while its control session stays alive (a heartbeat every 200 ms): the batches we
// send it stall. Its one region: 1 GiB at 1 << 40.
class StallingPeer {
 public:
  static constexpr uint64_t kRegion = 1ull << 40;
  explicit StallingPeer(const std::string& engine) {
    net::Address bound;
    EXPECT_TRUE(net::Listen(net::Address{"127.0.0.1", 0, true}, &listener_, &bound).ok());
    int small = 4096;  // (inherited by the accepted connections: the sockets hold little)
    ::setsockopt(listener_.get(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    accepter_ = std::thread([this] {
      while (!stop_) {
        pollfd p{listener_.get(), POLLIN, 0};
        if (::poll(&p, 1, 50) != 1) continue;
        net::Fd fd(::accept(listener_.get(), nullptr, nullptr));
        uint8_t hello[xfer::transport::tcp_wire::kHelloBytes];
        uint8_t accepted[xfer::transport::tcp_wire::kAcceptBytes] = {};
        if (net::RecvAll(fd.get(), hello, sizeof hello, Clock::now() + 5s).ok()) {
          (void)net::SendAll(fd.get(), accepted, sizeof accepted, Clock::now() + 5s);
        }
        held_.push_back(std::move(fd));
      }
    });
    wire::Hello h = HelloOf(name(), 97);
    h.backends = {{"tcp", std::string(reinterpret_cast<const char*>(&bound.port), sizeof bound.port)}};
    h.regions = {Region(1, kRegion, 1ull << 30)};
    wire::Hello theirs;
    session_ = Hello(engine, h, &theirs);
    EXPECT_FALSE(theirs.name.empty());
    beat_ = std::thread([this] {
      while (!stop_) {
        (void)session_->Send(wire::Heartbeat{});
        std::this_thread::sleep_for(200ms);
      }
    });
  }
  ~StallingPeer() {
    stop_ = true;
    accepter_.join();
    beat_.join();
  }
  static std::string name() { return "127.0.0.1:7"; }

 private:
  net::Fd listener_;
  std::vector<net::Fd> held_;
  std::shared_ptr<xfer::control::Session> session_;
  std::atomic<bool> stop_{false};
  std::thread accepter_, beat_;
};

// Batches that a peer stalls (StallingPeer) hold no fence past its deadline: a legitimate
// peer's deregistration, which our control thread fences, is confirmed within a quarter of
// the heartbeat timeout (2 s), and our own DeregisterMem returns within the heartbeat timeout;
// each time the stalled batch is interrupted and its request fails. Before: each fence waited
// for the stalled frame's send to time out (two heartbeat timeouts), the legitimate peer gave
// up on the confirmation and cut the session off, and DeregisterMem took ~3.7 s.
TEST(Hostile, BatchesAPeerStallsHoldNoFencePastItsDeadline) {
  xfer::EngineOptions o;
  o.heartbeat_timeout = 2000ms;
  xfer::Engine e, legit;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0", o));
  XT_ASSERT_OK(legit.Initialize("127.0.0.1:0", o));
  LocalBuffer src(64 << 20), theirs(4096);
  xfer::MemHandle h = 0, their_h = 0;
  XT_ASSERT_OK(e.RegisterMem(src.data(), src.len(), xfer::MemType::kHost, &h));
  XT_ASSERT_OK(legit.RegisterMem(theirs.data(), theirs.len(), xfer::MemType::kHost, &their_h));
  XT_ASSERT_OK(legit.Connect(e.LocalName(), 10s));
  StallingPeer stalling(e.LocalName());
  auto stall = [&] {  // a 64 MiB WRITE that fills the sockets, then stalls
    xfer::RequestHandle r = 0;
    XT_EXPECT_OK(e.TransferAsync(StallingPeer::name(), Op::kWrite,
                                 {{src.addr(), StallingPeer::kRegion, src.len()}}, 60s, &r));
    std::this_thread::sleep_for(300ms);
    xfer::RequestStatus st;
    XT_EXPECT_OK(e.GetTransferStatus(r, &st));
    EXPECT_EQ(st.state, RequestState::kWaiting) << "the WRITE did not stall: " << st.status.ToString();
    return r;
  };
  auto lost = [&](xfer::RequestHandle r) {
    const xfer::Status s = e.Wait(r, 10s);
    EXPECT_EQ(s.code(), StatusCode::kConnectionLost) << s.ToString();
    return s.message();
  };

  auto r = stall();
  auto t0 = Clock::now();
  XT_EXPECT_OK(legit.DeregisterMem(their_h));
  EXPECT_LT(SecondsSince(t0), 1.4) << "our control thread held a peer's deregistration";
  xfer::PeerInfo info;
  EXPECT_TRUE(legit.GetPeerInfo(e.LocalName(), &info).ok()) << "the legitimate peer cut us off";
  EXPECT_NE(lost(r).find("interrupted"), std::string::npos);

  // Callers on 16 threads send 1 MiB each: more than the sockets hold, so some frames stall
  // in their send (a step of two heartbeat timeouts), behind them the rest.
  std::vector<std::thread> callers;
  std::atomic<int> failed{0};
  for (uint64_t i = 0; i < 16; ++i) {
    callers.emplace_back([&, i] {
      const uint64_t off = i << 20;
      const auto s = e.TransferSync(StallingPeer::name(), Op::kWrite,
                                    {{src.addr() + off, StallingPeer::kRegion + off, 1 << 20}}, 60s);
      if (s.code() == StatusCode::kConnectionLost) ++failed;
    });
  }
  std::this_thread::sleep_for(500ms);
  t0 = Clock::now();
  XT_EXPECT_OK(e.DeregisterMem(h));
  EXPECT_LT(SecondsSince(t0), 3.3) << "DeregisterMem waited for a stalled batch";
  for (auto& c : callers) c.join();
  EXPECT_EQ(failed.load(), 16);
}

// A peer we dialled sends its hello once: a second one, once its session is the control
// loop's, closes the session (as on a session it opened: no goodbye, the connection closes).
// Before, each was decoded, prepared on the loop's worker (up to 64 MiB, holding back other
// peers' big hellos) and dropped.
TEST(Hostile, APeerWeDialledSaysHelloOnce) {
  xfer::EngineOptions o;
  o.heartbeat_timeout = 20s;  // (this side sends none)
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0", o));
  net::Fd listener;
  net::Address bound;
  ASSERT_TRUE(net::Listen(net::Address{"127.0.0.1", 0, true}, &listener, &bound).ok());
  const std::string name = "127.0.0.1:" + std::to_string(bound.port);
  xfer::Status connected;
  std::thread dial([&] { connected = e.Connect(name, 10s); });
  pollfd p{listener.get(), POLLIN, 0};
  net::Fd fd(::poll(&p, 1, 10000) == 1 ? ::accept(listener.get(), nullptr, nullptr) : -1);
  if (!fd.valid()) dial.join();
  ASSERT_TRUE(fd.valid());
  auto s = std::make_shared<xfer::control::Session>(std::move(fd), false, name);
  wire::Message m;
  const bool hello = s->ReadOne(Clock::now() + 10s, &m).ok() && std::holds_alternative<wire::Hello>(m);
  wire::Hello ours = HelloOf(name, 0x77);
  ours.backends = {{"tcp", std::string(reinterpret_cast<const char*>(&bound.port), sizeof bound.port)}};
  if (hello) EXPECT_TRUE(s->Send(ours).ok() && s->FlushUntil(Clock::now() + 5s).ok());
  dial.join();
  ASSERT_TRUE(hello) << "the engine sent no hello";
  XT_ASSERT_OK(connected);
  ASSERT_TRUE(s->Send(ours).ok());
  ASSERT_TRUE(s->FlushUntil(Clock::now() + 5s).ok());
  const auto t0 = Clock::now();
  xfer::Status read;
  while ((read = s->ReadOne(t0 + 5s, &m)).ok()) {
  }
  EXPECT_NE(read.code(), StatusCode::kTimeout) << "the session stayed open: " << read.ToString();
  EXPECT_LT(SecondsSince(t0), 2.0);
}

// A peer's removal of a region it never had is answered at once: nothing fences for it, so a
// stream of them does not hold the control thread, and the batch another peer stalls goes on
// waiting. Before, each fenced every batch to that peer (here for a quarter of the heartbeat
// timeout, 2 s), and the first interrupted the stalled one.
TEST(Hostile, ARemovalOfAnUnknownRegionFencesNothing) {
  xfer::EngineOptions o;
  o.heartbeat_timeout = 8000ms;
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0", o));
  LocalBuffer src(64 << 20);
  xfer::MemHandle h = 0;
  XT_ASSERT_OK(e.RegisterMem(src.data(), src.len(), xfer::MemType::kHost, &h));
  StallingPeer stalling(e.LocalName());
  RawSession raw(e.LocalName());
  ASSERT_FALSE(raw.Hello(HelloOf("10.9.8.7:6000", 0x5eed)).name.empty());
  xfer::RequestHandle r = 0;
  XT_ASSERT_OK(e.TransferAsync(StallingPeer::name(), Op::kWrite,
                               {{src.addr(), StallingPeer::kRegion, src.len()}}, 60s, &r));
  std::this_thread::sleep_for(300ms);  // (it fills the sockets, then stalls)
  const auto t0 = Clock::now();
  for (uint64_t seq = 1; seq <= 3; ++seq) raw.Send(wire::RegionRemove{999 + seq, seq});
  int acks = 0;
  wire::Message m;
  for (auto until = Clock::now() + 20s; acks < 3 && raw.s->ReadOne(until, &m).ok();) {
    acks += std::holds_alternative<wire::RegionRemoveAck>(m);
  }
  EXPECT_EQ(acks, 3);
  EXPECT_LT(SecondsSince(t0), 1.0) << "the removals of unknown regions were fenced";
  xfer::RequestStatus st;
  XT_EXPECT_OK(e.GetTransferStatus(r, &st));
  EXPECT_EQ(st.state, RequestState::kWaiting) << "the stalled WRITE ended: " << st.status.ToString();
  (void)e.Cancel(r);
}

// A peer that reads nothing of its control connection, then says goodbye and asks for the
// answer: the engine answers if the socket takes it at once, else closes the session without
// it; its control thread does not wait on that peer (before: up to a heartbeat timeout, 4 s
// here, while a newcomer's Connect waited too).
TEST(Hostile, AGoodbyeFromAPeerThatReadsNothingHoldsNoControlThread) {
  xfer::EngineOptions o;
  o.heartbeat_timeout = 4000ms;
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0", o));
  const wire::Hello ours = HelloOf("127.0.0.1:8", 98);
  wire::Hello theirs;
  auto s = Hello(e.LocalName(), ours, &theirs);
  ASSERT_FALSE(theirs.name.empty());
  int small = 4096;
  ::setsockopt(s->fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  // 2,000 regions with 4 KB tags: ~8 MB of announcements, more than the sockets hold.
  LocalBuffer many(2000 * 4096);
  const std::string tag(4000, 't');
  for (uint64_t off = 0; off < many.len(); off += 4096) {
    xfer::MemHandle h = 0;
    XT_ASSERT_OK(e.RegisterMem(many.data() + off, 4096, xfer::MemType::kHost, &h, tag));
  }
  xfer::PeerInfo info;
  ASSERT_TRUE(e.GetPeerInfo(ours.name, &info).ok()) << "closed before the goodbye";
  ASSERT_TRUE(s->Send(wire::Goodbye{"leaving", 1}).ok());
  std::this_thread::sleep_for(100ms);  // (the control thread takes it)
  const auto t0 = Clock::now();
  xfer::Engine newcomer;
  XT_ASSERT_OK(newcomer.Initialize("127.0.0.1"));
  XT_EXPECT_OK(newcomer.Connect(e.LocalName(), 10s));
  EXPECT_LT(SecondsSince(t0), 2.0) << "the control thread waited on the peer that reads nothing";
  EXPECT_TRUE(PollUntil([&] { return !e.GetPeerInfo(ours.name, &info).ok(); }, 2s))
      << "the session of the peer that said goodbye stayed";
}

// EngineOptions::max_sessions caps the sessions both ways: a hello past it gets a goodbye
// that the peer's Connect reports as RESOURCE_EXHAUSTED, as does a Connect of our own; a
// session that ends makes room.
TEST(Hostile, SessionsAreCappedAtMaxSessions) {
  xfer::EngineOptions o;
  o.max_sessions = 2;
  xfer::Engine e, a, b, c;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0", o));
  for (auto* p : {&a, &b, &c}) XT_ASSERT_OK(p->Initialize("127.0.0.1:0"));
  XT_ASSERT_OK(a.Connect(e.LocalName(), 10s));
  XT_ASSERT_OK(b.Connect(e.LocalName(), 10s));
  auto refused = [](const xfer::Status& s) {
    EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
    EXPECT_NE(s.message().find("max_sessions"), std::string::npos) << s.ToString();
  };
  refused(c.Connect(e.LocalName(), 10s));
  refused(e.Connect(c.LocalName(), 10s));
  XT_ASSERT_OK(a.Disconnect(e.LocalName()));
  EXPECT_TRUE(PollUntil([&] { return c.Connect(e.LocalName(), 10s).ok(); }, 5s))
      << "the session that ended made no room";
  xfer::EngineOptions bad;
  bad.max_sessions = 0;
  xfer::Engine none;
  EXPECT_EQ(none.Initialize("127.0.0.1:0", bad).code(), StatusCode::kInvalidArgument);
}

// A connection to 127.0.0.1:port from source_ip: another loopback address stands for another
// host (an invalid Fd when source_ip cannot be bound).
net::Fd ConnectFrom(const char* source_ip, uint16_t port) {
  net::Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in from{}, to{};
  from.sin_family = to.sin_family = AF_INET;
  ::inet_pton(AF_INET, source_ip, &from.sin_addr);
  ::inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  to.sin_port = htons(port);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&from), sizeof from) != 0) return net::Fd();
  EXPECT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&to), sizeof to), 0) << std::strerror(errno);
  ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) | O_NONBLOCK);
  return fd;
}

// EngineOptions::max_sessions_per_host: one host's sessions past it are refused, a peer from
// another host still gets in, our own Connects are not counted, and a session that ends makes
// room. (Before, one host could open every session max_sessions allows.)
TEST(Hostile, OneHostOpensAtMostItsSessions) {
  xfer::EngineOptions o;
  o.max_sessions_per_host = 2;
  xfer::Engine e, a, b, c, out;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0", o));
  for (auto* p : {&a, &b, &c, &out}) XT_ASSERT_OK(p->Initialize("127.0.0.1:0"));
  XT_ASSERT_OK(a.Connect(e.LocalName(), 10s));
  XT_ASSERT_OK(b.Connect(e.LocalName(), 10s));
  const xfer::Status third = c.Connect(e.LocalName(), 10s);
  EXPECT_EQ(third.code(), StatusCode::kResourceExhausted) << third.ToString();
  EXPECT_NE(third.message().find("max_sessions_per_host"), std::string::npos) << third.ToString();
  XT_EXPECT_OK(e.Connect(out.LocalName(), 10s));  // (ours: not the host's)
  net::Address control;
  ASSERT_TRUE(net::ParseAddress(e.LocalName(), &control).ok());
  net::Fd other = ConnectFrom("127.0.0.2", control.port);
  if (!other.valid()) GTEST_SKIP() << "cannot bind 127.0.0.2 (a second loopback address)";
  auto from_other = std::make_shared<xfer::control::Session>(std::move(other), true, e.LocalName());
  ASSERT_TRUE(from_other->Send(HelloOf("127.0.0.2:10", 77)).ok());
  ASSERT_TRUE(from_other->FlushUntil(Clock::now() + 5s).ok());
  wire::Message reply;
  ASSERT_TRUE(from_other->ReadOne(Clock::now() + 5s, &reply).ok());
  EXPECT_TRUE(std::holds_alternative<wire::Hello>(reply)) << "a peer from another host was refused";
  XT_ASSERT_OK(a.Disconnect(e.LocalName()));
  EXPECT_TRUE(PollUntil([&] { return c.Connect(e.LocalName(), 10s).ok(); }, 5s))
      << "the session that ended made no room";
}

// More connections than a listener lets wait for their handshake, all from one host, arrive
// after a newcomer from another host connected and before it spoke: the listener closes the
// flood's connections for the new ones, not the newcomer's, on the control port (256 pending)
// and on the tcp data port (64). Before: the oldest went, the newcomer first.
TEST(Hostile, AFloodFromOneHostShutsOutNoNewcomerFromAnother) {
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0"));
  net::Address control;
  ASSERT_TRUE(net::ParseAddress(e.LocalName(), &control).ok());
  net::Fd newcomer = ConnectFrom("127.0.0.2", control.port);
  if (!newcomer.valid())
    GTEST_SKIP() << "cannot bind 127.0.0.2 (a second loopback address): " << std::strerror(errno);
  auto session = std::make_shared<xfer::control::Session>(std::move(newcomer), true, e.LocalName());
  std::this_thread::sleep_for(200ms);  // (accepted first: the oldest)
  auto flood = Connections("127.0.0.1", control.port, 300);
  std::this_thread::sleep_for(500ms);  // (all accepted)
  const wire::Hello ours = HelloOf("127.0.0.2:10", 99);
  ASSERT_TRUE(session->Send(ours).ok());
  ASSERT_TRUE(session->FlushUntil(Clock::now() + 5s).ok());
  wire::Message reply;
  ASSERT_TRUE(session->ReadOne(Clock::now() + 5s, &reply).ok()) << "the newcomer's connection was closed";
  ASSERT_TRUE(std::holds_alternative<wire::Hello>(reply));
  const auto& theirs = std::get<wire::Hello>(reply);

  net::Fd data = ConnectFrom("127.0.0.2", DataPortOf(theirs));
  std::this_thread::sleep_for(200ms);
  auto data_flood = Connections("127.0.0.1", DataPortOf(theirs), 100);
  std::this_thread::sleep_for(500ms);
  const auto hello = xfer::transport::tcp_wire::DataHello(theirs.incarnation, ours.incarnation);
  ASSERT_TRUE(net::SendAll(data.get(), hello.data(), hello.size(), Clock::now() + 5s).ok());
  uint8_t verdict[xfer::transport::tcp_wire::kAcceptBytes];
  ASSERT_TRUE(net::RecvAll(data.get(), verdict, sizeof verdict, Clock::now() + 5s).ok())
      << "the newcomer's data connection was closed";
  EXPECT_EQ(xfer::transport::tcp_wire::Get<uint32_t>(verdict), 0u);
}

// The threads a process's status line counts.
int ThreadsOf(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

// Issue 42's attack at its scale: from one host (127.0.0.2), five sessions open 220 tcp data
// connections each and keep a WRITE frame trickling on every one (a byte every 200 ms, each
// frame within the 3 s a frame may take). The target's serve threads stay within that host's
// share (before: 1,029 threads, every one it may start) and a legitimate peer from another host
// keeps transferring, verified; its throughput beside the attack is printed against its own
// just before.
TEST(Hostile, OneHostsManySessionsTakeOnlyItsShareOfTheServeThreads) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "a thousand connections and their threads under the sanitizers: the normal build runs it";
#endif
  PeerProcess target;
  std::string error;
  PeerOptions elsewhere;
  elsewhere.host_id = "target-host";  // (the legitimate peer then takes tcp)
  ASSERT_TRUE(target.Start(elsewhere, &error)) << error;
  if (!ConnectFrom("127.0.0.2", static_cast<uint16_t>(target.port())).valid())
    GTEST_SKIP() << "cannot bind 127.0.0.2 (a second loopback address)";
  const PeerRegion pool = target.Alloc(4 << 20), bait = target.Alloc(1 << 20);
  xfer::Engine legit;
  XT_ASSERT_OK(legit.Initialize("127.0.0.1"));
  XT_ASSERT_OK(legit.Connect(target.name(), 10s));
  xfer::PeerInfo info;
  XT_ASSERT_OK(legit.GetPeerInfo(target.name(), &info));
  ASSERT_EQ(info.transport, "tcp");
  LocalBuffer src(4 << 20), back(4 << 20);
  int failures = 0;
  auto legit_mbps = [&](double seconds) {  // WRITE then READ back 4 MiB, verified, for that long
    uint64_t bytes = 0;
    const auto t0 = Clock::now();
    for (uint64_t seed = 1; SecondsSince(t0) < seconds; ++seed) {
      src.Fill(seed);
      const bool ok =
          legit.TransferSync(target.name(), Op::kWrite, {{src.addr(), pool.addr, src.len()}}, 10s).ok() &&
          legit.TransferSync(target.name(), Op::kRead, {{back.addr(), pool.addr, back.len()}}, 10s).ok() &&
          back.Hash() == src.Hash();
      failures += ok ? 0 : 1;
      bytes += ok ? 2 * src.len() : 0;
    }
    return static_cast<double>(bytes) / 1e6 / SecondsSince(t0);
  };
  const double before = legit_mbps(1.5);

  constexpr int kSessions = 5, kConnections = 220, kPayload = 12;
  std::vector<std::shared_ptr<xfer::control::Session>> sessions;
  std::vector<net::Fd> data;
  for (int i = 0; i < kSessions; ++i) {
    const wire::Hello ours = HelloOf("127.0.0.2:" + std::to_string(600 + i), 600 + i);
    wire::Hello theirs;
    sessions.push_back(Hello(target.name(), ours, &theirs));
    ASSERT_FALSE(theirs.name.empty());
    const auto hello = xfer::transport::tcp_wire::DataHello(theirs.incarnation, ours.incarnation);
    uint8_t verdict[xfer::transport::tcp_wire::kAcceptBytes];
    for (int c = 0; c < kConnections; ++c) {
      net::Fd fd = ConnectFrom("127.0.0.2", DataPortOf(theirs));
      ASSERT_TRUE(fd.valid());
      ASSERT_TRUE(net::SendAll(fd.get(), hello.data(), hello.size(), Clock::now() + 5s).ok());
      ASSERT_TRUE(net::RecvAll(fd.get(), verdict, sizeof verdict, Clock::now() + 5s).ok());
      ASSERT_EQ(xfer::transport::tcp_wire::Get<uint32_t>(verdict), 0u);
      data.push_back(std::move(fd));
    }
  }
  std::atomic<bool> stop{false};
  std::thread trickler([&] {
    const auto head = WriteFrameHead(bait.addr, kPayload);
    std::vector<int> left(data.size(), 0);
    uint8_t sink[4096];
    while (!stop.load()) {
      for (size_t i = 0; i < data.size(); ++i) {
        while (::recv(data[i].get(), sink, sizeof sink, MSG_DONTWAIT) > 0) {
        }  // (the target's replies)
        if (left[i] == 0) {
          (void)net::SendAll(data[i].get(), head.data(), head.size(), Clock::now() + 1s);
          left[i] = kPayload;
        } else if (::send(data[i].get(), "x", 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1) {
          --left[i];
        }
      }
      for (auto& s : sessions) (void)s->Send(wire::Heartbeat{});
      std::this_thread::sleep_for(200ms);
    }
  });
  std::this_thread::sleep_for(1500ms);  // (every connection's frame is under way)
  int most_threads = ThreadsOf(target.pid());
  const double during = legit_mbps(2.0);
  most_threads = std::max(most_threads, ThreadsOf(target.pid()));
  stop.store(true);
  trickler.join();
  std::printf(
      "[ serve shares ] legit peer %.0f MB/s before, %.0f MB/s beside %d trickling connections "
      "(%.2fx); the target had %d threads\n",
      before, during, kSessions * kConnections, during / before, most_threads);
  EXPECT_EQ(failures, 0);
  EXPECT_LT(most_threads, 600) << "one host took more than its share of the serve threads";
  EXPECT_GT(during, 0.2 * before) << "the legitimate peer was starved";
}

// Resident memory of a process, in MiB.
double RssMiB(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024;
  }
  return -1;
}

// Connections that each begin a 60 MiB control frame and never finish it (ten before their
// hello, ten after a small one) hold no more than the engine's budget for unfinished frames
// (512 MiB): past it, the session holding the most is closed. A legitimate peer connects and
// transfers meanwhile. (Before, the engine kept all 1.1 GB.)
TEST(Hostile, UnfinishedFramesStayWithinTheEnginesBudget) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "the sanitizers keep freed memory for a while: the normal build measures it";
#endif
  PeerProcess target;
  std::string error;
  ASSERT_TRUE(target.Start(PeerOptions{}, &error)) << error;
  const PeerRegion r = target.Alloc(1 << 20);
  const double rss_before = RssMiB(target.pid());
  constexpr size_t kConnections = 20, kSent = 56u << 20;
  const std::vector<uint8_t> junk(kSent, 0x5a);
  std::vector<std::thread> senders;
  std::atomic<int> cut{0};
  const auto t0 = Clock::now();
  for (size_t i = 0; i < kConnections; ++i) {
    senders.emplace_back([&, i] {
      net::Address a;
      net::Fd fd;
      if (!net::ParseAddress(target.name(), &a).ok() || !net::ConnectTcp(a, Clock::now() + 5s, &fd).ok())
        return;
      std::vector<uint8_t> head;
      if (i % 2 == 1) {  // a small hello first: an established session
        head = wire::Encode(HelloOf("127.0.0.1:" + std::to_string(700 + i), 700 + i));
      }
      auto frame = wire::Encode(wire::Sync{1});  // (its header, made to say 60 MiB)
      const uint32_t len = 60u << 20;
      std::memcpy(frame.data() + 8, &len, 4);
      head.insert(head.end(), frame.begin(), frame.begin() + wire::kHeaderSize);
      if (!net::SendAll(fd.get(), head.data(), head.size(), Clock::now() + 5s).ok() ||
          !net::SendAll(fd.get(), junk.data(), junk.size(), Clock::now() + 3s).ok()) {
        cut.fetch_add(1);  // (closed by the engine: the kernel may drop, not refuse, what follows)
      }
      std::this_thread::sleep_for(1s);  // (holding it while the engine's memory is read)
    });
  }
  xfer::Engine legit;
  XT_ASSERT_OK(legit.Initialize("127.0.0.1"));
  XT_ASSERT_OK(legit.Connect(target.name(), 10s));
  LocalBuffer src(1 << 20);
  src.Fill(3);
  double rss_most = 0;
  while (SecondsSince(t0) < 4) {
    XT_ASSERT_OK(legit.TransferSync(target.name(), Op::kWrite, {{src.addr(), r.addr, src.len()}}, 10s));
    rss_most = std::max(rss_most, RssMiB(target.pid()));
    std::this_thread::sleep_for(20ms);
  }
  for (auto& t : senders) t.join();
  EXPECT_EQ(target.Sum(r), src.Hash());
  std::printf(
      "[ unfinished frames ] %zu connections x %zu MiB: the target grew by %.0f MiB at most; %d cut\n",
      kConnections, kSent >> 20, rss_most - rss_before, cut.load());
  EXPECT_LT(rss_most - rss_before, 800) << "the engine kept what connections never finished";
  EXPECT_GT(cut.load(), 0);
}

// A peer that registers 100,000 regions one by one costs the engine's control thread no
// quadratic work (before: every one re-sorted the peer's table, many minutes), and a legitimate
// peer's transfers go on meanwhile.
TEST(Hostile, AHundredThousandRegionsAfterConnectAreTakenInStride) {
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0"));
  LocalBuffer pool(1 << 20), src(1 << 20);
  src.Fill(5);
  xfer::MemHandle h = 0;
  XT_ASSERT_OK(e.RegisterMem(pool.data(), pool.len(), xfer::MemType::kHost, &h));
  wire::Hello many, ours;
  many.name = "127.0.0.1:4";
  many.incarnation = 95;
  many.host_id = "elsewhere";
  auto s = Hello(e.LocalName(), many, &ours);
  ASSERT_FALSE(ours.name.empty());
  const auto t0 = Clock::now();
  constexpr uint64_t kRegions = 100000;
  for (uint64_t i = 1; i <= kRegions; ++i) {
    ASSERT_TRUE(
        s->Send(wire::RegionAdd{Region(i, (1ull << 40) + ((i * 7919) % kRegions) * 4096, 4096)}).ok());
    if (i % 1000 == 0) {
      ASSERT_TRUE(s->FlushUntil(Clock::now() + 10s).ok());
    }
  }
  ASSERT_TRUE(s->Send(wire::Sync{1}).ok());  // answered once the engine read what came before
  ASSERT_TRUE(s->FlushUntil(Clock::now() + 10s).ok());
  xfer::Engine legit;  // meanwhile
  XT_ASSERT_OK(legit.Initialize("127.0.0.1"));
  XT_ASSERT_OK(legit.Connect(e.LocalName(), 30s));
  XT_EXPECT_OK(legit.TransferSync(e.LocalName(), Op::kWrite, {{src.addr(), pool.addr(), src.len()}}, 30s));
  const auto ack = Await<wire::SyncAck>(*s, Clock::now() + 60s);
  ASSERT_TRUE(ack.has_value()) << "the engine did not take 100,000 regions within a minute";
  EXPECT_EQ(ack->seq, 1u);
  EXPECT_LT(SecondsSince(t0), 60.0);
  EXPECT_EQ(pool.Hash(), src.Hash());
}

// Hello bombs (issue 42.5): ten connections each send a hello of the most regions a peer may
// have (1 M regions, 36 MiB). Checking and indexing them must not hold the control thread: a
// legitimate peer's session survives (its transfers go on, verified, and it is never declared
// dead) and a newcomer connects at once, while the bombs are still being taken.
TEST(Hostile, HelloBombsLeaveTheControlThreadFree) {
#if defined(__SANITIZE_ADDRESS__)
  constexpr uint64_t kRegions = 1u << 17;  // (the sanitizers make each region costlier)
#else
  constexpr uint64_t kRegions = 1u << 20;
#endif
  constexpr int kBombs = 10;
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0"));
  LocalBuffer pool(1 << 20), src(1 << 20), back(1 << 20);
  xfer::MemHandle mh = 0;
  XT_ASSERT_OK(e.RegisterMem(pool.data(), pool.len(), xfer::MemType::kHost, &mh));
  xfer::Engine legit;
  XT_ASSERT_OK(legit.Initialize("127.0.0.1"));
  XT_ASSERT_OK(legit.Connect(e.LocalName(), 10s));
  std::atomic<bool> stop{false};
  std::atomic<int> rounds{0}, failures{0};
  std::string first_failure;
  std::thread transfers([&] {
    for (uint64_t seed = 1; !stop.load(); ++seed) {
      src.Fill(seed);
      xfer::Status w =
          legit.TransferSync(e.LocalName(), Op::kWrite, {{src.addr(), pool.addr(), src.len()}}, 10s);
      xfer::Status r =
          legit.TransferSync(e.LocalName(), Op::kRead, {{back.addr(), pool.addr(), back.len()}}, 10s);
      if (!w.ok() || !r.ok() || back.Hash() != src.Hash()) {
        if (failures.fetch_add(1) == 0) first_failure = w.ok() ? r.ToString() : w.ToString();
        std::this_thread::sleep_for(10ms);
      } else {
        rounds.fetch_add(1);
      }
    }
  });
  // A probe of the control thread: a round trip every 20 ms on a session of its own.
  wire::Hello probe_hello = HelloOf("127.0.0.1:99", 99), engines;
  auto probe = Hello(e.LocalName(), probe_hello, &engines);
  ASSERT_FALSE(engines.name.empty());
  std::atomic<int64_t> slowest_us{0};
  std::thread prober([&] {
    for (uint64_t seq = 1; !stop.load(); ++seq) {
      const auto sent = Clock::now();
      if (!probe->Send(wire::Sync{seq}).ok() || !Await<wire::SyncAck>(*probe, sent + 10s)) {
        slowest_us.store(INT64_MAX);
        return;
      }
      const auto us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - sent).count();
      if (us > slowest_us.load()) slowest_us.store(us);
      std::this_thread::sleep_for(20ms);
    }
  });
  wire::Hello bomb;
  bomb.host_id = "elsewhere";
  bomb.regions.reserve(kRegions);
  for (uint64_t i = 1; i <= kRegions; ++i) bomb.regions.push_back(Region(i, (1ull << 40) + i * 4096, 4096));
  std::vector<std::vector<uint8_t>> frames;  // (encoded first: the test's own work is not timed)
  for (int b = 0; b < kBombs; ++b) {
    bomb.name = "127.0.0.1:" + std::to_string(100 + b);
    bomb.incarnation = 1000 + static_cast<uint64_t>(b);
    frames.push_back(wire::Encode(bomb));
  }
  // Each bomb's last byte goes once every bomb is in but for its last byte: the hellos land
  // together, as an attacker would time them.
  std::vector<std::thread> bombers;
  std::atomic<int> answered{0}, loaded{0};
  const auto t0 = Clock::now();
  for (int b = 0; b < kBombs; ++b) {
    bombers.emplace_back([&, b] {
      net::Address a;
      net::Fd fd;
      const auto deadline = Clock::now() + 60s;
      const bool in = net::ParseAddress(e.LocalName(), &a).ok() && net::ConnectTcp(a, deadline, &fd).ok() &&
                      net::SendAll(fd.get(), frames[b].data(), frames[b].size() - 1, deadline).ok();
      loaded.fetch_add(1);
      while (loaded.load() < kBombs && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
      if (!in || !net::SendAll(fd.get(), &frames[b].back(), 1, deadline).ok()) return;
      xfer::control::Session s(std::move(fd), true, e.LocalName());
      wire::Message m;
      if (s.ReadOne(Clock::now() + 60s, &m).ok() && std::holds_alternative<wire::Hello>(m))
        answered.fetch_add(1);
    });
  }
  while (loaded.load() < kBombs) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(100ms);  // (the bombs are being taken)
  xfer::Engine newcomer;
  XT_ASSERT_OK(newcomer.Initialize("127.0.0.1"));
  const auto c0 = Clock::now();
  XT_EXPECT_OK(newcomer.Connect(e.LocalName(), 10s));
  const double connect_s = SecondsSince(c0);
  for (auto& t : bombers) t.join();
  const double bombs_s = SecondsSince(t0);
  std::this_thread::sleep_for(1s);  // (their sessions end, and what they left is freed)
  stop.store(true);
  transfers.join();
  prober.join();
  std::printf(
      "[ hello bombs ] %d of %d hellos of %llu regions taken in %.2f s; legit: %d verified rounds "
      "of 2 MiB (%.0f MB/s), %d failed; newcomer connected in %.3f s; slowest control round "
      "trip %.3f s\n",
      answered.load(), kBombs, static_cast<unsigned long long>(kRegions), bombs_s, rounds.load(),
      rounds.load() * 2.0 * (1 << 20) / 1e6 / bombs_s, failures.load(), connect_s,
      static_cast<double>(slowest_us.load()) / 1e6);
  EXPECT_EQ(answered.load(), kBombs);
  EXPECT_LT(slowest_us.load(), 1000000) << "the control thread was held (before: 3 s)";
  EXPECT_EQ(failures.load(), 0) << first_failure;
  EXPECT_GT(rounds.load(), 0);
  EXPECT_LT(connect_s, 1.0) << "the newcomer waited for the bombs";
  xfer::PeerInfo info;
  XT_EXPECT_OK(legit.GetPeerInfo(e.LocalName(), &info));
}

// A big hello (decoded and indexed off the control thread) and the frames sent right behind
// it, in one write: those wait for the table and are taken in order after it. A big hello
// whose payload does not decode, or whose table is bad, closes only its session.
TEST(Hostile, FramesBehindABigHelloAreTakenInOrderAfterIt) {
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0"));
  constexpr uint64_t kRegions = 3000;  // (a hello over 64 KiB)
  wire::Hello big = HelloOf("127.0.0.1:31", 31);
  for (uint64_t i = 1; i <= kRegions; ++i) big.regions.push_back(Region(i, (1ull << 40) + i * 4096, 4096));
  std::vector<uint8_t> burst = wire::Encode(big);
  ASSERT_GE(burst.size(), 64u * 1024);
  for (const wire::Message& m : {wire::Message{wire::RegionAdd{Region(kRegions + 1, 1ull << 41, 4096)}},
                                 wire::Message{wire::RegionRemove{1, 1}}, wire::Message{wire::Sync{2}}}) {
    const auto frame = wire::Encode(m);
    burst.insert(burst.end(), frame.begin(), frame.end());
  }
  net::Address a;
  ASSERT_TRUE(net::ParseAddress(e.LocalName(), &a).ok());
  auto send = [&](const std::vector<uint8_t>& bytes) {
    net::Fd fd;
    EXPECT_TRUE(net::ConnectTcp(a, Clock::now() + 5s, &fd).ok());
    EXPECT_TRUE(net::SendAll(fd.get(), bytes.data(), bytes.size(), Clock::now() + 10s).ok());
    return std::make_shared<xfer::control::Session>(std::move(fd), true, e.LocalName());
  };
  auto s = send(burst);
  std::vector<wire::Message> got;
  for (wire::Message m; got.size() < 3 && s->ReadOne(Clock::now() + 10s, &m).ok();) {
    if (!std::holds_alternative<wire::Heartbeat>(m)) got.push_back(std::move(m));
  }
  ASSERT_EQ(got.size(), 3u);
  EXPECT_TRUE(std::holds_alternative<wire::Hello>(got[0]));
  ASSERT_TRUE(std::holds_alternative<wire::RegionRemoveAck>(got[1]));
  ASSERT_TRUE(std::holds_alternative<wire::SyncAck>(got[2]));
  EXPECT_EQ(std::get<wire::SyncAck>(got[2]).seq, 2u);
  std::vector<xfer::RegionInfo> theirs;
  auto listed = std::async(std::launch::async, [&] { return e.GetRemoteRegions(big.name, &theirs); });
  const auto asked = Await<wire::Sync>(*s, Clock::now() + 10s);  // (its round trip, answered)
  ASSERT_TRUE(asked.has_value());
  ASSERT_TRUE(s->Send(wire::SyncAck{asked->seq}).ok());
  XT_ASSERT_OK(listed.get());
  EXPECT_EQ(theirs.size(), kRegions);  // 3000, one added and one removed
  bool added = false, removed = true;
  for (const auto& r : theirs) {
    added = added || r.addr == 1ull << 41;
    removed = removed && r.addr != (1ull << 40) + 4096;
  }
  EXPECT_TRUE(added && removed);
  // A second hello closes the session on its header alone (before, it was read and decoded).
  auto second = wire::Encode(HelloOf("127.0.0.1:31", 31));
  const uint32_t huge = 60u << 20;
  std::memcpy(second.data() + 8, &huge, 4);
  ASSERT_TRUE(net::SendAll(s->fd(), second.data(), wire::kHeaderSize, Clock::now() + 5s).ok());
  const auto until = Clock::now() + 5s;
  for (wire::Message m; s->ReadOne(until, &m).ok();) {
  }  // (until the engine closes it, or 5 s)
  xfer::PeerInfo gone;
  EXPECT_TRUE(PollUntil([&] { return !e.GetPeerInfo(big.name, &gone).ok(); }, 5s))
      << "a second hello's header did not close the session";

  wire::Hello twice = HelloOf("127.0.0.1:32", 32);  // a bad table
  twice.regions = big.regions;
  twice.regions.back().id = 1;
  const auto refused = send(wire::Encode(twice));
  wire::Message m;
  ASSERT_TRUE(refused->ReadOne(Clock::now() + 10s, &m).ok());
  ASSERT_TRUE(std::holds_alternative<wire::Goodbye>(m));
  EXPECT_NE(std::get<wire::Goodbye>(m).reason.find("two regions have id 1"), std::string::npos);
  std::vector<uint8_t> garbled = wire::Encode(big);  // a payload that does not decode
  garbled.resize(garbled.size() - 100);
  garbled.resize(garbled.size() + 100, 0xff);
  EXPECT_FALSE(send(garbled)->ReadOne(Clock::now() + 10s, &m).ok()) << "the engine answered a garbled hello";
  xfer::Engine legit;
  XT_ASSERT_OK(legit.Initialize("127.0.0.1"));
  XT_EXPECT_OK(legit.Connect(e.LocalName(), 10s));
}

// Anyone who can connect can open connections that break the protocol (bad bytes, a frame
// before the hello, a hello without a name; without a secret, bad bytes after a hello): the
// engine logs those a line a second, with a count of the rest (docs/security.md), so that they
// cannot flood its log.
TEST(Hostile, StrangersBrokenConnectionsAreLoggedOnceASecond) {
  const std::string log = ::testing::TempDir() + "xfer_strangers_" + std::to_string(getpid()) + ".log";
  PeerOptions options;
  options.stderr_file = log;
  PeerProcess peer;
  std::string err;
  ASSERT_TRUE(peer.Start(options, &err)) << err;
  // Bytes that are no frame on fd (closed for its bad magic); false when they could not be sent.
  const auto junk_on = [](int fd) {
    const std::vector<uint8_t> bytes(64, 0x5a);
    if (::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(bytes.size()))
      return false;
    pollfd p{fd, POLLIN, 0};
    char c;
    while (::poll(&p, 1, 2000) == 1 && ::recv(fd, &c, 1, 0) > 0) {
    }
    return true;
  };
  const auto junk = [&] {
    net::Fd fd;
    return net::ConnectTcp(net::Address{"127.0.0.1", static_cast<uint16_t>(peer.port()), true},
                           Clock::now() + 2s, &fd)
               .ok() &&
           junk_on(fd.get());
  };
  constexpr int kEach = 30;
  const auto began = Clock::now();
  for (int i = 0; i < kEach; ++i) {
    ASSERT_TRUE(junk());
    RawSession hello_first(peer.name());  // (a peer, as far as a hello without a secret goes)
    const uint64_t incarnation = 1000 + static_cast<uint64_t>(i);
    ASSERT_FALSE(
        hello_first.Hello(HelloOf("127.0.0.1:" + std::to_string(incarnation), incarnation)).name.empty());
    ASSERT_TRUE(junk_on(hello_first.s->fd()));
    RawSession before(peer.name());
    before.Send(wire::Sync{1});  // a frame before the hello
    (void)before.ReadAll();
    RawSession nameless(peer.name());
    nameless.Send(HelloOf("", 0));
    (void)nameless.ReadAll();
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - began).count();
  std::this_thread::sleep_for(1100ms);
  ASSERT_TRUE(junk());  // its line counts those held back
  const auto text = [&] {
    std::ifstream f(log);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  const bool counted =
      PollUntil([&] { return text().find(" more since the last such line)") != std::string::npos; }, 3s);
  std::istringstream lines_of(text());
  size_t lines = 0;
  for (std::string line; std::getline(lines_of, line);) {
    lines += line.find("control connection from") != std::string::npos ||
             line.find("hello from") != std::string::npos;
  }
  // Two limits (the connection's bytes, its frames), a line a second each.
  EXPECT_LE(lines, 2 * (static_cast<size_t>(seconds) + 2) + 1) << "over " << seconds << " s";
  EXPECT_GE(lines, 2u);
  EXPECT_TRUE(counted) << "no line counted the lines held back";
  std::remove(log.c_str());
}

// EngineOptions::max_peer_regions: a hello with more regions gets only a goodbye, a peer that
// registers one more is cut off; the engine serves the others.
TEST(Hostile, APeersRegionsAreCapped) {
  xfer::EngineOptions o;
  o.max_peer_regions = 100;
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0", o));
  wire::Hello h;
  h.name = "127.0.0.1:5";
  h.incarnation = 96;
  h.host_id = "elsewhere";
  for (uint64_t i = 1; i <= 101; ++i) h.regions.push_back(Region(i, i << 20, 4096));
  const auto got = Session(e.LocalName(), h);
  ASSERT_EQ(got.size(), 1u) << "only a goodbye may come back";
  ASSERT_TRUE(std::holds_alternative<wire::Goodbye>(got[0]));
  EXPECT_NE(std::get<wire::Goodbye>(got[0]).reason.find("max_peer_regions"), std::string::npos);
  h.regions.pop_back();  // 100: taken; then one more closes the session
  const auto closed = Session(e.LocalName(), h, wire::Message{wire::RegionAdd{Region(101, 101 << 20, 4096)}});
  ASSERT_FALSE(closed.empty());
  EXPECT_TRUE(std::holds_alternative<wire::Hello>(closed[0]));
  xfer::PeerInfo info;
  EXPECT_TRUE(PollUntil([&] { return !e.GetPeerInfo(h.name, &info).ok(); }, 5s))
      << "the session was not closed";
  xfer::Engine legit;
  XT_ASSERT_OK(legit.Initialize("127.0.0.1"));
  XT_EXPECT_OK(legit.Connect(e.LocalName(), 10s));
}

// A peer claiming to be another process of this host (a victim engine: its pid, incarnation
// and cma cookie, all learned from the victim's own hello) must not make this engine write
// into the victim: the claim holds only once that pid is seen to hold the control connection.
TEST(Hostile, APeerClaimingAnotherProcessOfThisHostGetsNoSameHostPath) {
  PeerProcess victim;
  std::string error;
  ASSERT_TRUE(victim.Start(PeerOptions{}, &error)) << error;
  const PeerRegion r = victim.Alloc(4096);
  victim.Fill(r, 1);
  const uint64_t before = victim.Sum(r);
  wire::Hello probe, victims;
  probe.name = "127.0.0.1:1";
  probe.incarnation = 93;
  probe.host_id = "elsewhere";
  auto to_victim = Hello(victim.name(), probe, &victims);
  ASSERT_EQ(victims.pid, victim.pid());
  ASSERT_NE(xfer::transport::FindBlob(victims.backends, "cma"), nullptr) << "the victim offers no cma";

  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0"));
  wire::Hello forged = victims;  // the victim's identity, its cookie, a region at its memory
  forged.name = "127.0.0.1:2";
  forged.backends = {{"cma", *xfer::transport::FindBlob(victims.backends, "cma")}};
  forged.regions = {Region(1, r.addr, r.len)};
  wire::Hello ours;
  auto attacker = Hello(e.LocalName(), forged, &ours);
  ASSERT_FALSE(ours.name.empty()) << "the engine did not answer the forged hello";
  LocalBuffer src(4096);
  src.Fill(2);
  const xfer::Status s = e.TransferSync(forged.name, Op::kWrite, {{src.addr(), r.addr, 4096}}, 5s);
  EXPECT_FALSE(s.ok()) << "a WRITE went to a peer that claimed another process's pid";
  EXPECT_EQ(victim.Sum(r), before) << "the engine wrote into the process the peer claimed to be";
  xfer::PeerInfo info;
  XT_ASSERT_OK(e.GetPeerInfo(forged.name, &info));
  EXPECT_FALSE(info.Reaches("cma"));
}

// Another process claiming to be this one (our pid, our host) must not reach our memory
// through the in-process path: the attacker's regions would be our own addresses.
TEST(Hostile, APeerClaimingThisProcessGetsNoInProcessPath) {
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0"));
  LocalBuffer secret(4096), src(4096);
  secret.Fill(3);
  src.Fill(4);
  const uint64_t before = secret.Hash();
  wire::Hello forged;
  forged.name = "127.0.0.1:3";
  forged.incarnation = 94;
  forged.host_id = xfer::host::BootId();
  forged.pid = getpid();
  forged.backends = {{"local", ""}};
  forged.regions = {Region(1, secret.addr(), secret.len())};
  const std::vector<uint8_t> frame = wire::Encode(forged);
  net::Address a;
  ASSERT_TRUE(net::ParseAddress(e.LocalName(), &a).ok());
  const pid_t child = fork();  // the attacker: another process, sending our identity
  if (child == 0) {
    net::Fd fd;
    if (!net::ConnectTcp(a, Clock::now() + 5s, &fd).ok()) _exit(1);
    if (!net::SendAll(fd.get(), frame.data(), frame.size(), Clock::now() + 5s).ok()) _exit(1);
    char sink[4096];
    for (;;) {  // (the socket is non-blocking) read what comes until the parent kills us
      if (read(fd.get(), sink, sizeof sink) == 0) _exit(0);
      usleep(1000);
    }
  }
  ASSERT_GT(child, 0);
  xfer::PeerInfo info;
  const bool known = PollUntil([&] { return e.GetPeerInfo(forged.name, &info).ok(); }, 5s);
  xfer::Status s;
  if (known) s = e.TransferSync(forged.name, Op::kWrite, {{src.addr(), secret.addr(), 4096}}, 5s);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  ASSERT_TRUE(known) << "the engine never took the forged hello";
  EXPECT_FALSE(info.Reaches("local"));
  EXPECT_FALSE(s.ok()) << "a WRITE went to a peer that claimed to be this process";
  EXPECT_EQ(secret.Hash(), before) << "the peer's regions were taken as this process's memory";
}

}  // namespace
}  // namespace xfer_test
