// control_rtt: the engine's control round trip between two processes of this host, the
// baseline a notification's extra latency is judged against (bench/compare_notify.sh).
// The parent times N calls of each, one at a time, against a child engine that does nothing
// but drain its notifications:
//   sync    GetRemoteRegions: one Sync frame and its answer, nothing queued
//   notify  SendNotify of 16 bytes: the same round trip, and the message queued at the child
// and prints "sync <p50 us>" and "notify <p50 us>".
//
//   control_rtt [N]   (default 5000)
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "xfer/engine.h"

using namespace std::chrono;

namespace {

int Child(int to_parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  xfer::Engine e;
  if (!e.Initialize("127.0.0.1:0").ok()) return 1;
  const std::string name = e.LocalName() + "\n";
  if (write(to_parent, name.data(), name.size()) != ssize_t(name.size())) return 1;
  std::vector<xfer::Notification> got;
  for (;;) {  // until the parent kills it
    (void)e.WaitNotifies(&got, milliseconds(500));
    got.clear();
  }
}

template <typename F>
double P50Us(int n, F call) {
  std::vector<double> us(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const auto t0 = steady_clock::now();
    if (!call()) return -1;
    us[size_t(i)] = duration<double, std::micro>(steady_clock::now() - t0).count();
  }
  std::nth_element(us.begin(), us.begin() + n / 2, us.end());
  return us[size_t(n / 2)];
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::max(100, std::atoi(argv[1])) : 5000;
  int p[2];
  if (pipe(p) != 0) return 1;
  const pid_t child = fork();
  if (child == 0) {
    close(p[0]);
    _exit(Child(p[1]));
  }
  close(p[1]);
  std::string name;
  for (char c; read(p[0], &c, 1) == 1 && c != '\n';) name += c;
  xfer::Engine e;
  int rc = 1;
  if (e.Initialize("127.0.0.1:0").ok() && e.Connect(name, seconds(10)).ok()) {
    std::vector<xfer::RegionInfo> regions;
    const std::string msg(16, 'n');
    P50Us(n / 10, [&] { return e.GetRemoteRegions(name, &regions).ok(); });  // warm-up
    const double sync = P50Us(n, [&] { return e.GetRemoteRegions(name, &regions).ok(); });
    const double notify = P50Us(n, [&] { return e.SendNotify(name, msg, seconds(5)).ok(); });
    if (sync >= 0 && notify >= 0) {
      std::printf("sync %.2f\nnotify %.2f\n", sync, notify);
      rc = 0;
    }
  }
  e.Finalize();
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  return rc;
}
