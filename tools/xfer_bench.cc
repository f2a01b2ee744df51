// xfer-bench: the benchmark users of this field know (perftest's ib_write_bw, ucx_perftest,
// nixlbench), for xfer.
//
//   xfer-bench                                   the main job: a local target child, WRITE then
//                                                READ, 16K..8M, best same-host transport
//   xfer-bench write_bw|read_bw|write_lat|read_lat [options] [host:port]
//                                                one test; without a peer, a local target child
//   xfer-bench serve [--listen host:port]        the target side for two-machine runs
//
// Buffer pattern, block layout and statistics come from bench_util.h, shared with the raw
// baselines in bench/, so that both measure the same thing.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#ifdef XFER_BENCH_HAVE_JSON
#include <nlohmann/json.hpp>
#endif

#include "bench_util.h"
#include "xfer/engine.h"

#ifndef XFER_TOOLS_VERSION
#define XFER_TOOLS_VERSION "unknown"
#endif

namespace {

using namespace xfer::bench;
using xfer::Engine;
using xfer::EngineOptions;
using xfer::Op;
using xfer::Status;
using xfer::TransferDesc;

constexpr int kExitArgs = 2;
constexpr const char* kRegionTag = "xfer-bench";
constexpr const char* kDefaultListen = "0.0.0.0:18515";  // perftest's port, for familiarity

struct ArgError {
  std::string msg;
};

// ---------------------------------------------------------------------------------------------
// Configuration

struct Config {
  // Tests to run, in order: "write_bw", "read_bw", "write_lat", "read_lat".
  std::vector<std::string> tests;
  bool main_job = false;  // no subcommand: write_bw then read_bw

  std::string size_arg = "16K:8M";
  bool all = false;
  std::vector<uint64_t> sizes;
  uint64_t iters = 0;      // requests per size; 0 = use the duration
  double duration = 1.0;   // seconds per size
  int64_t warmup = -1;     // requests; -1 = one pass over the span (at least 8, at most 1 s)
  uint64_t batch = 1;      // descriptors per request
  uint64_t depth = 1;      // requests in flight
  int streams = 0;         // 0 = the engine's default
  std::string slice_arg, batch_bytes_arg;  // EngineOptions::slice_bytes / batch_bytes
  uint64_t slice_bytes = 0, batch_bytes = 0;
  int64_t spin_us = -1;    // EngineOptions::spin; -1 = the engine's default
  std::string transport;   // empty = the best both sides offer
  bool reuse = false;
  uint64_t walk_span = kDefaultSpan;
  std::string span_arg;    // --span as typed
  bool verify = false;
  std::string json_file, csv_file;
  std::string peer;        // host:port of a serve; empty = local target
  std::string local_name;  // the client engine's name (host alone: client-only)
  double connect_timeout = 30;

  // serve
  std::string listen = kDefaultListen;
  int ready_fd = -1, ctl_fd = -1;

  uint64_t span = 0;  // resolved bytes per side
};

const std::vector<std::string> kKnownTransports = {"local", "cma", "tcp", "ucx", "cuda", "shm"};

void Resolve(Config& c) {
  if (c.all) c.size_arg = "2:8M";
  std::string err;
  if (!ParseSizeList(c.size_arg, &c.sizes, &err)) throw ArgError{"--size: " + err};
  if (!c.span_arg.empty() && !ParseSize(c.span_arg, &c.walk_span))
    throw ArgError{"--span: bad size '" + c.span_arg + "' (example: 256M)"};
  if (!c.slice_arg.empty() && !ParseSize(c.slice_arg, &c.slice_bytes))
    throw ArgError{"--slice-bytes: bad size '" + c.slice_arg + "'"};
  if (!c.batch_bytes_arg.empty() && !ParseSize(c.batch_bytes_arg, &c.batch_bytes))
    throw ArgError{"--batch-bytes: bad size '" + c.batch_bytes_arg + "'"};
  if (!c.transport.empty() &&
      std::find(kKnownTransports.begin(), kKnownTransports.end(), c.transport) == kKnownTransports.end())
    throw ArgError{"--transport: unknown transport '" + c.transport +
                   "' (known: local, cma, tcp, ucx, cuda, shm)"};
  c.span = SpanFor(c.sizes, c.batch, c.depth, c.reuse, c.walk_span);
  if (c.span > MaxSpan())
    throw ArgError{"each side would need " + FormatSize(c.span) +
                   " of buffers (largest size x --batch x --depth), over a quarter of this "
                   "machine's memory: lower --size, --batch or --depth"};
  if (c.local_name.empty()) c.local_name = c.peer.empty() ? "127.0.0.1" : "0.0.0.0";
}

bool IsLat(const std::string& t) { return t.size() > 4 && t.substr(t.size() - 4) == "_lat"; }
Op TestOp(const std::string& t) { return t.rfind("write", 0) == 0 ? Op::kWrite : Op::kRead; }

// The command that reproduces this run with every setting spelled out.
std::string RerunCommand(const std::string& argv0, const Config& c) {
  std::ostringstream o;
  o << ShellQuote(argv0);
  if (!c.main_job) o << ' ' << c.tests.front();
  o << " -s " << ShellQuote(c.size_arg);
  if (c.iters) o << " -n " << c.iters;
  else o << " -D " << c.duration;
  if (c.warmup >= 0) o << " -w " << c.warmup;
  o << " --batch " << c.batch << " --depth " << c.depth;
  if (c.streams) o << " --streams " << c.streams;
  if (c.slice_bytes) o << " --slice-bytes " << c.slice_arg;
  if (c.batch_bytes) o << " --batch-bytes " << c.batch_bytes_arg;
  if (c.spin_us >= 0) o << " --spin " << c.spin_us;
  if (!c.transport.empty()) o << " --transport " << c.transport;
  if (c.reuse) o << " --reuse";
  else if (!c.span_arg.empty()) o << " --span " << c.span_arg;
  if (c.verify) o << " --verify";
  if (!c.json_file.empty()) o << " --json " << ShellQuote(c.json_file);
  if (!c.csv_file.empty()) o << " --csv " << ShellQuote(c.csv_file);
  if (!c.peer.empty()) o << ' ' << ShellQuote(c.peer);
  return o.str();
}

// ---------------------------------------------------------------------------------------------
// Small system helpers

std::string CpuModel() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      if (p != std::string::npos) return line.substr(p + 2);
    }
  }
  return "unknown CPU";
}

