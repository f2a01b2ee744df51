// The control thread of an engine with many sessions: what idle sessions cost it.
#include <time.h>

#include <memory>
#include <thread>
#include <vector>

#include "test_common.h"

namespace xfer_test {
namespace {

using namespace std::chrono_literals;

double ProcessCpuSeconds() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
}

// Idle sessions cost a control thread almost nothing: heartbeats never make it spin
// (EngineOptions::spin: it polls in busy exchanges of other frames), and it sleeps until its
// next tick. A hub and eight peers, all in this process, trade a heartbeat every 10 ms on each
// session with spin = 2 ms. Were a heartbeat to start a spin, the nine control threads would
// poll for most of each second (over half a core in all); were the wait to a tick rounded down,
// each would poll through the last millisecond before every tick (about 0.4 of a core in all:
// it did). Asleep between heartbeats, they use about 0.05 of one.
TEST(ControlThread, IdleSessionsCostItAlmostNothing) {
  xfer::EngineOptions o;
  o.heartbeat_interval = 10ms;
  o.heartbeat_timeout = 3000ms;  // (under sanitizers too)
  o.spin = 2000us;
  xfer::Engine hub;
  XT_ASSERT_OK(hub.Initialize("127.0.0.1:0", o));
  std::vector<std::unique_ptr<xfer::Engine>> peers;
  for (int i = 0; i < 8; ++i) {
    peers.push_back(std::make_unique<xfer::Engine>());
    XT_ASSERT_OK(peers.back()->Initialize("127.0.0.1:0", o));
    XT_ASSERT_OK(peers.back()->Connect(hub.LocalName(), 10s));
  }
  std::this_thread::sleep_for(300ms);  // (the hellos' frames, and the spins they start, are over)
  const double cpu = ProcessCpuSeconds();
  const auto start = Clock::now();
  std::this_thread::sleep_for(1s);
  const double share = (ProcessCpuSeconds() - cpu) / SecondsSince(start);
  EXPECT_LT(share, 0.25) << "idle engines trading only heartbeats used " << share
                         << " of a core: their control threads poll while idle";
  for (auto& p : peers) {
    xfer::PeerInfo info;
    EXPECT_TRUE(p->GetPeerInfo(hub.LocalName(), &info).ok()) << "a session ended while idle";
  }
}

}  // namespace
}  // namespace xfer_test
