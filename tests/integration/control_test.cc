// The control thread of an engine with many sessions: what idle sessions cost it.
#include <memory>
#include <thread>
#include <vector>

#include "test_common.h"

namespace xfer_test {
namespace {

using namespace std::chrono_literals;

// Times the engines' control threads looked at their connections (xfer_control_turns_total).
double Turns(const std::vector<std::unique_ptr<xfer::Engine>>& engines) {
  double turns = 0;
  for (const auto& e : engines) {
    xfer::MetricsSnapshot m;
    XT_EXPECT_OK(e->GetMetrics(&m));
    turns += m.Sum("xfer_control_turns_total");
  }
  return turns;
}

// Idle sessions cost a control thread almost nothing: heartbeats never make it spin
// (EngineOptions::spin: it polls in busy exchanges of other frames), and it sleeps until its
// next tick. A hub and eight peers, all in this process, trade a heartbeat every 10 ms on each
// session with spin = 2 ms, and their control threads wake about 2,500 times a second in all
// (a tick and a heartbeat at a time). Were a heartbeat to start a spin, the hub, which hears
// one every 1.25 ms, would poll without end; were the wait to a tick rounded down, each thread
// would poll through the last millisecond before every tick (it did): either is tens of
// thousands of turns a second or more, and counted, not timed, under sanitizers too.
TEST(ControlThread, IdleSessionsCostItAlmostNothing) {
  xfer::EngineOptions o;
  o.heartbeat_interval = 10ms;
  o.heartbeat_timeout = 3000ms;  // (under sanitizers too)
  o.spin = 2000us;
  std::vector<std::unique_ptr<xfer::Engine>> engines;  // the hub first
  for (int i = 0; i < 9; ++i) {
    engines.push_back(std::make_unique<xfer::Engine>());
    XT_ASSERT_OK(engines.back()->Initialize("127.0.0.1:0", o));
    if (i > 0) XT_ASSERT_OK(engines.back()->Connect(engines[0]->LocalName(), 10s));
  }
  std::this_thread::sleep_for(300ms);  // (the hellos' frames, and the spins they start, are over)
  const double before = Turns(engines);
  const auto start = Clock::now();
  std::this_thread::sleep_for(1s);
  const double per_second = (Turns(engines) - before) / SecondsSince(start);
  EXPECT_GT(per_second, 300)
      << "the control threads' ticks alone turn about 900 times a second: not counted?";
  EXPECT_LT(per_second, 15000) << "idle engines trading only heartbeats: their control threads polled "
                               << per_second << " times a second";
  for (size_t i = 1; i < engines.size(); ++i) {
    xfer::PeerInfo info;
    EXPECT_TRUE(engines[i]->GetPeerInfo(engines[0]->LocalName(), &info).ok()) << "a session ended while idle";
  }
}

}  // namespace
}  // namespace xfer_test