std::string MachineLine() {
  utsname u{};
  uname(&u);
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s, %ld CPUs (%s), kernel %s", u.nodename,
                sysconf(_SC_NPROCESSORS_ONLN), CpuModel().c_str(), u.release);
  return buf;
}

std::string SelfExe() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  buf[n] = 0;
  return buf;
}

// A progress line on stderr, only when stderr is a terminal.
class Progress {
 public:
  Progress() : on_(isatty(STDERR_FILENO) == 1) {}
  void Show(const std::string& test, uint64_t bytes, double done, double total) {
    if (!on_) return;
    uint64_t now = NowNs();
    if (now - last_ < 200000000ull) return;
    last_ = now;
    std::fprintf(stderr, "\r\033[K  %s %s B: %.1f / %.1f %s", test.c_str(), FormatSize(bytes).c_str(),
                 done, total, total_is_iters_ ? "requests" : "s");
    shown_ = true;
  }
  void SetUnit(bool iters) { total_is_iters_ = iters; }
  void Clear() {
    if (on_ && shown_) std::fprintf(stderr, "\r\033[K");
    shown_ = false;
    last_ = 0;
  }

 private:
  bool on_;
  bool shown_ = false;
  bool total_is_iters_ = false;
  uint64_t last_ = 0;
};

// ---------------------------------------------------------------------------------------------
// The target side

EngineOptions MakeEngineOptions(const Config& c) {
  EngineOptions o;
  if (c.streams > 0) o.streams = c.streams;
  if (c.slice_bytes > 0) o.slice_bytes = c.slice_bytes;
  if (c.batch_bytes > 0) o.batch_bytes = c.batch_bytes;
  if (c.spin_us >= 0) o.spin = std::chrono::microseconds(c.spin_us);
  o.transport = c.transport;
  return o;
}

int RunServe(const Config& c) {
  auto fail = [&](const std::string& msg) {
    if (c.ready_fd >= 0) dprintf(c.ready_fd, "ERROR %s\n", msg.c_str());
    std::fprintf(stderr, "xfer-bench serve: %s\n", msg.c_str());
    return 1;
  };
  // Block the stop signals before the engine starts threads, so that only sigwait sees them.
  sigset_t stop_set;
  sigemptyset(&stop_set);
  sigaddset(&stop_set, SIGINT);
  sigaddset(&stop_set, SIGTERM);
  if (c.ctl_fd < 0) pthread_sigmask(SIG_BLOCK, &stop_set, nullptr);

  const uint64_t span = c.walk_span;
  Span region;
  if (!region.Allocate(span)) return fail("cannot allocate " + FormatSize(span));
  Engine engine;
  Status st = engine.Initialize(c.listen, MakeEngineOptions(c));
  if (!st.ok()) return fail("Initialize(" + c.listen + "): " + st.ToString());
  xfer::MemHandle h = 0;
  st = engine.RegisterMem(region.data(), region.size(), xfer::MemType::kHost, &h, kRegionTag);
  if (!st.ok()) return fail("RegisterMem: " + st.ToString());

  if (c.ready_fd >= 0) {
    dprintf(c.ready_fd, "READY %s %" PRIu64 " %" PRIu64 "\n", engine.LocalName().c_str(),
            region.addr(), region.size());
    close(c.ready_fd);
  } else {
    std::printf("xfer-bench serve: listening on %s; region of %s registered as '%s'; "
                "Ctrl-C to stop\n",
                engine.LocalName().c_str(), FormatSize(region.size()).c_str(), kRegionTag);
    std::fflush(stdout);
  }

  if (c.ctl_fd >= 0) {
    // The parent closes its end (or dies): EOF.
    char ch;
    for (;;) {
      ssize_t n = read(c.ctl_fd, &ch, 1);
      if (n == 0 || (n < 0 && errno != EINTR)) break;
    }
  } else {
    int sig = 0;
    sigwait(&stop_set, &sig);
  }
  engine.Finalize();
  return 0;
}

// A target started by this process: a child running `xfer-bench serve`, or (for --transport
// local) a second engine in this process.
class LocalTarget {
 public:
  ~LocalTarget() { Stop(); }

