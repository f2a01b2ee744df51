// Peers that misbehave, and what the engine does about it while it keeps serving the others.
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include "control/session.h"
#include "test_common.h"
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
    if (net::ConnectTcp(net::Address{host, port, true}, Clock::now() + 2s, &fd).ok()) held.push_back(std::move(fd));
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
  EXPECT_LT(used, 0.3) << "the engine used " << used << " s of CPU in 1 s with its descriptors gone: it spins";

  control.clear();  // descriptors free again: a legitimate peer is served
  data.clear();
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1"));
  XT_EXPECT_OK(e.Connect(peer.name(), 10s));
}

// A raw control session to peer: sends hello, returns what came back until the peer closed
// (after `then`, when given, is sent once the peer's hello came).
std::vector<wire::Message> Session(const std::string& peer, const wire::Hello& hello,
                                   const std::optional<wire::Message>& then = std::nullopt) {
  net::Address a;
  EXPECT_TRUE(net::ParseAddress(peer, &a).ok());
  net::Fd fd;
  EXPECT_TRUE(net::ConnectTcp(a, Clock::now() + 5s, &fd).ok());
  auto s = std::make_shared<xfer::control::Session>(std::move(fd), true, peer);
  EXPECT_TRUE(s->Send(hello).ok());
  EXPECT_TRUE(s->FlushUntil(Clock::now() + 5s).ok());
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
  const auto got = Session(peer.name(), hello({Region(1, 0x1000, 16)}), wire::Message{wire::RegionAdd{Region(1, 0x5000, 16)}});
  ASSERT_FALSE(got.empty());
  EXPECT_TRUE(std::holds_alternative<wire::Hello>(got[0]));  // then it closed, after the duplicate id
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1"));
  XT_EXPECT_OK(e.Connect(peer.name(), 10s));
}

}  // namespace
}  // namespace xfer_test
