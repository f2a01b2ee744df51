// cluster_scale: many engines on this host, registered in etcd, each connecting to several
// others by cluster name and READing from each; what a peer costs an engine (memory, threads,
// file descriptors) and how long connecting them all takes (bench/cluster_scale.sh runs it
// against a real etcd and writes the "scale" section of bench/RESULTS.md).
//
//   cluster_scale ETCD_URL [ENGINES=64] [PEERS=8] [TRANSPORT=tcp]
//
// The parent forks ENGINES children before it has any thread. Each child starts an engine
// named scale-<i> (published in etcd), registers 1 MiB, and reports its process's resident
// memory, threads and open descriptors. Once every engine is listed in etcd the parent says
// "go" to all at once; each then ConnectAsync's to scale-<i+1> .. scale-<i+PEERS> by name
// (looked up in etcd), READs 64 KiB from each (checked), and reports the same figures again
// and how long its connects took, and once more after 2 s idle. The parent prints one JSON
// line per engine and a summary.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "xfer/engine.h"

using namespace std::chrono;

namespace {

constexpr uint64_t kRegion = 1 << 20;
constexpr uint64_t kRead = 64 << 10;

struct Usage {
  double rss_mib = 0;
  int threads = 0;
  int fds = 0;
};

Usage Now() {
  Usage u;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) u.rss_mib = std::atof(line.c_str() + 6) / 1024.0;
    if (line.rfind("Threads:", 0) == 0) u.threads = std::atoi(line.c_str() + 8);
  }
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++u.fds;
  return u;
}

std::string Json(const Usage& u) {
  char b[128];
  std::snprintf(b, sizeof b, "\"rss_mib\": %.2f, \"threads\": %d, \"fds\": %d", u.rss_mib, u.threads, u.fds);
  return b;
}

void Say(int fd, const std::string& line) {
  const std::string l = line + "\n";
  if (write(fd, l.data(), l.size()) != ssize_t(l.size())) _exit(3);
}

std::string Hear(int fd) {
  std::string line;
  char c;
  while (read(fd, &c, 1) == 1 && c != '\n') line += c;
  return line;
}