  // Child process. Returns an error message, empty on success.
  std::string StartChild(const Config& c) {
    std::string exe = SelfExe();
    if (exe.empty()) return "cannot read /proc/self/exe";
    int ready[2], ctl[2];
    if (pipe2(ready, O_CLOEXEC) != 0 || pipe2(ctl, O_CLOEXEC) != 0)
      return std::string("pipe: ") + std::strerror(errno);
    std::vector<std::string> args = {exe,          "serve",
                                     "--listen",   "127.0.0.1:0",
                                     "--span",     std::to_string(c.span),
                                     "--ready-fd", std::to_string(ready[1]),
                                     "--ctl-fd",   std::to_string(ctl[0])};
    if (!c.transport.empty()) args.insert(args.end(), {"--transport", c.transport});
    if (c.streams > 0) args.insert(args.end(), {"--streams", std::to_string(c.streams)});
    std::vector<char*> cargv;
    for (auto& a : args) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) return std::string("fork: ") + std::strerror(errno);
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent) _exit(1);
      // The child's ends survive exec.
      fcntl(ready[1], F_SETFD, 0);
      fcntl(ctl[0], F_SETFD, 0);
      execv(exe.c_str(), cargv.data());
      dprintf(ready[1], "ERROR exec %s: %s\n", exe.c_str(), std::strerror(errno));
      _exit(127);
    }
    pid_ = pid;
    close(ready[1]);
    close(ctl[0]);
    ctl_ = ctl[1];

    // Wait for "READY name addr len" (or "ERROR msg", or EOF) for up to 30 s.
    std::string line;
    uint64_t deadline = NowNs() + 30000000000ull;
    char buf[512];
    while (line.find('\n') == std::string::npos) {
      int64_t left_ms = (int64_t(deadline) - int64_t(NowNs())) / 1000000;
      if (left_ms <= 0) break;
      pollfd p{ready[0], POLLIN, 0};
      int r = poll(&p, 1, int(left_ms));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      ssize_t n = read(ready[0], buf, sizeof buf);
      if (n <= 0) break;
      line.append(buf, size_t(n));
    }
    close(ready[0]);
    if (line.rfind("READY ", 0) != 0) {
      Stop();
      while (!line.empty() && line.back() == '\n') line.pop_back();
      if (line.rfind("ERROR ", 0) == 0) return "the target process failed: " + line.substr(6);
      return line.empty() ? "the target process exited or did not answer within 30 s"
                          : "unexpected answer from the target process: " + line;
    }
    std::istringstream in(line.substr(6));
    in >> name_ >> addr_ >> len_;
    return "";
  }

  // In-process target engine (the "local" transport moves bytes by memcpy within a process).
  std::string StartInProcess(const Config& c) {
    if (!region_.Allocate(c.span)) return "cannot allocate " + FormatSize(c.span);
    engine_ = std::make_unique<Engine>();
    Status st = engine_->Initialize("127.0.0.1:0", MakeEngineOptions(c));
    if (!st.ok()) return "target Initialize: " + st.ToString();
    xfer::MemHandle h;
    st = engine_->RegisterMem(region_.data(), region_.size(), xfer::MemType::kHost, &h, kRegionTag);
    if (!st.ok()) return "target RegisterMem: " + st.ToString();
    name_ = engine_->LocalName();
    addr_ = region_.addr();
    len_ = region_.size();
    return "";
  }

  void Stop() {
    if (engine_) {
      engine_->Finalize();
      engine_.reset();
    }
    if (ctl_ >= 0) close(ctl_);
    ctl_ = -1;
    if (pid_ > 0) {
      int st;
      for (int i = 0; i < 500; ++i) {  // up to 5 s for a clean exit
        if (waitpid(pid_, &st, WNOHANG) == pid_) {
          pid_ = -1;
          return;
        }
        usleep(10000);
      }
      kill(pid_, SIGKILL);
      waitpid(pid_, &st, 0);
      pid_ = -1;
    }
  }

  const std::string& name() const { return name_; }
  int pid() const { return pid_; }
  bool in_process() const { return engine_ != nullptr; }

 private:
  int pid_ = -1;
  int ctl_ = -1;
  std::string name_;
  uint64_t addr_ = 0, len_ = 0;
  std::unique_ptr<Engine> engine_;
  Span region_;
};

// ---------------------------------------------------------------------------------------------
// The initiator side

struct Row {
  std::string test;
  uint64_t bytes = 0;
  uint64_t requests = 0;
  uint64_t descs = 0;
  double seconds = 0;
  double bw_avg = 0;   // GB/s
  double bw_peak = 0;  // GB/s
  double msg_rate = 0; // Mops (descriptors)
  LatStats lat;        // per request, us
  double cpu = -1;     // % of one CPU, this process
  double srv_cpu = -1; // % of one CPU, the target process (local child only)
  std::string verify;  // "", "ok", "FAILED: ..."
};

class Bench {
 public:
  Bench(const Config& c, std::string argv0, std::string invoked)
      : c_(c), argv0_(std::move(argv0)), invoked_(std::move(invoked)) {}

  int Run();

 private:
  std::string Setup();
  void PrintHeader();
  void PrintTableHeader(const std::string& test);
  void PrintRow(const Row& r);
  bool RunSize(const std::string& test, uint64_t block, Row* row, std::string* err);
  std::string Verify(Op op, const Layout& lay);
  void BuildDescs(const Layout& lay, uint64_t req, std::vector<TransferDesc>* d) const;
  std::chrono::milliseconds TimeoutFor(uint64_t bytes) const {
    return std::chrono::milliseconds(10000 + bytes / 100000);  // 10 s + 100 MB/s worth
  }
  bool WriteJson(std::string* err);
  bool WriteCsv(std::string* err);