int Child(int index, int engines, int peers, const std::string& url, const std::string& transport,
          int from_parent, int to_parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  xfer::EngineOptions o;
  o.metadata = url;
  o.cluster_name = "scale-" + std::to_string(index);
  o.transport = transport;
  xfer::Engine e;
  xfer::Status s = e.Initialize("127.0.0.1:0", o);
  std::vector<uint8_t> region(kRegion, static_cast<uint8_t>(index));
  xfer::MemHandle h = 0;
  if (s.ok()) s = e.RegisterMem(region.data(), region.size(), xfer::MemType::kHost, &h, "kv");
  if (!s.ok()) {
    Say(to_parent, "{\"error\": \"" + s.ToString() + "\"}");
    return 1;
  }
  const Usage before = Now();
  Say(to_parent, "ready");
  if (Hear(from_parent) != "go") return 1;

  const auto t0 = steady_clock::now();
  std::vector<xfer::ConnectHandle> pending(static_cast<size_t>(peers));
  std::vector<std::string> names;
  for (int k = 1; k <= peers; ++k) {
    names.push_back("scale-" + std::to_string((index + k) % engines));
    s = e.ConnectAsync(names.back(), seconds(30), &pending[size_t(k - 1)]);
    if (!s.ok()) break;
  }
  int connected = 0;
  std::string failure;
  for (size_t k = 0; k < pending.size() && s.ok(); ++k) {
    xfer::ConnectStatus st;
    while (e.GetConnectStatus(pending[k], &st).ok() && !st.done) std::this_thread::sleep_for(milliseconds(1));
    if (st.status.ok() || st.status.code() == xfer::StatusCode::kAlreadyConnected) {
      ++connected;
    } else if (failure.empty()) {
      failure = names[k] + ": " + st.status.ToString();
    }
  }
  const double connect_s = duration<double>(steady_clock::now() - t0).count();
  std::vector<uint8_t> into(kRead);
  int read_ok = 0;
  for (const auto& name : names) {
    std::vector<xfer::RegionInfo> regions;
    if (!e.GetRemoteRegions(name, &regions).ok() || regions.empty()) continue;
    const int owner = std::atoi(name.c_str() + 6);
    s = e.TransferSync(name, xfer::Op::kRead,
                       {{reinterpret_cast<uint64_t>(into.data()), regions[0].addr, kRead}}, seconds(30));
    read_ok +=
        s.ok() && into[0] == static_cast<uint8_t>(owner) && into[kRead - 1] == static_cast<uint8_t>(owner);
  }
  const double all_s = duration<double>(steady_clock::now() - t0).count();
  // Measured once every engine is done (then each holds the sessions it opened and those its
  // PEERS predecessors opened to it), and again once all have been idle for 2 s (the parent
  // waits): busy connections keep a serving thread for a while, idle ones hold none.
  Say(to_parent, "done");
  if (Hear(from_parent) != "measure") return 1;
  const Usage after = Now();
  if (Hear(from_parent) != "idle") return 1;
  const Usage idle = Now();
  char b[256];
  std::snprintf(b, sizeof b, "\"connected\": %d, \"read_ok\": %d, \"connect_s\": %.4f, \"all_s\": %.4f",
                connected, read_ok, connect_s, all_s);
  Say(to_parent, "{\"engine\": " + std::to_string(index) + ", " + b + ", \"before\": {" + Json(before) +
                     "}, \"after\": {" + Json(after) + "}, \"idle\": {" + Json(idle) + "}" +
                     (failure.empty() ? "" : ", \"failure\": \"" + failure + "\"") + "}");
  (void)Hear(from_parent);  // "quit"
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: cluster_scale ETCD_URL [ENGINES=64] [PEERS=8] [TRANSPORT=tcp]\n");
    return 2;
  }
  const std::string url = argv[1];
  const int engines = argc > 2 ? std::atoi(argv[2]) : 64;
  const int peers = argc > 3 ? std::atoi(argv[3]) : 8;
  const std::string transport = argc > 4 ? argv[4] : "tcp";
  if (engines < 2 || peers < 1 || peers >= engines) {
    std::fprintf(stderr, "cluster_scale: need 2 <= ENGINES and 1 <= PEERS < ENGINES\n");
    return 2;
  }
  struct Kid {
    pid_t pid;
    int to, from;
  };
  std::vector<Kid> kids;
  const auto started = steady_clock::now();
  for (int i = 0; i < engines; ++i) {  // (before this process has a thread: fork is safe)
    int down[2], up[2];
    if (pipe(down) != 0 || pipe(up) != 0) return 1;
    const pid_t pid = fork();
    if (pid == 0) {
      close(down[1]);
      close(up[0]);
      for (const Kid& k : kids) {
        close(k.to);
        close(k.from);
      }
      _exit(Child(i, engines, peers, url, transport, down[0], up[1]));
    }
    close(down[0]);
    close(up[1]);
    kids.push_back({pid, down[1], up[0]});
  }
  bool ok = true;
  for (const Kid& k : kids) {
    const std::string l = Hear(k.from);
    if (l != "ready") {
      std::fprintf(stderr, "cluster_scale: an engine did not start: %s\n", l.c_str());
      ok = false;
    }
  }
  const double start_s = duration<double>(steady_clock::now() - started).count();
  if (ok) {  // every engine listed in etcd before the connects begin
    xfer::EngineOptions o;
    o.metadata = url;
    xfer::Engine lister;
    std::vector<xfer::ClusterPeer> listed;
    ok = lister.Initialize("127.0.0.1", o).ok() && lister.ListPeers(&listed).ok() &&
         static_cast<int>(listed.size()) == engines;
    if (!ok) std::fprintf(stderr, "cluster_scale: etcd lists %zu engines, not %d\n", listed.size(), engines);
  }
  const auto go = steady_clock::now();
  for (const Kid& k : kids) Say(k.to, ok ? "go" : "stop");
  for (const Kid& k : kids) ok = ok && Hear(k.from) == "done";
  const double all_connected_s = duration<double>(steady_clock::now() - go).count();
  for (const Kid& k : kids) Say(k.to, ok ? "measure" : "stop");
  std::this_thread::sleep_for(seconds(2));
  for (const Kid& k : kids) Say(k.to, ok ? "idle" : "stop");
  for (const Kid& k : kids) {
    if (ok) std::printf("%s\n", Hear(k.from).c_str());
    Say(k.to, "quit");
  }
  for (const Kid& k : kids) {
    int status = 0;
    waitpid(k.pid, &status, 0);
  }
  std::printf(
      "{\"summary\": true, \"engines\": %d, \"peers\": %d, \"transport\": \"%s\", \"start_s\": %.3f, "
      "\"all_connected_s\": %.3f}\n",
      engines, peers, transport.c_str(), start_s, all_connected_s);
  return ok ? 0 : 1;
}