  Config c_;
  std::string argv0_, invoked_;
  LocalTarget target_;
  Engine engine_;
  std::string peer_;
  xfer::PeerInfo peer_info_;
  uint64_t remote_addr_ = 0, remote_len_ = 0;
  Span local_;
  std::vector<Row> rows_;
  Progress progress_;
  bool verify_failed_ = false;
};

std::string Bench::Setup() {
  std::string err;
  if (c_.peer.empty()) {
    err = c_.transport == "local" ? target_.StartInProcess(c_) : target_.StartChild(c_);
    if (!err.empty()) return err;
    peer_ = target_.name();
  } else {
    peer_ = c_.peer;
  }
  if (!local_.Allocate(c_.span)) return "cannot allocate " + FormatSize(c_.span) + " of local buffers";

  Status st = engine_.Initialize(c_.local_name, MakeEngineOptions(c_));
  if (!st.ok()) return "Initialize(" + c_.local_name + "): " + st.ToString();
  xfer::MemHandle h;
  st = engine_.RegisterMem(local_.data(), local_.size(), xfer::MemType::kHost, &h, "xfer-bench-local");
  if (!st.ok()) return "RegisterMem (local buffers): " + st.ToString();

  // Start order must not matter: retry until the connect timeout.
  uint64_t deadline = NowNs() + uint64_t(c_.connect_timeout * 1e9);
  for (;;) {
    st = engine_.Connect(peer_, std::chrono::milliseconds(2000));
    if (st.ok() || st.code() == xfer::StatusCode::kAlreadyConnected) break;
    if (st.code() == xfer::StatusCode::kInvalidArgument || NowNs() >= deadline)
      return "Connect(" + peer_ + "): " + st.ToString();
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  st = engine_.GetPeerInfo(peer_, &peer_info_);
  if (!st.ok()) return "GetPeerInfo(" + peer_ + "): " + st.ToString();

  std::vector<xfer::RegionInfo> regions;
  st = engine_.GetRemoteRegions(peer_, &regions);
  if (!st.ok()) return "GetRemoteRegions(" + peer_ + "): " + st.ToString();
  const xfer::RegionInfo* best = nullptr;
  for (const auto& r : regions) {
    if (r.type != xfer::MemType::kHost) continue;
    if (r.tag == kRegionTag && (!best || best->tag != kRegionTag || r.len > best->len)) best = &r;
  }
  if (!best) return "the peer " + peer_ + " advertises no host region tagged '" + kRegionTag +
                    "' (is it an xfer-bench serve?)";
  remote_addr_ = best->addr;
  remote_len_ = best->len;
  uint64_t need = 0;
  for (uint64_t b : c_.sizes) need = std::max(need, b * c_.batch);
  if (remote_len_ < need)
    return "the peer's region (" + FormatSize(remote_len_) + ") is smaller than one request (" +
           FormatSize(need) + "): start the server with a larger --span";
  return "";
}

void Bench::PrintHeader() {
  std::string tests;
  for (auto& t : c_.tests) tests += (tests.empty() ? "" : ", then ") + t;
  std::printf("# xfer-bench %s: %s\n", XFER_TOOLS_VERSION, tests.c_str());
  std::string where;
  if (target_.in_process()) where = "a target engine in this process";
  else if (c_.peer.empty()) where = "a local target child process, pid " + std::to_string(target_.pid());
  else where = "a remote xfer-bench serve";
  std::printf("# peer:      %s (%s); transport %s%s; streams %s\n", peer_.c_str(), where.c_str(),
              peer_info_.transport.c_str(), c_.transport.empty() ? " (best available)" : " (forced)",
              c_.streams ? std::to_string(c_.streams).c_str()
                         : (std::to_string(EngineOptions{}.streams) + " (default)").c_str());
  std::string sizes = c_.size_arg + " (" + std::to_string(c_.sizes.size()) +
                      (c_.sizes.size() == 1 ? " size)" : " sizes)");
  std::printf("# sizes:     %s; batch %" PRIu64 " descriptor%s per request; depth %" PRIu64
              " request%s in flight\n",
              sizes.c_str(), c_.batch, c_.batch > 1 ? "s" : "", c_.depth, c_.depth > 1 ? "s" : "");
  char dur[32];
  std::snprintf(dur, sizeof dur, "%g", c_.duration);
  std::string run = c_.iters ? std::to_string(c_.iters) + " requests per size"
                             : std::string(dur) + " s per size";
  std::string warm = c_.warmup >= 0 ? std::to_string(c_.warmup) + " requests"
                                    : "one pass over the buffers (at least 8 requests, at most 1 s)";
  std::printf("# run:       %s; warm-up %s%s\n", run.c_str(), warm.c_str(),
              c_.verify ? "; --verify: data checked after each size (not timed)" : "");
  if (c_.reuse)
    std::printf("# buffers:   --reuse: every request uses the same blocks (%s per side)\n",
                FormatSize(c_.span).c_str());
  else
    std::printf("# buffers:   walk a %s span per side, larger than the CPU caches (--reuse: one "
                "set, as perftest); remote blocks pair-swapped so none coalesce\n",
                FormatSize(c_.span).c_str());
  if (remote_len_ / c_.span == 0)
    std::printf("# remote:    the peer's region is %s, smaller: remote blocks wrap around in it\n",
                FormatSize(remote_len_).c_str());
  std::printf("# host:      %s\n", MachineLine().c_str());
  std::printf("# units:     GB/s = 1e9 B/s, Gb/s = 1e9 bit/s; #iters = requests; MsgRate = "
              "descriptors/s; p50..p99.9 = request latency; CPU%% = this process, srv = the "
              "target process (100 = one core)\n");
  std::printf("# rerun:     %s\n", RerunCommand(argv0_, c_).c_str());
  if (invoked_ != RerunCommand(argv0_, c_)) std::printf("# invoked:   %s\n", invoked_.c_str());
  std::fflush(stdout);
}

void Bench::PrintTableHeader(const std::string& test) {
  std::printf("\n## %s (%s)\n", test.c_str(), TestOp(test) == Op::kWrite ? "WRITE" : "READ");
  if (IsLat(test))
    std::printf("%-10s %10s %11s %11s %11s %11s %11s %11s %11s %7s\n", "#bytes", "#iters",
                "t_min[us]", "t_max[us]", "t_typ[us]", "t_avg[us]", "t_stdev[us]", "99%[us]",
                "99.9%[us]", "CPU%");
  else
    std::printf("%-10s %10s %13s %13s %14s %14s %10s %10s %11s %7s %7s\n", "#bytes", "#iters",
                "BW avg[GB/s]", "BW avg[Gb/s]", "BW peak[GB/s]", "MsgRate[Mops]", "p50[us]",
                "p99[us]", "p99.9[us]", "CPU%", "srvCPU%");
  std::fflush(stdout);
}

std::string Pct(double v) {
  if (v < 0) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.0f", v);
  return b;
}

void Bench::PrintRow(const Row& r) {
  if (IsLat(r.test))
    std::printf("%-10" PRIu64 " %10" PRIu64 " %11.2f %11.2f %11.2f %11.2f %11.2f %11.2f %11.2f %7s\n",
                r.bytes, r.requests, r.lat.min, r.lat.max, r.lat.median, r.lat.avg, r.lat.stdev,
                r.lat.p99, r.lat.p999, Pct(r.cpu).c_str());
  else
    std::printf("%-10" PRIu64 " %10" PRIu64 " %13.2f %13.2f %14.2f %14.4f %10.1f %10.1f %11.1f %7s %7s\n",
                r.bytes, r.requests, r.bw_avg, r.bw_avg * 8, r.bw_peak, r.msg_rate, r.lat.p50,
                r.lat.p99, r.lat.p999, Pct(r.cpu).c_str(), Pct(r.srv_cpu).c_str());
  if (!r.verify.empty() && r.verify != "ok") std::printf("# verify %s B: %s\n", FormatSize(r.bytes).c_str(), r.verify.c_str());
  std::fflush(stdout);
}

void Bench::BuildDescs(const Layout& lay, uint64_t req, std::vector<TransferDesc>* d) const {
  d->resize(lay.batch);
  for (uint64_t j = 0; j < lay.batch; ++j) {
    (*d)[j].local_addr = local_.addr() + lay.LocalOff(req, j);
    (*d)[j].remote_addr = remote_addr_ + lay.RemoteOff(req, j);
    (*d)[j].len = lay.block;
  }
}

// Round trip on the first and the last request's blocks: fill with a pattern, WRITE, clear,
// READ back, compare. Uses the benchmark's own descriptors, so a misplaced block shows.
std::string Bench::Verify(Op op, const Layout& lay) {
  (void)op;
  std::vector<TransferDesc> d;
  uint64_t last = lay.reuse ? 0 : lay.RequestsPerPass() - 1;
  for (uint64_t req : {uint64_t(0), last}) {
    BuildDescs(lay, req, &d);
    for (uint64_t j = 0; j < d.size(); ++j)
      FillPattern(reinterpret_cast<uint8_t*>(d[j].local_addr), d[j].len, req * lay.batch + j + lay.block);
    Status st = engine_.TransferSync(peer_, Op::kWrite, d, TimeoutFor(lay.block * lay.batch));
    if (!st.ok()) return "WRITE: " + st.ToString();
    for (auto& x : d) std::memset(reinterpret_cast<void*>(x.local_addr), 0, x.len);
    st = engine_.TransferSync(peer_, Op::kRead, d, TimeoutFor(lay.block * lay.batch));
    if (!st.ok()) return "READ: " + st.ToString();
    std::vector<uint8_t> want(lay.block);
    for (uint64_t j = 0; j < d.size(); ++j) {
      FillPattern(want.data(), lay.block, req * lay.batch + j + lay.block);
      if (std::memcmp(want.data(), reinterpret_cast<void*>(d[j].local_addr), lay.block) != 0)
        return "FAILED: request " + std::to_string(req) + " descriptor " + std::to_string(j) +
               " read back different data";
    }
  }
  return "ok";
}

bool Bench::RunSize(const std::string& test, uint64_t block, Row* row, std::string* err) {
  const Op op = TestOp(test);
  const bool lat = IsLat(test);
  const uint64_t depth = lat ? 1 : c_.depth;
  Layout lay;
  lay.block = block;
  lay.batch = c_.batch;
  lay.reuse = c_.reuse;
  lay.local_slots = local_.size() / block;
  lay.remote_slots = remote_len_ / block;
  const uint64_t req_bytes = block * c_.batch;
  const auto timeout = TimeoutFor(req_bytes);

  std::vector<TransferDesc> descs;
  uint64_t req = 0;
  auto fail = [&](const Status& st) {
    *err = std::string(test) + " " + std::to_string(block) + " B: " + st.ToString();
    return false;
  };

  // Warm-up.
  {
    uint64_t n = c_.warmup >= 0 ? uint64_t(c_.warmup) : std::max<uint64_t>(8, lay.RequestsPerPass());
    uint64_t t0 = NowNs();
    for (uint64_t i = 0; i < n; ++i) {
      if (c_.warmup < 0 && NowNs() - t0 > 1000000000ull) break;
      BuildDescs(lay, req++, &descs);
      Status st = engine_.TransferSync(peer_, op, descs, timeout);
      if (!st.ok()) return fail(st);
    }
  }

  std::vector<uint64_t> samples;
  constexpr size_t kMaxSamples = 20000000;
  samples.reserve(c_.iters ? std::min<uint64_t>(c_.iters, kMaxSamples) : 4096);
  const uint64_t dur_ns = uint64_t(c_.duration * 1e9);
  const double srv0 = target_.pid() > 0 ? OtherProcessCpuSeconds(target_.pid()) : -1;
  const uint64_t cpu0 = ProcessCpuNs();
  const uint64_t start = NowNs();
  uint64_t end = start;
  uint64_t done = 0, submitted = 0;
  // Peak: the best of consecutive windows of at least 10 ms.
  uint64_t win_start = start, win_bytes = 0;
  double peak = 0;
  progress_.SetUnit(c_.iters != 0);
  auto more = [&](uint64_t now) {
    return c_.iters ? submitted < c_.iters : now - start < dur_ns;
  };
  auto complete = [&](uint64_t t_submit, uint64_t now) {
    if (samples.size() < kMaxSamples) samples.push_back(now - t_submit);
    ++done;
    end = now;
    win_bytes += req_bytes;
    if (now - win_start >= 10000000ull) {
      peak = std::max(peak, double(win_bytes) / double(now - win_start));
      win_start = now;
      win_bytes = 0;
    }
    if ((done & 63) == 0)
      progress_.Show(test, block, c_.iters ? double(done) : double(now - start) / 1e9,
                     c_.iters ? double(c_.iters) : c_.duration);
  };

  if (depth == 1) {
    uint64_t now = start;
    do {
      BuildDescs(lay, req++, &descs);
      uint64_t t0 = NowNs();
      Status st = engine_.TransferSync(peer_, op, descs, timeout);
      now = NowNs();
      ++submitted;
      if (!st.ok()) return fail(st);
      complete(t0, now);
    } while (more(now));
  } else {
    struct Slot {
      xfer::RequestHandle h = 0;
      uint64_t t0 = 0;
    };
    std::vector<Slot> ring(depth);
    size_t head = 0, inflight = 0;
    auto submit = [&](Slot& s) {
      BuildDescs(lay, req++, &descs);
      s.t0 = NowNs();
      Status st = engine_.TransferAsync(peer_, op, descs, timeout, &s.h);
      ++submitted;
      return st;
    };
    for (size_t i = 0; i < depth && more(NowNs()); ++i) {
      Status st = submit(ring[i]);
      if (!st.ok()) return fail(st);
      ++inflight;
    }
    while (inflight > 0) {
      Slot& s = ring[head];
      xfer::RequestStatus rs;
      Status st = engine_.Wait(s.h, timeout, &rs);
      uint64_t now = NowNs();
      if (!st.ok()) {
        // Let the others end before reporting.
        for (size_t k = 1; k < inflight; ++k) {
          Slot& o = ring[(head + k) % depth];
          engine_.Cancel(o.h).ok();
          engine_.Wait(o.h, timeout).ok();
        }
        return fail(st);
      }
      complete(s.t0, now);
      --inflight;
      if (more(now)) {
        st = submit(s);
        if (!st.ok()) return fail(st);
        ++inflight;
      }
      head = (head + 1) % depth;
    }
  }
  progress_.Clear();
  const uint64_t cpu1 = ProcessCpuNs();
  const double srv1 = target_.pid() > 0 ? OtherProcessCpuSeconds(target_.pid()) : -1;
  const double secs = double(end - start) / 1e9;

  row->test = test;
  row->bytes = block;
  row->requests = done;
  row->descs = done * c_.batch;
  row->seconds = secs;
  row->bw_avg = secs > 0 ? double(done * req_bytes) / secs / 1e9 : 0;
  row->bw_peak = std::max(peak, row->bw_avg);
  row->msg_rate = secs > 0 ? double(row->descs) / secs / 1e6 : 0;
  row->lat = ComputeLatStats(samples);
  row->cpu = secs > 0 ? double(cpu1 - cpu0) / 1e9 / secs * 100 : -1;
  row->srv_cpu = (srv0 >= 0 && srv1 >= 0 && secs > 0) ? (srv1 - srv0) / secs * 100 : -1;
  if (c_.verify) {
    row->verify = Verify(op, lay);
    if (row->verify != "ok") verify_failed_ = true;
  }
  return true;
}

#ifdef XFER_BENCH_HAVE_JSON
bool Bench::WriteJson(std::string* err) {
  using nlohmann::json;
  json j;
  j["schema"] = "xfer-bench";
  j["schema_version"] = 1;
  j["xfer_version"] = XFER_TOOLS_VERSION;
  j["command"] = RerunCommand(argv0_, c_);
  j["invoked"] = invoked_;
  j["host"] = MachineLine();
  j["config"] = {{"tests", c_.tests},
                 {"sizes", c_.sizes},
                 {"iters", c_.iters},
                 {"duration_s", c_.duration},
                 {"warmup", c_.warmup},
                 {"batch", c_.batch},
                 {"depth", c_.depth},
                 {"streams", c_.streams ? c_.streams : EngineOptions{}.streams},
                 {"transport_requested", c_.transport},
                 {"pattern", c_.reuse ? "reuse" : "walk"},
                 {"span_bytes", c_.span},
                 {"verify", c_.verify}};
  j["peer"] = {{"name", peer_},
               {"transport", peer_info_.transport},
               {"pid", peer_info_.pid},
               {"host_id", peer_info_.host_id},
               {"local_target", c_.peer.empty()}};
  json rows = json::array();
  for (const Row& r : rows_) {
    json x = {{"test", r.test},
              {"op", TestOp(r.test) == Op::kWrite ? "WRITE" : "READ"},
              {"bytes", r.bytes},
              {"iters", r.requests},
              {"descriptors", r.descs},
              {"seconds", r.seconds},
              {"bw_avg_GBps", r.bw_avg},
              {"bw_avg_Gbps", r.bw_avg * 8},
              {"bw_peak_GBps", r.bw_peak},
              {"msg_rate_Mops", r.msg_rate},
              {"lat_us",
               {{"samples", r.lat.n},
                {"min", r.lat.min},
                {"max", r.lat.max},
                {"typical", r.lat.median},
                {"avg", r.lat.avg},
                {"stdev", r.lat.stdev},
                {"p50", r.lat.p50},
                {"p99", r.lat.p99},
                {"p99_9", r.lat.p999}}},
              {"cpu_pct", r.cpu >= 0 ? json(r.cpu) : json(nullptr)},
              {"server_cpu_pct", r.srv_cpu >= 0 ? json(r.srv_cpu) : json(nullptr)},
              {"verify", r.verify.empty() ? json(nullptr) : json(r.verify)}};
    rows.push_back(std::move(x));
  }
  j["rows"] = std::move(rows);
  std::ofstream f(c_.json_file);
  if (!f) {
    *err = "cannot write " + c_.json_file;
    return false;
  }
  f << j.dump(2) << "\n";
  return bool(f);
}
#else
bool Bench::WriteJson(std::string* err) {
  *err = "--json: this xfer-bench was built without nlohmann-json";
  return false;
}
#endif

bool Bench::WriteCsv(std::string* err) {
  std::ofstream f(c_.csv_file);
  if (!f) {
    *err = "cannot write " + c_.csv_file;
    return false;
  }
  f << "test,op,bytes,iters,descriptors,seconds,bw_avg_GBps,bw_avg_Gbps,bw_peak_GBps,"
       "msg_rate_Mops,t_min_us,t_max_us,t_typical_us,t_avg_us,t_stdev_us,p50_us,p99_us,p99_9_us,"
       "cpu_pct,server_cpu_pct,verify,transport,batch,depth,pattern\n";
  for (const Row& r : rows_) {
    f << r.test << ',' << (TestOp(r.test) == Op::kWrite ? "WRITE" : "READ") << ',' << r.bytes << ','
      << r.requests << ',' << r.descs << ',' << r.seconds << ',' << r.bw_avg << ',' << r.bw_avg * 8
      << ',' << r.bw_peak << ',' << r.msg_rate << ',' << r.lat.min << ',' << r.lat.max << ','
      << r.lat.median << ',' << r.lat.avg << ',' << r.lat.stdev << ',' << r.lat.p50 << ','
      << r.lat.p99 << ',' << r.lat.p999 << ',' << (r.cpu >= 0 ? std::to_string(r.cpu) : "") << ','
      << (r.srv_cpu >= 0 ? std::to_string(r.srv_cpu) : "") << ',' << r.verify << ','
      << peer_info_.transport << ',' << c_.batch << ',' << c_.depth << ','
      << (c_.reuse ? "reuse" : "walk") << '\n';
  }
  return bool(f);
}

int Bench::Run() {
  std::string err = Setup();
  if (!err.empty()) {
    std::fprintf(stderr, "xfer-bench: %s\n", err.c_str());
    return 1;
  }
  PrintHeader();
  for (const auto& test : c_.tests) {
    PrintTableHeader(test);
    for (uint64_t b : c_.sizes) {
      Row row;
      if (!RunSize(test, b, &row, &err)) {
        progress_.Clear();
        std::fprintf(stderr, "xfer-bench: %s\n", err.c_str());
        return 1;
      }
      PrintRow(row);
      rows_.push_back(row);
    }
  }
  engine_.Finalize();
  target_.Stop();
  if (!c_.json_file.empty() && !WriteJson(&err)) {
    std::fprintf(stderr, "xfer-bench: %s\n", err.c_str());
    return 1;
  }
  if (!c_.csv_file.empty() && !WriteCsv(&err)) {
    std::fprintf(stderr, "xfer-bench: %s\n", err.c_str());
    return 1;
  }
  if (verify_failed_) {
    std::fprintf(stderr, "xfer-bench: --verify found wrong data (see the table)\n");
    return 1;
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Command line

void AddTestOptions(CLI::App* app, Config& c) {
  app->add_option("-s,--size", c.size_arg,
                  "Block sizes: one (64K), a list (4K,1M) or a doubling range (16K:8M); K/M/G "
                  "are binary")
      ->type_name("SIZES")
      ->capture_default_str();
  app->add_flag("-a,--all", c.all, "All sizes from 2 B to 8 MiB, doubling");
  app->add_option("-n,--iters", c.iters, "Requests per size (instead of --duration)")
      ->check(CLI::PositiveNumber);
  app->add_option("-D,--duration", c.duration, "Timed seconds per size")
      ->check(CLI::Range(0.001, 3600.0))
      ->capture_default_str();
  app->add_option("-w,--warmup", c.warmup,
                  "Warm-up requests per size (default: one pass over the buffers, >= 8, <= 1 s)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--batch", c.batch, "Descriptors per request")
      ->check(CLI::Range(uint64_t(1), uint64_t(1000000)))
      ->capture_default_str();
  app->add_option("--depth", c.depth, "Requests in flight (TransferAsync); latency tests use 1")
      ->check(CLI::Range(uint64_t(1), uint64_t(1024)))
      ->capture_default_str();
  app->add_option("--streams", c.streams, "Engine data streams (worker threads); default: the engine's")
      ->check(CLI::Range(1, 64));
  app->add_option("--slice-bytes", c.slice_arg,
                  "EngineOptions::slice_bytes: longer descriptors are cut (default 1M)")
      ->type_name("BYTES");
  app->add_option("--batch-bytes", c.batch_bytes_arg,
                  "EngineOptions::batch_bytes: bytes per batch / system call (default 4M)")
      ->type_name("BYTES");
  app->add_option("--spin", c.spin_us,
                  "EngineOptions::spin in us: how long waiters and idle streams spin before they "
                  "sleep (default 50)")
      ->check(CLI::Range(int64_t(0), int64_t(1000000)));
  app->add_option("--transport", c.transport,
                  "Force a transport (local, cma, ...); default: the best both sides offer")
      ->type_name("NAME");
  app->add_flag("--reuse", c.reuse,
                "Every request uses the same buffers (as perftest); default: walk a span larger "
                "than the CPU caches");
  app->add_option("--span", c.span_arg, "Bytes walked per side without --reuse (default 256M)")
      ->type_name("BYTES");
  app->add_flag("--verify", c.verify, "Check the data after each size (not timed)");
  app->add_option("--json", c.json_file, "Also write every row as JSON to FILE")->type_name("FILE");
  app->add_option("--csv", c.csv_file, "Also write every row as CSV to FILE")->type_name("FILE");
  app->add_option("--local", c.local_name,
                  "This engine's name (a host alone: client-only); default 127.0.0.1 for a local "
                  "target, 0.0.0.0 otherwise");
  app->add_option("--connect-timeout", c.connect_timeout,
                  "Seconds to keep retrying the connection to the peer")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  Config c;
  CLI::App app{
      "xfer-bench: bandwidth and latency of xfer transfers.\n"
      "With no test it runs the main job: a local target child, WRITE then READ, 16K..8M."};
  app.set_version_flag("--version", std::string("xfer-bench ") + XFER_TOOLS_VERSION);
  app.require_subcommand(0, 1);
  app.footer(
      "Examples:\n"
      "  xfer-bench                               the main job (same host, child target)\n"
      "  xfer-bench write_bw -s 4K:1M --batch 64  one test, local child target\n"
      "  xfer-bench serve --listen 0.0.0.0:18515  on the target machine, then on the other:\n"
      "  xfer-bench read_bw -a HOST:18515\n"
      "Units: GB/s = 1e9 B/s. Argument errors exit with 2.");
  AddTestOptions(&app, c);

  const std::vector<std::pair<std::string, std::string>> tests = {
      {"write_bw", "WRITE bandwidth and message rate"},
      {"read_bw", "READ bandwidth and message rate"},
      {"write_lat", "WRITE latency of one request, end to end"},
      {"read_lat", "READ latency of one request, end to end"}};
  std::vector<CLI::App*> test_apps;
  for (const auto& [name, desc] : tests) {
    CLI::App* sub = app.add_subcommand(name, desc);
    AddTestOptions(sub, c);
    sub->add_option("peer", c.peer,
                    "host:port of an `xfer-bench serve`; without it a local target child is started");
    test_apps.push_back(sub);
  }
  CLI::App* serve = app.add_subcommand("serve", "Be the target side: register a region and wait");
  serve->add_option("--listen", c.listen, "host:port to listen on (port 0: any free port)")
      ->capture_default_str();
  serve->add_option("--span", c.span_arg, "Bytes of the registered region (default 256M)")
      ->type_name("BYTES");
  serve->add_option("--transport", c.transport, "Offer only this transport");
  serve->add_option("--streams", c.streams, "Engine data streams")->check(CLI::Range(1, 64));
  serve->add_option("--ready-fd", c.ready_fd, "")->group("");  // hidden: local child mode
  serve->add_option("--ctl-fd", c.ctl_fd, "")->group("");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : kExitArgs;
  }

  try {
    if (serve->parsed()) {
      if (!c.span_arg.empty() && !ParseSize(c.span_arg, &c.walk_span))
        throw ArgError{"--span: bad size '" + c.span_arg + "' (example: 256M)"};
      if (c.walk_span > MaxSpan())
        throw ArgError{"--span: " + FormatSize(c.walk_span) + " is over a quarter of this machine's memory"};
      return RunServe(c);
    }
    for (size_t i = 0; i < test_apps.size(); ++i)
      if (test_apps[i]->parsed()) c.tests = {tests[i].first};
    if (c.tests.empty()) {
      c.main_job = true;
      c.tests = {"write_bw", "read_bw"};
    }
    Resolve(c);
  } catch (const ArgError& e) {
    std::fprintf(stderr, "xfer-bench: %s\nRun with --help for more information.\n", e.msg.c_str());
    return kExitArgs;
  }
  Bench bench(c, argv[0], JoinArgv(argc, argv));
  return bench.Run();
}
