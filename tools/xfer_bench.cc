// xfer-bench: the benchmark users of this field know (perftest's ib_write_bw, ucx_perftest,
// nixlbench, HIXL's per-block-size tables), for xfer.
//
//   xfer-bench                                   the main job: a local target child, WRITE then
//                                                READ, 16K..8M, best same-host transport;
//                                                buffers from Engine::AllocMem, so shm
//   xfer-bench write_bw|read_bw|write_lat|read_lat|table [options] [host:port]
//                                                one test; without a peer, a local target child
//   xfer-bench serve [--listen host:port]        the target side for two-machine runs
//
// The client and the target talk over the bench's own control channel: newline-delimited JSON
// on a TCP connection to the serve port (remote), or on a socketpair (a local child process, or a
// thread of this process for --transport local). The client sends its whole configuration; the
// target starts an engine with those options, registers its region and answers with its engine
// name. Per size the client marks the timed window (the target reports its CPU time, and with
// -b/--bidirectional runs the same test toward the client at the same time).
//
// --mem alloc (default): both sides' buffers come from Engine::AllocMem, so a same-host peer
// maps them and moves bytes with memcpy (path shm); --mem register: mmap + RegisterMem (cma).
// After each test a "# path:" line says where the bytes went (GetPeerInfo's counters: shm, the
// transport, cuda, staged through the buffer pool).
//
// GPU memory: --local-mem cuda:N puts this side's buffers on GPU N, --remote-mem cuda:N the
// target's region on the target's GPU N (the side concerned allocates it: Engine::AllocMem(kCuda),
// or with --mem register cudaMalloc + RegisterMem(kCuda)). On one host the engine moves such
// pairs with the copy engines (path cuda: CUDA IPC); across hosts through its buffer pool.
// --buffer-pool sets EngineOptions::staging = "always" on both sides: every transfer is staged,
// host memory standing in for GPU memory. --verify fills and checks GPU buffers through
// cuda::Copy. Without a usable GPU (or a build without CUDA), cuda:N is refused with the reason.
//
// Buffer pattern, block layout and statistics come from bench_util.h, shared with the raw
// baselines in bench/, so that both measure the same thing.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "transport/cuda/cuda_api.h"
#include "xfer/engine.h"

#ifndef XFER_TOOLS_VERSION
#define XFER_TOOLS_VERSION "unknown"
#endif

namespace {

using namespace xfer::bench;
using json = nlohmann::json;
using xfer::Engine;
using xfer::EngineOptions;
using xfer::Op;
using xfer::Status;
using xfer::TransferDesc;

constexpr int kExitArgs = 2;
constexpr int kExitExpect = 3;  // --expect-bw / --expect-p99 not met
constexpr const char* kRegionTag = "xfer-bench";
constexpr const char* kLocalTag = "xfer-bench-local";
constexpr const char* kDefaultListen = "0.0.0.0:18515";  // perftest's port, for familiarity
constexpr const char* kCtlSchema = "xfer-bench-ctl";
// 2: the configuration carries mem and huge_pages; rows carry the bytes moved per path.
// 3: local_mem / remote_mem may be cuda:N (the target allocates its region on its GPU), the
//    configuration carries buffer_pool, staging_buffers and staging_bytes, the ready reply the region's memory ("region_mem"),
//    rows carry cuda_bytes / staged_bytes.
constexpr int kCtlVersion = 3;
constexpr const char* kJsonSchema = "xfer-bench";
// 3: config.mem / config.huge_pages, peer.shm, rows' shm_bytes / transport_bytes, paths[].
// 4: GPU memory and the buffer pool: config.buffer_pool and config.staging, peer.cuda, rows'
//    and paths[]' cuda_bytes / staged_bytes (paths[] also cuda_pct / staged_pct; the
//    percentages are of shm + transport + cuda + staged bytes), table cells under transport
//    "cuda" and path "bufferpool" measured where a GPU / the pool is usable, and the table's
//    direction read as local (initiator) memory to remote (target) memory for READ too.
constexpr int kJsonVersion = 4;

struct ArgError {
  std::string msg;
};

// Transports the table tries, in order. A name the engine does not know is reported "not built";
// a new transport needs only its name here.
const std::vector<std::string> kKnownTransports = {"local", "cma", "shm", "tcp", "ucx", "cuda"};
// Memory kinds of the table's directions: H = host, D = device (cuda); the first letter is the
// initiator's (local) memory, the second the target's (remote) region, for WRITE and READ alike.
const std::vector<std::string> kDirections = {"D2D", "H2D", "D2H", "H2H"};
const std::vector<std::string> kPaths = {"direct", "bufferpool"};

// ---------------------------------------------------------------------------------------------
// Configuration

struct Config {
  // Tests to run, in order: "write_bw", "read_bw", "write_lat", "read_lat", or "table".
  std::vector<std::string> tests;
  bool main_job = false;  // no subcommand: write_bw then read_bw

  std::string size_arg = "16K:8M";
  bool all = false;
  std::vector<uint64_t> sizes;
  uint64_t iters = 0;      // requests per size (all threads together); 0 = use the duration
  double duration = 1.0;   // seconds per size
  int64_t warmup = -1;     // requests per thread; -1 = one pass over the span (>= 8, <= 1 s)
  uint64_t batch = 1;      // descriptors per request
  uint64_t depth = 1;      // requests in flight, per thread
  int threads = 1;         // client threads issuing requests concurrently
  int links = 0;           // 0 = the transport's default
  int streams = 0;         // 0 = the engine's default
  std::string slice_arg, batch_bytes_arg;  // EngineOptions::slice_bytes / batch_bytes
  uint64_t slice_bytes = 0, batch_bytes = 0;
  int64_t spin_us = -1;    // EngineOptions::spin; -1 = the engine's default
  std::string transport;   // empty = the best both sides offer
  // "host" or "cuda:N": this side's buffers (and a bidirectional peer's), the target's region
  // (and this side's, bidirectional).
  std::string local_mem = "host", remote_mem = "host";
  // How both sides get their buffers: "alloc" = Engine::AllocMem (a memfd that a same-host peer
  // maps: path shm), "register" = mmap'd memory + RegisterMem (same host: cma).
  std::string mem = "alloc";
  bool huge_pages = false;  // AllocOptions::huge_pages (alloc only)
  bool buffer_pool = false;  // EngineOptions::staging = "always" on both sides
  int staging_buffers = 0;   // EngineOptions::staging_buffers; 0 = the engine's default
  std::string staging_bytes_arg;  // EngineOptions::staging_buffer_bytes as typed
  uint64_t staging_bytes = 0;     // 0 = the engine's default
  bool bidir = false;
  bool reuse = false;
  uint64_t walk_span = kDefaultSpan;
  std::string span_arg;    // --span as typed
  bool verify = false;
  double expect_bw = -1;   // GB/s, every bandwidth row
  double expect_p99 = -1;  // us, every row
  std::string json_file, csv_file;
  std::string peer;        // host:port of a serve; empty = local target
  std::string local_name;  // the client engine's name (host alone: client-only)
  std::string host_id;     // EngineOptions::host_id of this side
  double connect_timeout = 30;

  // serve
  std::string listen = kDefaultListen;
  int ctl_fd = -1;     // hidden: serve one client on this fd (a local child), then exit
  bool once = false;   // serve one client, then exit

  uint64_t span = 0;  // resolved bytes per side
};

bool IsLat(const std::string& t) { return t.size() > 4 && t.substr(t.size() - 4) == "_lat"; }
Op TestOp(const std::string& t) { return t.rfind("write", 0) == 0 ? Op::kWrite : Op::kRead; }
const char* OpUpper(Op op) { return op == Op::kWrite ? "WRITE" : "READ"; }

// A --local-mem / --remote-mem value: "host", or "cuda:N" (GPU N).
struct MemSpec {
  bool device = false;
  int32_t gpu = -1;
};

// Parses "host" or "cuda:N". Returns an error for the user, empty when well-formed.
std::string ParseMem(const std::string& opt, const std::string& v, MemSpec* out) {
  *out = MemSpec{};
  if (v == "host") return "";
  if (v.rfind("cuda:", 0) == 0 && v.size() > 5 && v.size() < 10 &&
      v.find_first_not_of("0123456789", 5) == std::string::npos) {
    out->device = true;
    out->gpu = int32_t(std::stoi(v.substr(5)));
    return "";
  }
  return opt + ": bad value '" + v + "' (host, or cuda:N)";
}
MemSpec MemOf(const std::string& v) {
  MemSpec m;
  ParseMem("", v, &m);
  return m;
}

// Why GPU memory cannot be used by this process: "" when it can, else "no GPU: <why>" or "not
// built with CUDA (...)".
std::string GpuWhy() {
  std::string why;
  if (xfer::transport::cuda::Available(&why)) return "";
#ifdef XFER_HAVE_CUDA
  return "no GPU: " + why;
#else
  (void)why;  // "this build has no CUDA ..."
  return "not built with CUDA (configure with the CUDA toolkit present and XFER_WITH_CUDA=ON)";
#endif
}

// "H2D": this side's memory, then the target's (H host, D GPU).
std::string DirectionOf(const Config& c) {
  return std::string(MemOf(c.local_mem).device ? "D" : "H") + "2" + (MemOf(c.remote_mem).device ? "D" : "H");
}

uint64_t SpanForThreads(const Config& c) {
  uint64_t need = 0;
  const uint64_t t = uint64_t(std::max(1, c.threads));
  for (uint64_t b : c.sizes) {
    uint64_t slots = c.reuse ? c.batch * t
                             : std::max<uint64_t>(c.walk_span / b, c.batch * std::max<uint64_t>(1, c.depth) * t);
    need = std::max(need, slots * b);
  }
  return need;
}

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
  if (!c.staging_bytes_arg.empty() &&
      (!ParseSize(c.staging_bytes_arg, &c.staging_bytes) || c.staging_bytes < (64 << 10) ||
       c.staging_bytes > (1ull << 30)))
    throw ArgError{"--staging-buffer-bytes: '" + c.staging_bytes_arg + "' is not a size of 64K..1G"};
  if (!c.transport.empty() &&
      std::find(kKnownTransports.begin(), kKnownTransports.end(), c.transport) == kKnownTransports.end())
    throw ArgError{"--transport: unknown transport '" + c.transport +
                   "' (known: local, cma, shm, tcp, ucx, cuda)"};
  MemSpec lm, rm;
  for (auto [opt, v, m] : {std::tuple{"--local-mem", c.local_mem, &lm},
                           std::tuple{"--remote-mem", c.remote_mem, &rm}}) {
    std::string e = ParseMem(opt, v, m);
    if (!e.empty()) throw ArgError{e};
  }
  bool table = std::find(c.tests.begin(), c.tests.end(), "table") != c.tests.end();
  // GPU memory of this process (and of a local target, on this machine): usable here? A remote
  // serve checks its own.
  const std::string gpu = !table && (lm.device || rm.device || c.transport == "cuda") ? GpuWhy() : "";
  if (!gpu.empty()) {
    if (lm.device) throw ArgError{"--local-mem " + c.local_mem + ": " + gpu};
    if (rm.device && c.peer.empty())
      throw ArgError{"--remote-mem " + c.remote_mem + " (the local target's region): " + gpu};
    if (c.transport == "cuda") throw ArgError{"--transport cuda: " + gpu};
  }
  const bool any_device = lm.device || rm.device;
  if (!table && c.transport == "cuda" && !any_device)
    throw ArgError{"--transport cuda moves only pairs with GPU memory (the copy engines): give "
                   "--local-mem and/or --remote-mem cuda:N"};
  if (!table && c.transport == "cuda" && c.buffer_pool)
    throw ArgError{"--buffer-pool stages over the peer's transport, and --transport cuda has none "
                   "(force tcp, or leave --transport out)"};
  // What the engine's paths reach (EngineOptions::transport): the target's GPU memory only
  // through cuda (one host) or tcp (the target stages it); ours through cuda, or staged over
  // any link (shm has none).
  if (!table && rm.device && !c.transport.empty() && c.transport != "cuda" && c.transport != "tcp")
    throw ArgError{"--remote-mem " + c.remote_mem + " with --transport " + c.transport +
                   ": the target's GPU memory is reached only through cuda (one host) or tcp "
                   "(the target stages it)"};
  if (!table && lm.device && c.transport == "shm")
    throw ArgError{"--local-mem " + c.local_mem + " with --transport shm: shm moves host memory "
                   "only, and has no link to stage GPU memory over"};
  if (c.mem != "alloc" && c.mem != "register")
    throw ArgError{"--mem: bad value '" + c.mem + "' (alloc or register)"};
  if (c.transport == "shm" && c.mem == "register")
    throw ArgError{"--transport shm moves only memory from Engine::AllocMem (mapped shared "
                   "memory), and --mem register registers mmap'd memory with RegisterMem: use "
                   "--mem alloc (the default), or another transport"};
  if (c.huge_pages && c.mem != "alloc")
    throw ArgError{"--huge-pages applies to --mem alloc (AllocOptions::huge_pages) only"};
  if (table && c.bidir) throw ArgError{"-b/--bidirectional does not apply to the table test"};
  if (table && c.buffer_pool)
    throw ArgError{"--buffer-pool does not apply to the table test (it measures the buffer pool "
                   "in its bufferpool cells)"};
  if (table && !c.transport.empty())
    throw ArgError{"--transport does not apply to the table test (it tries every transport)"};
  if (c.transport == "local" && !c.peer.empty())
    throw ArgError{"--transport local works only with a target in this process (no peer address)"};
  c.span = SpanForThreads(c);
  uint64_t sides = c.bidir ? 4 : 2;
  if (c.span * sides > MaxSpan() * 2)
    throw ArgError{"each side would need " + FormatSize(c.span) +
                   " of buffers (largest size x --batch x --depth x --threads), too much of this "
                   "machine's memory: lower --size, --batch, --depth, --threads or --span"};
  if (c.local_name.empty()) c.local_name = c.peer.empty() ? "127.0.0.1" : "0.0.0.0";
}

// The options that travel to the target (everything that shapes the run).
json ConfigToJson(const Config& c) {
  return {{"tests", c.tests},       {"sizes", c.sizes},         {"iters", c.iters},
          {"duration", c.duration}, {"warmup", c.warmup},       {"batch", c.batch},
          {"depth", c.depth},       {"threads", c.threads},     {"links", c.links},
          {"streams", c.streams},   {"slice_bytes", c.slice_bytes},
          {"batch_bytes", c.batch_bytes},                       {"spin_us", c.spin_us},
          {"transport", c.transport},                           {"bidir", c.bidir},
          {"reuse", c.reuse},       {"walk_span", c.walk_span}, {"span", c.span},
          {"verify", c.verify},     {"local_mem", c.local_mem}, {"remote_mem", c.remote_mem},
          {"mem", c.mem},           {"huge_pages", c.huge_pages},
          {"buffer_pool", c.buffer_pool},                       {"staging_buffers", c.staging_buffers},
          {"staging_bytes", c.staging_bytes}};
}

void ConfigFromJson(const json& j, Config* c) {
  c->tests = j.at("tests").get<std::vector<std::string>>();
  c->sizes = j.at("sizes").get<std::vector<uint64_t>>();
  c->iters = j.at("iters");
  c->duration = j.at("duration");
  c->warmup = j.at("warmup");
  c->batch = j.at("batch");
  c->depth = j.at("depth");
  c->threads = j.at("threads");
  c->links = j.at("links");
  c->streams = j.at("streams");
  c->slice_bytes = j.at("slice_bytes");
  c->batch_bytes = j.at("batch_bytes");
  c->spin_us = j.at("spin_us");
  c->transport = j.at("transport");
  c->bidir = j.at("bidir");
  c->reuse = j.at("reuse");
  c->walk_span = j.at("walk_span");
  c->span = j.at("span");
  c->verify = j.at("verify");
  c->local_mem = j.at("local_mem");
  c->remote_mem = j.at("remote_mem");
  c->mem = j.at("mem");
  c->huge_pages = j.at("huge_pages");
  c->buffer_pool = j.at("buffer_pool");
  c->staging_buffers = j.at("staging_buffers");
  c->staging_bytes = j.at("staging_bytes");
  if (c->mem != "alloc" && c->mem != "register") throw std::runtime_error("mem '" + c->mem + "'");
  MemSpec m;
  for (const std::string* v : {&c->local_mem, &c->remote_mem})
    if (!ParseMem("memory", *v, &m).empty()) throw std::runtime_error("memory '" + *v + "'");
  if (c->sizes.empty() || c->batch == 0 || c->depth == 0 || c->threads < 1 || c->threads > 256 ||
      c->span == 0 || c->span > MaxSpan())
    throw std::runtime_error("configuration out of range");
}

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
  if (c.threads > 1) o << " --threads " << c.threads;
  if (c.links) o << " --links " << c.links;
  if (c.streams) o << " --streams " << c.streams;
  if (c.slice_bytes) o << " --slice-bytes " << c.slice_arg;
  if (c.batch_bytes) o << " --batch-bytes " << c.batch_bytes_arg;
  if (c.spin_us >= 0) o << " --spin " << c.spin_us;
  if (!c.transport.empty()) o << " --transport " << c.transport;
  o << " --mem " << c.mem;
  if (c.huge_pages) o << " --huge-pages";
  if (c.local_mem != "host") o << " --local-mem " << c.local_mem;
  if (c.remote_mem != "host") o << " --remote-mem " << c.remote_mem;
  if (c.buffer_pool) o << " --buffer-pool";
  if (c.staging_buffers) o << " --staging-buffers " << c.staging_buffers;
  if (c.staging_bytes) o << " --staging-buffer-bytes " << c.staging_bytes_arg;
  if (c.bidir) o << " --bidirectional";
  if (c.reuse) o << " --reuse";
  else if (!c.span_arg.empty()) o << " --span " << c.span_arg;
  if (c.verify) o << " --verify";
  if (!c.host_id.empty()) o << " --host-id " << ShellQuote(c.host_id);
  if (c.expect_bw >= 0) o << " --expect-bw " << c.expect_bw;
  if (c.expect_p99 >= 0) o << " --expect-p99 " << c.expect_p99;
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

// Transports that use EngineOptions::links (connections / endpoints per peer).
bool TransportHasLinks(const std::string& t) { return t == "tcp" || t == "ucx"; }

// What the header says about --links for this transport: never silently ignored.
std::string LinksNote(const Config& c, const std::string& transport) {
  const int def = EngineOptions{}.links;
  if (!transport.empty() && transport != "any" && !TransportHasLinks(transport))
    return c.links == 0 ? "n/a for transport " + transport
                        : std::to_string(c.links) + " requested: n/a for transport " + transport;
  if (transport == "any")
    return (c.links ? std::to_string(c.links) : std::to_string(def) + " (default)") +
           " for tcp and ucx; n/a for the other transports";
  return c.links ? std::to_string(c.links) : std::to_string(def) + " (default)";
}

// A progress line on stderr, only when stderr is a terminal.
class Progress {
 public:
  Progress() : on_(isatty(STDERR_FILENO) == 1) {}
  void Show(const std::string& what, uint64_t bytes, double done, double total, bool iters) {
    if (!on_) return;
    std::fprintf(stderr, "\r\033[K  %s %s B: %.1f / %.1f %s", what.c_str(), FormatSize(bytes).c_str(),
                 done, total, iters ? "requests" : "s");
    shown_ = true;
  }
  void Clear() {
    if (on_ && shown_) std::fprintf(stderr, "\r\033[K");
    shown_ = false;
  }

 private:
  bool on_;
  bool shown_ = false;
};

EngineOptions MakeEngineOptions(const Config& c) {
  EngineOptions o;
  if (c.streams > 0) o.streams = c.streams;
  if (c.slice_bytes > 0) o.slice_bytes = c.slice_bytes;
  if (c.batch_bytes > 0) o.batch_bytes = c.batch_bytes;
  if (c.spin_us >= 0) o.spin = std::chrono::microseconds(c.spin_us);
  if (c.links > 0) o.links = c.links;
  o.transport = c.transport;
  o.host_id = c.host_id;
  o.staging = c.buffer_pool ? "always" : "auto";
  if (c.staging_buffers > 0) o.staging_buffers = c.staging_buffers;
  if (c.staging_bytes > 0) o.staging_buffer_bytes = c.staging_bytes;
  return o;
}

// The kernel page size (KiB) of the mapping that holds p, from /proc/self/smaps; 0 if unknown.
uint64_t PageKbAt(const void* p) {
  std::ifstream f("/proc/self/smaps");
  const uint64_t a = reinterpret_cast<uint64_t>(p);
  std::string line;
  bool in = false;
  while (std::getline(f, line)) {
    unsigned long long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      in = a >= lo && a < hi;
      continue;
    }
    unsigned long long kb = 0;
    if (in && std::sscanf(line.c_str(), "KernelPageSize: %llu kB", &kb) == 1) return kb;
  }
  return 0;
}

// One side's buffer, as --mem and the memory kind say. Host memory: Engine::AllocMem (a memfd
// that a same-host peer maps and moves with memcpy: path shm), or an anonymous mmap (Span)
// registered with RegisterMem (the peer's transport: cma on one host). GPU memory (cuda:N):
// Engine::AllocMem(kCuda) on device N, or cudaMalloc (cuda::AllocDevice) + RegisterMem(kCuda).
// Either way every byte is written with the same fill before anything is timed (AllocMem
// memory is populated already; the fill keeps the modes alike); GPU memory through cuda::Copy.
class BenchMem {
 public:
  BenchMem() = default;
  ~BenchMem() { Reset(); }
  BenchMem(const BenchMem&) = delete;
  BenchMem& operator=(const BenchMem&) = delete;

  // Empty on success, else what failed.
  std::string Allocate(Engine* engine, const Config& c, uint64_t len, const char* tag,
                       const MemSpec& mem) {
    Reset();
    len = PageRound(std::max<uint64_t>(len, 1));
    engine_ = engine;
    alloc_ = c.mem == "alloc";
    mem_ = mem;
    if (mem.device) {
      const std::string where = "cuda:" + std::to_string(mem.gpu);
      void* p = nullptr;
      if (alloc_) {
        xfer::AllocOptions ao;
        ao.device = mem.gpu;
        Status st = engine->AllocMem(len, xfer::MemType::kCuda, &p, &handle_, tag, ao);
        if (!st.ok())
          return "AllocMem(" + FormatSize(len) + ", " + where + ", " + tag + "): " + st.ToString();
      } else {
        Status st = xfer::transport::cuda::AllocDevice(len, mem.gpu, &p);
        if (!st.ok()) return "cudaMalloc(" + FormatSize(len) + ", " + where + "): " + st.ToString();
        device_ = p;
        st = engine->RegisterMem(p, len, xfer::MemType::kCuda, &handle_, tag);
        if (!st.ok()) return std::string("RegisterMem (") + tag + ", " + where + "): " + st.ToString();
      }
      p_ = static_cast<uint8_t*>(p);
      len_ = len;
      return Fill(0x5a);
    }
    if (alloc_) {
      void* p = nullptr;
      xfer::AllocOptions ao;
      ao.huge_pages = c.huge_pages;
      Status st = engine->AllocMem(len, xfer::MemType::kHost, &p, &handle_, tag, ao);
      if (!st.ok()) return "AllocMem(" + FormatSize(len) + ", " + tag + "): " + st.ToString();
      p_ = static_cast<uint8_t*>(p);
      len_ = len;
      std::memset(p_, 0x5a, len_);  // the same fill as Span
      if (c.huge_pages) page_kb_ = PageKbAt(p_);
      return "";
    }
    if (!span_.Allocate(len)) return "cannot allocate " + FormatSize(len) + " (" + tag + ")";
    p_ = span_.data();
    len_ = span_.size();
    Status st = engine->RegisterMem(p_, len_, xfer::MemType::kHost, &handle_, tag);
    if (!st.ok()) return std::string("RegisterMem (") + tag + "): " + st.ToString();
    return "";
  }
  // Before the engine finalizes: FreeMem for AllocMem memory (registered memory stays until
  // Finalize, as it always did). Empty, or what FreeMem said.
  std::string Free() {
    std::string err;
    if (alloc_ && handle_ && engine_) {
      Status st = engine_->FreeMem(handle_);
      if (!st.ok()) err = "FreeMem: " + st.ToString();
      handle_ = 0;
      p_ = nullptr;
      len_ = 0;
    }
    return err;
  }
  // After the engine finalized (or never was): forgets everything, unmaps the Span, frees
  // cudaMalloc'd memory.
  void Reset() {
    span_.Release();
    if (device_) xfer::transport::cuda::FreeDevice(device_);
    device_ = nullptr;
    p_ = nullptr;
    len_ = 0;
    handle_ = 0;
    engine_ = nullptr;
    page_kb_ = 0;
    mem_ = MemSpec{};
  }

  // Copies between host memory and [addr, addr+len) of this buffer, whatever memory it is.
  // Empty, or what failed.
  std::string Put(uint64_t addr, const void* src, uint64_t len) const {
    if (!mem_.device) {
      std::memcpy(reinterpret_cast<void*>(addr), src, len);
      return "";
    }
    return DeviceCopy(Op::kWrite, addr, const_cast<void*>(src), len);
  }
  std::string Get(void* dst, uint64_t addr, uint64_t len) const {
    if (!mem_.device) {
      std::memcpy(dst, reinterpret_cast<const void*>(addr), len);
      return "";
    }
    return DeviceCopy(Op::kRead, addr, dst, len);
  }
  std::string Set(uint64_t addr, uint8_t byte, uint64_t len) const {
    if (!mem_.device) {
      std::memset(reinterpret_cast<void*>(addr), byte, len);
      return "";
    }
    std::vector<uint8_t> h(std::min<uint64_t>(len, 8ull << 20), byte);
    for (uint64_t off = 0; off < len; off += h.size()) {
      std::string e = Put(addr + off, h.data(), std::min<uint64_t>(h.size(), len - off));
      if (!e.empty()) return e;
    }
    return "";
  }

  uint8_t* data() const { return p_; }
  uint64_t size() const { return len_; }
  uint64_t addr() const { return reinterpret_cast<uint64_t>(p_); }
  uint64_t page_kb() const { return page_kb_; }  // with --huge-pages: what the kernel gave
  bool device() const { return mem_.device; }

 private:
  std::string Fill(uint8_t byte) {
    std::string e = Set(addr(), byte, len_);
    return e.empty() ? e : "filling GPU memory: " + e;
  }
  static std::string DeviceCopy(Op op, uint64_t dev, void* host, uint64_t len) {
    const xfer::transport::Slice s{reinterpret_cast<uint64_t>(host), dev, len};
    Status st = xfer::transport::cuda::Copy(op, {&s, 1},
                                            std::chrono::steady_clock::now() + std::chrono::seconds(60));
    return st.ok() ? "" : "cuda copy: " + st.ToString();
  }

  Engine* engine_ = nullptr;
  bool alloc_ = false;
  MemSpec mem_;
  Span span_;
  void* device_ = nullptr;  // cudaMalloc'd (--mem register with GPU memory)
  uint8_t* p_ = nullptr;
  uint64_t len_ = 0;
  xfer::MemHandle handle_ = 0;
  uint64_t page_kb_ = 0;
};

// ---------------------------------------------------------------------------------------------
// The control channel: one JSON object per line.

class Ctl {
 public:
  Ctl() = default;
  explicit Ctl(int fd) : fd_(fd) {}
  ~Ctl() { Close(); }
  Ctl(const Ctl&) = delete;
  Ctl& operator=(const Ctl&) = delete;
  void Reset(int fd) {
    Close();
    fd_ = fd;
    buf_.clear();
  }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  bool open() const { return fd_ >= 0; }
  int fd() const { return fd_; }

  bool Send(const json& j) {
    std::string s = j.dump() + "\n";
    size_t off = 0;
    while (off < s.size()) {
      ssize_t n = send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      off += size_t(n);
    }
    return true;
  }
  // Waits up to timeout_ms (-1: forever) for one message. Empty error = ok.
  std::string Recv(json* out, int timeout_ms) {
    uint64_t deadline = timeout_ms < 0 ? 0 : NowNs() + uint64_t(timeout_ms) * 1000000ull;
    for (;;) {
      size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        try {
          *out = json::parse(line);
        } catch (const std::exception& e) {
          return std::string("bad control message: ") + e.what();
        }
        if (!out->is_object() || !out->contains("type")) return "bad control message: no type";
        return "";
      }
      if (buf_.size() > (1u << 20)) return "control message too long";
      int wait = -1;
      if (timeout_ms >= 0) {
        int64_t left = (int64_t(deadline) - int64_t(NowNs())) / 1000000;
        if (left <= 0) return "timed out waiting for the peer's control message";
        wait = int(left);
      }
      pollfd p{fd_, POLLIN, 0};
      int r = poll(&p, 1, wait);
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) continue;
      char tmp[4096];
      ssize_t n = read(fd_, tmp, sizeof tmp);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return "the control connection closed";
      buf_.append(tmp, size_t(n));
    }
  }
  // Send, then wait for a reply; a reply of type "error" becomes the error.
  std::string Call(const json& req, json* reply, int timeout_ms) {
    if (!Send(req)) return "the control connection closed";
    std::string e = Recv(reply, timeout_ms);
    if (!e.empty()) return e;
    if ((*reply)["type"] == "error") return (*reply).value("msg", std::string("error"));
    return "";
  }

 private:
  int fd_ = -1;
  std::string buf_;
};

// "host:port" -> address; brackets for IPv6.
bool SplitHostPort(const std::string& s, std::string* host, std::string* port) {
  if (!s.empty() && s[0] == '[') {
    size_t e = s.find(']');
    if (e == std::string::npos || e + 1 >= s.size() || s[e + 1] != ':') return false;
    *host = s.substr(1, e - 1);
    *port = s.substr(e + 2);
  } else {
    size_t c = s.rfind(':');
    if (c == std::string::npos || c == 0) return false;
    *host = s.substr(0, c);
    *port = s.substr(c + 1);
  }
  return !port->empty() && port->find_first_not_of("0123456789") == std::string::npos &&
         std::stoul(*port) <= 65535;
}

// The numeric address of a connected socket's local or remote end, formatted for an engine name.
std::string SockHost(int fd, bool peer) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if ((peer ? getpeername(fd, (sockaddr*)&ss, &len) : getsockname(fd, (sockaddr*)&ss, &len)) != 0)
    return "";
  char host[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    inet_ntop(AF_INET, &((sockaddr_in*)&ss)->sin_addr, host, sizeof host);
    return host;
  }
  if (ss.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &((sockaddr_in6*)&ss)->sin6_addr, host, sizeof host);
    return std::string("[") + host + "]";
  }
  return "";
}

// Connects to host:port, retrying until the deadline (start order must not matter).
int ConnectRetry(const std::string& hostport, double timeout_s, std::string* err) {
  std::string host, port;
  if (!SplitHostPort(hostport, &host, &port)) {
    *err = "bad peer address '" + hostport + "' (host:port, or [v6]:port)";
    return -1;
  }
  uint64_t deadline = NowNs() + uint64_t(timeout_s * 1e9);
  std::string last;
  for (;;) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
    if (rc != 0) {
      last = std::string("getaddrinfo: ") + gai_strerror(rc);
    } else {
      for (addrinfo* a = res; a; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          freeaddrinfo(res);
          int one = 1;
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          return fd;
        }
        last = std::strerror(errno);
        close(fd);
      }
      freeaddrinfo(res);
    }
    if (NowNs() >= deadline) {
      *err = "cannot reach xfer-bench serve at " + hostport + " within " +
             std::to_string(int(timeout_s)) + " s (--connect-timeout): " + last;
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

// ---------------------------------------------------------------------------------------------
// One measured row

struct Row {
  std::string test;
  std::string dir;        // "" (one direction), "->" (this side to the peer), "<-", "sum"
  std::string transport;  // as GetPeerInfo reported it
  std::string direction = "H2H";
  std::string path = "direct";
  uint64_t bytes = 0;
  uint64_t requests = 0;
  uint64_t descs = 0;
  double seconds = 0;
  double bw_avg = 0;   // GB/s
  double bw_peak = 0;  // GB/s
  double msg_rate = 0; // Mops (descriptors)
  LatStats lat;        // per request, us
  double cpu = -1;     // % of one CPU, this process
  double srv_cpu = -1; // % of one CPU, the target process, where known
  std::string verify;  // "", "ok", "FAILED: ..."
  // Bytes the engine moved to or from the peer in the timed window, by path (GetPeerInfo's
  // shm_bytes, transport_bytes, cuda_bytes and staged_bytes); -1 when unknown.
  int64_t shm_bytes = -1;
  int64_t transport_bytes = -1;
  int64_t cuda_bytes = -1;
  int64_t staged_bytes = -1;
};

json OptNum(double v) { return v >= 0 ? json(v) : json(nullptr); }

json RowToJson(const Row& r) {
  return {{"test", r.test},
          {"op", TestOp(r.test) == Op::kWrite ? "WRITE" : "READ"},
          {"dir", r.dir.empty() ? json(nullptr) : json(r.dir)},
          {"transport", r.transport},
          {"direction", r.direction},
          {"path", r.path},
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
          {"cpu_pct", OptNum(r.cpu)},
          {"server_cpu_pct", OptNum(r.srv_cpu)},
          {"verify", r.verify.empty() ? json(nullptr) : json(r.verify)},
          {"shm_bytes", r.shm_bytes >= 0 ? json(r.shm_bytes) : json(nullptr)},
          {"transport_bytes", r.transport_bytes >= 0 ? json(r.transport_bytes) : json(nullptr)},
          {"cuda_bytes", r.cuda_bytes >= 0 ? json(r.cuda_bytes) : json(nullptr)},
          {"staged_bytes", r.staged_bytes >= 0 ? json(r.staged_bytes) : json(nullptr)}};
}

Row RowFromJson(const json& j) {
  Row r;
  r.test = j.at("test");
  r.transport = j.value("transport", "");
  r.bytes = j.at("bytes");
  r.requests = j.at("iters");
  r.descs = j.at("descriptors");
  r.seconds = j.at("seconds");
  r.bw_avg = j.at("bw_avg_GBps");
  r.bw_peak = j.at("bw_peak_GBps");
  r.msg_rate = j.at("msg_rate_Mops");
  const json& l = j.at("lat_us");
  r.lat.n = l.at("samples");
  r.lat.min = l.at("min");
  r.lat.max = l.at("max");
  r.lat.median = l.at("typical");
  r.lat.avg = l.at("avg");
  r.lat.stdev = l.at("stdev");
  r.lat.p50 = l.at("p50");
  r.lat.p99 = l.at("p99");
  r.lat.p999 = l.at("p99_9");
  r.cpu = j.at("cpu_pct").is_null() ? -1 : j.at("cpu_pct").get<double>();
  r.verify = j.at("verify").is_null() ? "" : j.at("verify").get<std::string>();
  r.shm_bytes = j.at("shm_bytes").is_null() ? -1 : j.at("shm_bytes").get<int64_t>();
  r.transport_bytes = j.at("transport_bytes").is_null() ? -1 : j.at("transport_bytes").get<int64_t>();
  r.cuda_bytes = j.at("cuda_bytes").is_null() ? -1 : j.at("cuda_bytes").get<int64_t>();
  r.staged_bytes = j.at("staged_bytes").is_null() ? -1 : j.at("staged_bytes").get<int64_t>();
  return r;
}

// ---------------------------------------------------------------------------------------------
// The initiator: runs one test at one size toward a peer, from --threads threads, each with
// --depth requests in flight. Used by the client, and by the target for -b/--bidirectional.

struct Hooks {
  // Called on the calling thread after every worker finished its warm-up, just before the timed
  // window opens, and right after it closes. A non-empty return aborts the size.
  std::function<std::string()> before_start;
  std::function<std::string()> after_end;
};

class Initiator {
 public:
  Initiator(const Config& c, Engine* engine, std::string peer, const BenchMem* local,
            uint64_t remote_addr, uint64_t remote_len)
      : c_(c), engine_(engine), peer_(std::move(peer)), local_(local),
        remote_addr_(remote_addr), remote_len_(remote_len) {}

  // Empty when the remote region can hold what the run needs, else why not.
  std::string CheckRemote() const {
    uint64_t need = 0;
    for (uint64_t b : c_.sizes) need = std::max(need, b * c_.batch * uint64_t(c_.threads));
    if (remote_len_ < need)
      return "the peer's region (" + FormatSize(remote_len_) + ") is smaller than one request per "
             "thread (" + FormatSize(need) + "): give the server a larger span";
    return "";
  }

  bool RunSize(const std::string& test, uint64_t block, const Hooks& hooks, Progress* progress,
               Row* row, std::string* err);
  std::string Verify(uint64_t block);

  static std::chrono::milliseconds TimeoutFor(uint64_t bytes) {
    return std::chrono::milliseconds(10000 + bytes / 100000);  // 10 s + 100 MB/s worth
  }

 private:
  struct Part {  // one thread's share of both spans
    Layout lay;
    uint64_t lbase = 0, rbase = 0;
  };
  Part PartFor(int t, uint64_t block) const {
    Part p;
    const uint64_t n = uint64_t(c_.threads);
    const uint64_t lpart = local_->size() / n, rpart = remote_len_ / n;
    p.lay.block = block;
    p.lay.batch = c_.batch;
    p.lay.reuse = c_.reuse;
    p.lay.local_slots = lpart / block;
    p.lay.remote_slots = std::max<uint64_t>(1, rpart / block);
    p.lbase = uint64_t(t) * lpart;
    p.rbase = uint64_t(t) * rpart;
    return p;
  }
  void BuildDescs(const Part& p, uint64_t req, std::vector<TransferDesc>* d) const {
    d->resize(p.lay.batch);
    for (uint64_t j = 0; j < p.lay.batch; ++j) {
      (*d)[j].local_addr = local_->addr() + p.lbase + p.lay.LocalOff(req, j);
      (*d)[j].remote_addr = remote_addr_ + p.rbase + p.lay.RemoteOff(req, j);
      (*d)[j].len = p.lay.block;
    }
  }

  const Config& c_;
  Engine* engine_;
  std::string peer_;
  const BenchMem* local_;
  uint64_t remote_addr_, remote_len_;
};

bool Initiator::RunSize(const std::string& test, uint64_t block, const Hooks& hooks,
                        Progress* progress, Row* row, std::string* err) {
  const Op op = TestOp(test);
  const uint64_t depth = IsLat(test) ? 1 : c_.depth;
  const int nthreads = c_.threads;
  const uint64_t req_bytes = block * c_.batch;
  const auto timeout = TimeoutFor(req_bytes);
  const uint64_t dur_ns = uint64_t(c_.duration * 1e9);

  std::mutex mu;
  std::condition_variable cv;
  bool go = false;
  std::atomic<bool> stop{false};
  std::atomic<int> ready{0}, finished{0};
  std::atomic<uint64_t> bytes_done{0}, reqs_done{0};
  std::string first_err;
  uint64_t start = 0;
  std::vector<std::vector<uint64_t>> samples(static_cast<size_t>(nthreads));
  std::vector<uint64_t> ends(size_t(nthreads), 0), dones(size_t(nthreads), 0);

  auto set_err = [&](const std::string& e) {
    std::lock_guard<std::mutex> g(mu);
    if (first_err.empty()) first_err = e;
    stop = true;
    go = true;
    cv.notify_all();
  };
  auto worker = [&](int t) {
    Part part = PartFor(t, block);
    std::vector<TransferDesc> descs;
    uint64_t req = 0;
    const uint64_t quota = c_.iters ? c_.iters / uint64_t(nthreads) + (uint64_t(t) < c_.iters % uint64_t(nthreads) ? 1 : 0) : 0;
    auto fail = [&](const Status& st) {
      set_err(test + " " + std::to_string(block) + " B: " + st.ToString());
    };
    // Warm-up.
    {
      uint64_t n = c_.warmup >= 0 ? uint64_t(c_.warmup) : std::max<uint64_t>(8, part.lay.RequestsPerPass());
      uint64_t t0 = NowNs();
      for (uint64_t i = 0; i < n && !stop; ++i) {
        if (c_.warmup < 0 && NowNs() - t0 > 1000000000ull) break;
        BuildDescs(part, req++, &descs);
        Status st = engine_->TransferSync(peer_, op, descs, timeout);
        if (!st.ok()) {
          fail(st);
          break;
        }
      }
    }
    {
      std::unique_lock<std::mutex> l(mu);
      ++ready;
      cv.notify_all();
      cv.wait(l, [&] { return go; });
    }
    auto& smp = samples[size_t(t)];
    smp.reserve(c_.iters ? std::min<uint64_t>(quota, 20000000) : 4096);
    uint64_t done = 0, submitted = 0, end = start;
    auto more = [&](uint64_t now) {
      if (stop) return false;
      return c_.iters ? submitted < quota : now - start < dur_ns;
    };
    auto complete = [&](uint64_t t0, uint64_t now) {
      if (smp.size() < 20000000) smp.push_back(now - t0);
      ++done;
      end = now;
      bytes_done.fetch_add(req_bytes, std::memory_order_relaxed);
      reqs_done.fetch_add(1, std::memory_order_relaxed);
    };
    if (depth == 1) {
      // Latency tests time the call alone. Bandwidth tests read the clock once per request (a
      // read costs ~30 ns here, a 16 KiB copy ~250): a request's time then runs from the end
      // of the one before, and includes this loop's own work.
      const bool time_call = IsLat(test);
      uint64_t now = NowNs();
      while (more(now)) {
        BuildDescs(part, req++, &descs);
        const uint64_t t0 = time_call ? NowNs() : now;
        Status st = engine_->TransferSync(peer_, op, descs, timeout);
        now = NowNs();
        ++submitted;
        if (!st.ok()) {
          fail(st);
          break;
        }
        complete(t0, now);
      }
    } else {
      struct Slot {
        xfer::RequestHandle h = 0;
        uint64_t t0 = 0;
      };
      std::vector<Slot> ring(depth);
      size_t head = 0, inflight = 0;
      auto submit = [&](Slot& s) {
        BuildDescs(part, req++, &descs);
        s.t0 = NowNs();
        ++submitted;
        return engine_->TransferAsync(peer_, op, descs, timeout, &s.h);
      };
      bool failed = false;
      for (size_t i = 0; i < depth && more(NowNs()); ++i) {
        Status st = submit(ring[i]);
        if (!st.ok()) {
          fail(st);
          failed = true;
          break;
        }
        ++inflight;
      }
      while (inflight > 0) {
        Slot& s = ring[head];
        Status st = engine_->Wait(s.h, timeout);
        uint64_t now = NowNs();
        --inflight;
        head = (head + 1) % depth;
        if (!st.ok()) {
          if (!failed) fail(st);
          failed = true;
          continue;  // wait for the others to end
        }
        complete(s.t0, now);
        if (!failed && more(now)) {
          Slot& n = ring[(head + inflight) % depth];
          st = submit(n);
          if (!st.ok()) {
            fail(st);
            failed = true;
          } else {
            ++inflight;
          }
        }
      }
    }
    ends[size_t(t)] = end;
    dones[size_t(t)] = done;
    finished.fetch_add(1);
  };

  std::vector<std::thread> th;
  for (int t = 0; t < nthreads; ++t) th.emplace_back(worker, t);
  {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return ready.load() == nthreads || stop.load(); });
  }
  std::string hook_err;
  if (!stop && hooks.before_start) hook_err = hooks.before_start();
  if (!hook_err.empty()) set_err(hook_err);
  // Bytes by path before and after the timed window (nothing is in flight at either point).
  xfer::PeerInfo pi0, pi1;
  const bool have_pi0 = engine_->GetPeerInfo(peer_, &pi0).ok();
  const uint64_t cpu0 = ProcessCpuNs();
  {
    std::lock_guard<std::mutex> g(mu);
    start = NowNs();
    go = true;
    cv.notify_all();
  }
  // Monitor: peak bandwidth over 10 ms windows, the progress line every 200 ms.
  uint64_t win_t = start, win_b = 0, last_show = start;
  double peak = 0;
  while (finished.load() < nthreads) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    uint64_t now = NowNs(), b = bytes_done.load(std::memory_order_relaxed);
    if (now - win_t >= 10000000ull && reqs_done.load() > 0) {
      peak = std::max(peak, double(b - win_b) / double(now - win_t));
      win_t = now;
      win_b = b;
    }
    if (progress && now - last_show >= 200000000ull) {
      last_show = now;
      if (c_.iters)
        progress->Show(test, block, double(reqs_done.load()), double(c_.iters), true);
      else
        progress->Show(test, block, double(now - start) / 1e9, c_.duration, false);
    }
  }
  for (auto& x : th) x.join();
  if (progress) progress->Clear();
  const uint64_t cpu1 = ProcessCpuNs();
  const bool have_pi = have_pi0 && engine_->GetPeerInfo(peer_, &pi1).ok();
  if (first_err.empty() && hooks.after_end) {
    std::string e = hooks.after_end();
    if (!e.empty()) first_err = e;
  }
  if (!first_err.empty()) {
    *err = first_err;
    return false;
  }
  uint64_t end = start, done = 0;
  std::vector<uint64_t> all;
  for (int t = 0; t < nthreads; ++t) {
    end = std::max(end, ends[size_t(t)]);
    done += dones[size_t(t)];
    all.insert(all.end(), samples[size_t(t)].begin(), samples[size_t(t)].end());
  }
  const double secs = double(end - start) / 1e9;
  row->test = test;
  row->bytes = block;
  row->requests = done;
  row->descs = done * c_.batch;
  row->seconds = secs;
  row->bw_avg = secs > 0 ? double(done * req_bytes) / secs / 1e9 : 0;
  // A window shorter than the run can exceed the average; a run shorter than a window cannot.
  row->bw_peak = std::max(peak, row->bw_avg);
  row->msg_rate = secs > 0 ? double(row->descs) / secs / 1e6 : 0;
  row->lat = ComputeLatStats(all);
  row->cpu = secs > 0 ? double(cpu1 - cpu0) / 1e9 / secs * 100 : -1;
  if (have_pi) {
    row->shm_bytes = int64_t(pi1.shm_bytes - pi0.shm_bytes);
    row->transport_bytes = int64_t(pi1.transport_bytes - pi0.transport_bytes);
    row->cuda_bytes = int64_t(pi1.cuda_bytes - pi0.cuda_bytes);
    row->staged_bytes = int64_t(pi1.staged_bytes - pi0.staged_bytes);
  }
  if (c_.verify) row->verify = Verify(block);
  return true;
}

// Round trip on thread 0's first and last request's blocks: fill with a pattern, WRITE, clear,
// READ back, compare. Uses the benchmark's own descriptors, so a misplaced block shows. GPU
// buffers are filled, cleared and read back through cuda::Copy (BenchMem::Put/Set/Get).
std::string Initiator::Verify(uint64_t block) {
  Part part = PartFor(0, block);
  std::vector<TransferDesc> d;
  uint64_t last = part.lay.reuse ? 0 : part.lay.RequestsPerPass() - 1;
  const auto timeout = TimeoutFor(block * c_.batch);
  std::vector<uint8_t> want(block), got(block);
  for (uint64_t req : {uint64_t(0), last}) {
    BuildDescs(part, req, &d);
    for (uint64_t j = 0; j < d.size(); ++j) {
      FillPattern(want.data(), d[j].len, req * c_.batch + j + block);
      std::string e = local_->Put(d[j].local_addr, want.data(), d[j].len);
      if (!e.empty()) return "FAILED: filling the local buffer: " + e;
    }
    Status st = engine_->TransferSync(peer_, Op::kWrite, d, timeout);
    if (!st.ok()) return "WRITE: " + st.ToString();
    for (auto& x : d) {
      std::string e = local_->Set(x.local_addr, 0, x.len);
      if (!e.empty()) return "FAILED: clearing the local buffer: " + e;
    }
    st = engine_->TransferSync(peer_, Op::kRead, d, timeout);
    if (!st.ok()) return "READ: " + st.ToString();
    for (uint64_t j = 0; j < d.size(); ++j) {
      FillPattern(want.data(), block, req * c_.batch + j + block);
      std::string e = local_->Get(got.data(), d[j].local_addr, block);
      if (!e.empty()) return "FAILED: reading the local buffer: " + e;
      if (std::memcmp(want.data(), got.data(), block) != 0)
        return "FAILED: request " + std::to_string(req) + " descriptor " + std::to_string(j) +
               " read back different data";
    }
  }
  return "ok";
}

// Finds the peer's region tagged `tag` of the memory kind `mem` (host, or GPU memory), the
// largest such.
Status FindRegion(Engine& e, const std::string& peer, const char* tag, const MemSpec& mem,
                  uint64_t* addr, uint64_t* len, bool* shared = nullptr) {
  std::vector<xfer::RegionInfo> regions;
  Status st = e.GetRemoteRegions(peer, &regions);
  if (!st.ok()) return st;
  const xfer::MemType want = mem.device ? xfer::MemType::kCuda : xfer::MemType::kHost;
  const xfer::RegionInfo* best = nullptr;
  for (const auto& r : regions)
    if (r.type == want && r.tag == tag && (!best || r.len > best->len)) best = &r;
  if (!best)
    return {xfer::StatusCode::kInvalidArgument,
            "the peer " + peer + " advertises no " + (mem.device ? "GPU" : "host") +
                " region tagged '" + tag + "' (is it xfer-bench?)"};
  *addr = best->addr;
  *len = best->len;
  if (shared) *shared = best->shared;
  return Status::Ok();
}

// Connect, retrying until the deadline.
Status ConnectEngine(Engine& e, const std::string& peer, double timeout_s) {
  uint64_t deadline = NowNs() + uint64_t(timeout_s * 1e9);
  for (;;) {
    Status st = e.Connect(peer, std::chrono::milliseconds(2000));
    if (st.ok() || st.code() == xfer::StatusCode::kAlreadyConnected) return Status::Ok();
    if (st.code() == xfer::StatusCode::kInvalidArgument || st.code() == xfer::StatusCode::kUnsupported ||
        NowNs() >= deadline)
      return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

// ---------------------------------------------------------------------------------------------
// The target side: one client session on a control channel

// Serves one client on `ctl`: the client's configuration, an engine on engine_host (port 0), the
// region; per size, CPU marks and (bidirectional) the same test toward the client. Returns an
// error message, empty when the session ended normally.
std::string ServeSession(Ctl& ctl, const std::string& engine_host, const std::string& host_id,
                         bool in_process, bool verbose) {
  json hello;
  std::string e = ctl.Recv(&hello, 60000);
  if (!e.empty()) return e;
  auto refuse = [&](const std::string& msg) {
    ctl.Send({{"type", "error"}, {"msg", msg}});
    return msg;
  };
  if (hello["type"] != "hello" || hello.value("schema", "") != kCtlSchema)
    return refuse("not an xfer-bench client (expected a hello of schema " + std::string(kCtlSchema) + ")");
  if (hello.value("version", 0) != kCtlVersion)
    return refuse("control protocol version " + std::to_string(hello.value("version", 0)) +
                  " is not this server's " + std::to_string(kCtlVersion) +
                  ": run the same xfer-bench version on both sides");
  Config c;
  try {
    ConfigFromJson(hello.at("config"), &c);
  } catch (const std::exception& ex) {
    return refuse(std::string("bad configuration: ") + ex.what());
  }
  c.host_id = host_id;
  // This side's region is the client's remote memory; its own buffers (bidirectional) the
  // client's local memory: the same test both ways.
  const MemSpec region_mem = MemOf(c.remote_mem), local_mem = MemOf(c.local_mem);
  if (region_mem.device || (c.bidir && local_mem.device)) {
    std::string gpu = GpuWhy();
    if (!gpu.empty())
      return refuse("GPU memory (" + (region_mem.device ? c.remote_mem : c.local_mem) +
                    ") at the target (" + MachineLine().substr(0, MachineLine().find(',')) +
                    "): " + gpu);
  }

  // Declared before the engine, so that they outlive it (registered memory is unmapped only
  // after the engine finalized).
  BenchMem region, local;
  Engine engine;
  Status st = engine.Initialize(engine_host + ":0", MakeEngineOptions(c));
  if (!st.ok()) return refuse("Initialize(" + engine_host + ":0): " + st.ToString());
  e = region.Allocate(&engine, c, c.span, kRegionTag, region_mem);
  if (e.empty() && c.bidir) e = local.Allocate(&engine, c, c.span, kLocalTag, local_mem);
  if (!e.empty()) return refuse(e);
  if (!ctl.Send({{"type", "ready"},
                 {"engine", engine.LocalName()},
                 {"pid", int(getpid())},
                 {"in_process", in_process},
                 {"region_len", region.size()},
                 {"region_mem", c.remote_mem},
                 {"page_kb", region.page_kb()},
                 {"host", MachineLine()}}))
    return "the control connection closed";
  if (verbose) {
    std::printf("xfer-bench serve: client %s: engine %s, %s %s%s%s\n",
                hello.value("client", "?").c_str(), engine.LocalName().c_str(),
                FormatSize(region.size()).c_str(),
                c.mem == "alloc" ? "allocated (AllocMem)" : "registered",
                region_mem.device ? " on " : "", region_mem.device ? c.remote_mem.c_str() : "");
    std::fflush(stdout);  // out before the client's run ends (a log file is not line-buffered)
  }

  // Bidirectional: this side's initiator toward the client, on its own thread per size.
  std::string client;
  std::unique_ptr<Initiator> init;
  std::thread runner;
  std::mutex mu;
  std::condition_variable cv;
  bool prepared = false, go = false, ran = false;
  Row row;
  std::string run_err;
  auto release = [&] {
    {
      std::lock_guard<std::mutex> g(mu);
      go = true;
    }
    cv.notify_all();
    if (runner.joinable()) runner.join();
  };
  auto cpu_s = [] { return double(ProcessCpuNs()) / 1e9; };

  std::string result;
  bool bye = false;
  for (;;) {
    json m;
    e = ctl.Recv(&m, -1);
    if (!e.empty()) {
      if (e != "the control connection closed") result = e;
      break;
    }
    const std::string type = m["type"];
    if (type == "bye") {
      bye = true;
      break;
    }
    if (type == "bidir") {
      client = m.value("client_engine", "");
      uint64_t raddr = 0, rlen = 0;
      st = ConnectEngine(engine, client, 10);
      if (st.ok()) st = FindRegion(engine, client, kRegionTag, region_mem, &raddr, &rlen);
      xfer::PeerInfo pi;
      if (st.ok()) st = engine.GetPeerInfo(client, &pi);
      if (!st.ok()) {
        result = refuse("the reverse direction: " + client + ": " + st.ToString());
        break;
      }
      init = std::make_unique<Initiator>(c, &engine, client, &local, raddr, rlen);
      std::string why = init->CheckRemote();
      if (!why.empty()) {
        result = refuse(why);
        break;
      }
      ctl.Send({{"type", "ok"}, {"transport", pi.transport}, {"shm", pi.shm}});
    } else if (type == "prepare") {
      if (!init) {
        ctl.Send({{"type", "prepared"}});
        continue;
      }
      release();
      prepared = go = ran = false;
      run_err.clear();
      std::string test = m.value("test", "write_bw");
      uint64_t bytes = m.value("bytes", uint64_t(0));
      if (bytes == 0 || (test != "write_bw" && test != "read_bw" && test != "write_lat" && test != "read_lat")) {
        result = refuse("bad prepare message");
        break;
      }
      runner = std::thread([&, test, bytes] {
        Hooks hk;
        hk.before_start = [&]() -> std::string {
          std::unique_lock<std::mutex> l(mu);
          prepared = true;
          cv.notify_all();
          cv.wait(l, [&] { return go; });
          return "";
        };
        Row r;
        std::string err;
        bool ok = init->RunSize(test, bytes, hk, nullptr, &r, &err);
        std::lock_guard<std::mutex> g(mu);
        if (ok) row = r;
        else run_err = err;
        ran = true;
        prepared = true;  // a failure in the warm-up also ends the wait below
        cv.notify_all();
      });
      {
        std::unique_lock<std::mutex> l(mu);
        cv.wait(l, [&] { return prepared; });
      }
      if (ran && !run_err.empty()) {
        ctl.Send({{"type", "error"}, {"msg", "reverse direction: " + run_err}});
        continue;
      }
      ctl.Send({{"type", "prepared"}});
    } else if (type == "go") {
      double now = cpu_s();
      {
        std::lock_guard<std::mutex> g(mu);
        go = true;
      }
      cv.notify_all();
      ctl.Send({{"type", "go"}, {"cpu_s", now}});
    } else if (type == "end") {
      double now = cpu_s();
      json reply = {{"type", "end"}, {"cpu_s", now}};
      if (init) {
        release();
        if (!run_err.empty()) reply = {{"type", "error"}, {"msg", "reverse direction: " + run_err}};
        else reply["row"] = RowToJson(row);
      }
      ctl.Send(reply);
    } else {
      result = refuse("unknown control message '" + type + "'");
      break;
    }
  }
  release();
  // Free the memory while the client still listens (FreeMem waits for its peers to let go),
  // then tell it, so that it finalizes only after.
  std::string free_err = region.Free();
  std::string e2 = local.Free();
  if (free_err.empty()) free_err = e2;
  if (bye) ctl.Send({{"type", "bye"}, {"free_error", free_err}});
  engine.Finalize();
  if (result.empty() && !free_err.empty()) result = free_err;
  return result;
}

int ListenSocket(const std::string& hostport, std::string* err) {
  std::string host, port;
  if (!SplitHostPort(hostport, &host, &port)) {
    *err = "--listen: bad address '" + hostport + "' (host:port, or [v6]:port)";
    return -1;
  }
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) {
    *err = "--listen " + hostport + ": " + gai_strerror(rc);
    return -1;
  }
  int fd = socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, res->ai_protocol);
  int one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 8) != 0) {
    *err = "--listen " + hostport + ": " + std::strerror(errno);
    freeaddrinfo(res);
    if (fd >= 0) close(fd);
    return -1;
  }
  freeaddrinfo(res);
  return fd;
}

int RunServe(const Config& c) {
  if (c.ctl_fd >= 0) {  // a local child: one session on the inherited socket
    Ctl ctl(c.ctl_fd);
    // Errors went to the client over the channel; it reports them.
    std::string e = ServeSession(ctl, "127.0.0.1", c.host_id, false, false);
    return e.empty() ? 0 : 1;
  }
  std::string err;
  int lfd = ListenSocket(c.listen, &err);
  if (lfd < 0) {
    std::fprintf(stderr, "xfer-bench serve: %s\n", err.c_str());
    return 1;
  }
  sockaddr_storage ss{};
  socklen_t sl = sizeof ss;
  getsockname(lfd, (sockaddr*)&ss, &sl);
  int port = ss.ss_family == AF_INET6 ? ntohs(((sockaddr_in6*)&ss)->sin6_port)
                                      : ntohs(((sockaddr_in*)&ss)->sin_port);
  std::printf("xfer-bench serve: waiting for clients on %s (port %d); each client's options "
              "apply to its run; Ctrl-C to stop\n",
              c.listen.c_str(), port);
  std::fflush(stdout);
  for (;;) {
    int fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      std::fprintf(stderr, "xfer-bench serve: accept: %s\n", std::strerror(errno));
      close(lfd);
      return 1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    // The engine listens on the address the client reached us at, so the name it advertises
    // is one the client can connect to.
    std::string host = SockHost(fd, false);
    Ctl ctl(fd);
    std::string e = ServeSession(ctl, host.empty() ? "0.0.0.0" : host, c.host_id, false, true);
    if (!e.empty()) std::fprintf(stderr, "xfer-bench serve: session ended: %s\n", e.c_str());
    else if (!c.once) std::printf("xfer-bench serve: session done; waiting for the next client\n");
    std::fflush(stdout);
    if (c.once) break;
  }
  close(lfd);
  return 0;
}

// ---------------------------------------------------------------------------------------------
// The client side

// A target this process started: a child process running `xfer-bench serve --ctl-fd`, or (for
// --transport local) a session on a thread of this process. Either way, one end of a socketpair.
class LocalTarget {
 public:
  ~LocalTarget() { Stop(); }

  // Returns an error message, empty on success; *fd is this side's end of the control channel.
  std::string Start(bool in_process, const std::string& host_id, int* fd) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
      return std::string("socketpair: ") + std::strerror(errno);
    if (in_process) {
      int theirs = sv[1];
      thread_ = std::thread([theirs, host_id] {
        Ctl ctl(theirs);
        ServeSession(ctl, "127.0.0.1", host_id, true, false);
      });
      *fd = sv[0];
      return "";
    }
    std::string exe = SelfExe();
    if (exe.empty()) return "cannot read /proc/self/exe";
    std::vector<std::string> args = {exe, "serve", "--ctl-fd", std::to_string(sv[1])};
    if (!host_id.empty()) args.insert(args.end(), {"--host-id", host_id});
    std::vector<char*> cargv;
    for (auto& a : args) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) return std::string("fork: ") + std::strerror(errno);
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent) _exit(1);
      fcntl(sv[1], F_SETFD, 0);  // the child's end survives exec
      execv(exe.c_str(), cargv.data());
      _exit(127);
    }
    pid_ = pid;
    close(sv[1]);
    *fd = sv[0];
    return "";
  }

  // Call after the control channel is closed: the session then ends.
  void Stop() {
    if (thread_.joinable()) thread_.join();
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
  int pid() const { return pid_; }

 private:
  int pid_ = -1;
  std::thread thread_;
};

// One table cell (or measured row) for the `table` test.
struct Cell {
  std::string scenario, op, transport, direction, path;
  uint64_t bytes = 0;
  double gbps = -1;
  double p99 = -1;
  std::string why;  // n/a reason; empty when measured
};

class Bench {
 public:
  Bench(const Config& c, std::string argv0, std::string invoked)
      : c_(c), argv0_(std::move(argv0)), invoked_(std::move(invoked)) {}
  int Run();

 private:
  // Sets up one session (target, engines, connection) with this transport forced (empty: best),
  // c_'s memory kinds and buffer pool; a local target child gets target_host_id_ when set.
  std::string Setup(const std::string& transport);
  void Teardown();
  bool RunOne(const std::string& test, uint64_t block, Row* fwd, Row* rev, std::string* err);
  int RunTests();
  int RunTable();
  void PrintHeader(const std::string& transport_note);
  void PrintTableHeader(const std::string& test);
  void PrintRow(const Row& r);
  int Finish();
  bool WriteJson(std::string* err);
  bool WriteCsv(std::string* err);
  std::string WhereLine() const;
  std::string MemNote() const;
  std::string HugeNote() const;
  void PrintPaths(const std::string& test);
  std::string GpuNote() const;

  Config c_;
  std::string argv0_, invoked_;
  LocalTarget target_;
  Ctl ctl_;
  // Before engine_, so that they outlive it (Teardown releases them in order anyway).
  BenchMem local_, region_;  // region_: this side's target region (bidirectional)
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Initiator> init_;
  std::string peer_;
  xfer::PeerInfo peer_info_;
  std::string rev_transport_;
  bool rev_shm_ = false;
  bool srv_in_process_ = false;
  std::string target_host_id_;  // table, bufferpool cells: the local target's own host id
  int srv_pid_ = 0;
  std::string srv_host_;
  uint64_t srv_page_kb_ = 0;
  uint64_t local_page_kb_ = 0;  // with --huge-pages: the page size of this side's buffers
  uint64_t remote_addr_ = 0, remote_len_ = 0;
  bool remote_shared_ = false;  // the peer's region came from AllocMem
  std::vector<Row> rows_;
  std::vector<Cell> cells_;  // table
  Progress progress_;
  bool verify_failed_ = false;
};

std::string Bench::Setup(const std::string& transport) {
  Config& c = c_;
  c.transport = transport;
  int fd = -1;
  std::string err;
  if (c.peer.empty()) {
    err = target_.Start(transport == "local", target_host_id_.empty() ? c.host_id : target_host_id_, &fd);
    if (!err.empty()) return err;
  } else {
    fd = ConnectRetry(c.peer, c.connect_timeout, &err);
    if (fd < 0) return err;
  }
  ctl_.Reset(fd);

  json reply;
  json hello = {{"type", "hello"}, {"schema", kCtlSchema}, {"version", kCtlVersion},
                {"client", MachineLine()}, {"config", ConfigToJson(c)}};
  err = ctl_.Call(hello, &reply, int(std::max(30.0, c.connect_timeout) * 1000));
  if (!err.empty()) return "the target refused: " + err;
  peer_ = reply.value("engine", "");
  srv_in_process_ = reply.value("in_process", false);
  srv_pid_ = reply.value("pid", 0);
  srv_host_ = reply.value("host", "");
  srv_page_kb_ = reply.value("page_kb", uint64_t(0));

  // This engine listens only when the peer must reach it (bidirectional).
  std::string name = c.local_name;
  if (c.bidir) {
    std::string h = c.peer.empty() ? "127.0.0.1" : SockHost(fd, false);
    name = (h.empty() ? std::string("0.0.0.0") : h) + ":0";
  }
  engine_ = std::make_unique<Engine>();
  Status st = engine_->Initialize(name, MakeEngineOptions(c));
  if (!st.ok()) return "Initialize(" + name + "): " + st.ToString();
  // The buffers belong to this engine (AllocMem), or are registered with it.
  err = local_.Allocate(engine_.get(), c, c.span, kLocalTag, MemOf(c.local_mem));
  if (!err.empty()) return "local buffers: " + err;
  local_page_kb_ = local_.page_kb();
  if (c.bidir) {
    err = region_.Allocate(engine_.get(), c, c.span, kRegionTag, MemOf(c.remote_mem));
    if (!err.empty()) return "target region for the reverse direction: " + err;
  }
  st = ConnectEngine(*engine_, peer_, c.connect_timeout);
  if (!st.ok()) return "Connect(" + peer_ + "): " + st.ToString();
  st = engine_->GetPeerInfo(peer_, &peer_info_);
  if (!st.ok()) return "GetPeerInfo(" + peer_ + "): " + st.ToString();
  st = FindRegion(*engine_, peer_, kRegionTag, MemOf(c.remote_mem), &remote_addr_, &remote_len_,
                  &remote_shared_);
  if (!st.ok()) return st.message();
  init_ = std::make_unique<Initiator>(c_, engine_.get(), peer_, &local_, remote_addr_, remote_len_);
  err = init_->CheckRemote();
  if (!err.empty()) return err;
  if (c.bidir) {
    err = ctl_.Call({{"type", "bidir"}, {"client_engine", engine_->LocalName()}}, &reply, 30000);
    if (!err.empty()) return err;
    rev_transport_ = reply.value("transport", "");
    rev_shm_ = reply.value("shm", false);
  }
  return "";
}

void Bench::Teardown() {
  init_.reset();
  // AllocMem memory goes back with FreeMem while the peer is still connected (it waits for the
  // peer to let go); the target frees its own on "bye" and answers when done, and only then
  // this engine finalizes, so that neither waits on a peer that is gone.
  std::string err = local_.Free();
  if (err.empty()) err = region_.Free();
  if (!err.empty()) std::fprintf(stderr, "xfer-bench: warning: %s\n", err.c_str());
  if (ctl_.open()) {
    json reply;
    if (ctl_.Call({{"type", "bye"}}, &reply, 30000).empty()) {
      std::string fe = reply.value("free_error", "");
      if (!fe.empty()) std::fprintf(stderr, "xfer-bench: warning: the target: %s\n", fe.c_str());
    }
    ctl_.Close();
  }
  if (engine_) engine_->Finalize();
  engine_.reset();
  local_.Reset();
  region_.Reset();
  target_.Stop();
}

// One size: the control marks around the timed window; with -b, the peer's row too.
bool Bench::RunOne(const std::string& test, uint64_t block, Row* fwd, Row* rev, std::string* err) {
  json reply;
  *err = ctl_.Call({{"type", "prepare"}, {"test", test}, {"bytes", block}}, &reply, 120000);
  if (!err->empty()) return false;
  double srv0 = -1, srv1 = -1;
  Hooks hk;
  hk.before_start = [&]() -> std::string {
    json r;
    std::string e = ctl_.Call({{"type", "go"}}, &r, 30000);
    srv0 = r.value("cpu_s", -1.0);
    return e;
  };
  json end_reply;
  hk.after_end = [&]() -> std::string {
    std::string e = ctl_.Call({{"type", "end"}}, &end_reply, 600000);
    srv1 = end_reply.value("cpu_s", -1.0);
    return e;
  };
  if (!init_->RunSize(test, block, hk, &progress_, fwd, err)) return false;
  fwd->transport = peer_info_.transport;
  fwd->direction = DirectionOf(c_);
  fwd->path = c_.buffer_pool ? "bufferpool" : "direct";
  if (!srv_in_process_ && srv0 >= 0 && srv1 >= 0 && fwd->seconds > 0)
    fwd->srv_cpu = (srv1 - srv0) / fwd->seconds * 100;
  if (c_.verify && fwd->verify != "ok") verify_failed_ = true;
  if (c_.bidir) {
    if (!end_reply.contains("row")) {
      *err = "the peer sent no row for the reverse direction";
      return false;
    }
    *rev = RowFromJson(end_reply["row"]);
    rev->transport = rev_transport_;
    rev->direction = fwd->direction;  // the peer runs the same test: its buffers local_mem too
    rev->path = fwd->path;
    if (c_.verify && rev->verify != "ok") verify_failed_ = true;
  }
  return true;
}

std::string Bench::WhereLine() const {
  if (srv_in_process_) return "a target engine in this process";
  if (c_.peer.empty()) return "a local target child process, pid " + std::to_string(target_.pid());
  return "xfer-bench serve at " + c_.peer + " (pid " + std::to_string(srv_pid_) + " on " +
         srv_host_.substr(0, srv_host_.find(',')) + ")";
}

std::string Bench::MemNote() const {
  const bool device = MemOf(c_.local_mem).device || MemOf(c_.remote_mem).device;
  if (c_.mem == "alloc")
    return std::string("--mem alloc: both sides' buffers from Engine::AllocMem (memfd; a same-host "
                       "peer maps it: path shm)") +
           (engine_ && !remote_shared_ && !MemOf(c_.remote_mem).device
                ? " (but the peer's region is not shared memory)"
                : "") +
           (device ? "; GPU buffers from Engine::AllocMem(kCuda)" : "");
  return std::string("--mem register: both sides' buffers mmap'd and registered (RegisterMem: the "
                     "peer's transport, cma on one host)") +
         (device ? "; GPU buffers cudaMalloc'd and registered (RegisterMem(kCuda))" : "");
}

// The peer line's word on the cuda path, when GPU memory is in play (or the path is up).
std::string Bench::GpuNote() const {
  const bool device = MemOf(c_.local_mem).device || MemOf(c_.remote_mem).device;
  if (peer_info_.cuda)
    return "; cuda: yes (the peer's GPU memory is opened here: CUDA IPC, copy engines)";
  if (!device) return "";
  std::string why = GpuWhy();
  if (why.empty() && !c_.transport.empty() && c_.transport != "cuda")
    why = "forcing transport " + c_.transport + " disables it";
  if (why.empty())
    why = "no cuda path to this peer: another host id, or no GPU there; GPU memory then goes "
          "through the buffer pool";
  return "; cuda: no (" + why + ")";
}

std::string Bench::HugeNote() const {
  if (!c_.huge_pages) return "";
  auto got = [](uint64_t kb) {
    return kb == 0 ? std::string("unknown") : std::to_string(kb) + " kB";
  };
  const bool small = local_page_kb_ == 4 || srv_page_kb_ == 4;
  return "; --huge-pages: page size here " + got(local_page_kb_) + ", at the target " +
         got(srv_page_kb_) + (small ? " (4 kB: the kernel had no huge pages to give)" : "");
}

// Bytes moved in the timed windows of a test's rows, by path.
struct PathTotals {
  int64_t shm = 0, link = 0, cuda = 0, staged = 0, moved = 0;
  bool known = true;
  std::string transport;
  int64_t total() const { return shm + link + cuda + staged; }
};

// "shm 0% (0 bytes), cma 100% (65536 bytes), cuda 0% (0 bytes), staged 0% (0 bytes)": the
// transport's own share names the transport; staged = through the buffer pool, then the
// transport.
std::string PathText(const PathTotals& p) {
  if (!p.known) return "unknown (the engine did not report it)";
  const int64_t total = p.total();
  auto pct = [&](int64_t v) {
    if (total <= 0) return std::string("0%");
    double x = 100.0 * double(v) / double(total);
    if (v > 0 && v < total) x = std::min(99.0, std::max(1.0, x));  // never "100%" unless all
    char b[16];
    std::snprintf(b, sizeof b, "%.0f%%", x);
    return std::string(b);
  };
  auto item = [&](const std::string& name, int64_t v) {
    return name + " " + pct(v) + " (" + std::to_string(v) + " bytes)";
  };
  std::string s = item("shm", p.shm);
  if (p.transport != "shm" && p.transport != "cuda")
    s += ", " + item(p.transport.empty() ? std::string("transport") : p.transport, p.link);
  else if (p.link > 0)
    s += ", " + item("transport", p.link);
  s += ", " + item("cuda", p.cuda) + ", " + item("staged", p.staged);
  if (total != p.moved)
    s += "; WARNING: the engine accounted " + std::to_string(total) + " bytes of the " +
         std::to_string(p.moved) + " moved";
  return s;
}

PathTotals SumPaths(const std::vector<Row>& rows, const std::string& test, const std::string& dir,
                    uint64_t batch) {
  PathTotals p;
  bool any = false;
  for (const Row& r : rows) {
    if (r.test != test || r.dir != dir) continue;
    any = true;
    p.transport = r.transport;
    if (r.shm_bytes < 0 || r.transport_bytes < 0 || r.cuda_bytes < 0 || r.staged_bytes < 0)
      p.known = false;
    p.shm += std::max<int64_t>(0, r.shm_bytes);
    p.link += std::max<int64_t>(0, r.transport_bytes);
    p.cuda += std::max<int64_t>(0, r.cuda_bytes);
    p.staged += std::max<int64_t>(0, r.staged_bytes);
    p.moved += int64_t(r.requests * batch * r.bytes);
  }
  if (!any) p.known = false;
  return p;
}

// After a test's rows: which path the bytes took (this side's engine; with -b, the peer's too).
void Bench::PrintPaths(const std::string& test) {
  if (!c_.bidir) {
    std::printf("# path: %s\n", PathText(SumPaths(rows_, test, "", c_.batch)).c_str());
  } else {
    std::printf("# path ->: %s\n", PathText(SumPaths(rows_, test, "->", c_.batch)).c_str());
    std::printf("# path <-: %s\n", PathText(SumPaths(rows_, test, "<-", c_.batch)).c_str());
  }
  std::fflush(stdout);
}

void Bench::PrintHeader(const std::string& transport_note) {
  std::string tests;
  for (auto& t : c_.tests) tests += (tests.empty() ? "" : ", then ") + t;
  std::printf("# xfer-bench %s: %s\n", XFER_TOOLS_VERSION, tests.c_str());
  if (!transport_note.empty()) {
    std::printf("# peer:      %s\n", transport_note.c_str());
  } else {
    std::string shm;
    if (peer_info_.transport != "shm")
      shm = peer_info_.shm        ? "; shm: yes (the peer's AllocMem memory is mapped here)"
            : !c_.transport.empty() ? "; shm: no (forcing a transport disables it)"
                                    : "; shm: no (no mapped path to this peer)";
    shm += GpuNote();
    if (c_.bidir)
      shm += "; reverse direction: transport " + rev_transport_ + ", shm " + (rev_shm_ ? "yes" : "no");
    std::printf("# peer:      %s (%s); transport %s%s%s\n", peer_.c_str(), WhereLine().c_str(),
                peer_info_.transport.c_str(),
                c_.transport.empty() ? " (best available)" : " (forced)", shm.c_str());
  }
  std::printf("# engine:    streams %s; links %s\n",
              c_.streams ? std::to_string(c_.streams).c_str()
                         : (std::to_string(EngineOptions{}.streams) + " (default)").c_str(),
              LinksNote(c_, transport_note.empty() ? peer_info_.transport : "any").c_str());
  std::string sizes = c_.size_arg + " (" + std::to_string(c_.sizes.size()) +
                      (c_.sizes.size() == 1 ? " size)" : " sizes)");
  std::printf("# sizes:     %s; batch %" PRIu64 " descriptor%s per request; depth %" PRIu64
              " request%s in flight per thread; %d thread%s\n",
              sizes.c_str(), c_.batch, c_.batch > 1 ? "s" : "", c_.depth, c_.depth > 1 ? "s" : "",
              c_.threads, c_.threads > 1 ? "s" : "");
  std::printf("# memory:    local %s, remote %s; %s%s; %s%s\n",
              c_.local_mem.c_str(), c_.remote_mem.c_str(), MemNote().c_str(),
              HugeNote().c_str(),
              c_.buffer_pool ? "--buffer-pool: every transfer staged through the engines' buffer "
                               "pools (EngineOptions::staging = always, both sides)"
                             : "staging auto (the buffer pool only for pairs no path reaches "
                               "directly, e.g. GPU memory to another host)",
              c_.bidir ? "; bidirectional: the peer runs the same test toward this side at the "
                         "same time (rows ->, <- and their sum)"
                       : "");
  char dur[32];
  std::snprintf(dur, sizeof dur, "%g", c_.duration);
  std::string run = c_.iters ? std::to_string(c_.iters) + " requests per size"
                             : std::string(dur) + " s per size";
  std::string warm = c_.warmup >= 0 ? std::to_string(c_.warmup) + " requests per thread"
                                    : "one pass over the buffers (at least 8 requests, at most 1 s)";
  std::printf("# run:       %s; warm-up %s%s\n", run.c_str(), warm.c_str(),
              c_.verify ? "; --verify: data checked after each size (not timed)" : "");
  if (c_.reuse)
    std::printf("# buffers:   --reuse: every request uses the same blocks (%s per side)\n",
                FormatSize(c_.span).c_str());
  else
    std::printf("# buffers:   walk a %s span per side%s (--reuse: one set, as perftest); remote "
                "blocks pair-swapped so none coalesce\n",
                FormatSize(c_.span).c_str(),
                c_.span >= kDefaultSpan ? ", larger than the CPU caches" : " (--span)");
  if (c_.expect_bw >= 0 || c_.expect_p99 >= 0) {
    std::string ex;
    if (c_.expect_bw >= 0) ex += "BW avg >= " + std::to_string(c_.expect_bw).substr(0, 8) + " GB/s";
    if (c_.expect_p99 >= 0) ex += std::string(ex.empty() ? "" : ", ") + "p99 <= " + std::to_string(c_.expect_p99).substr(0, 8) + " us";
    std::printf("# expect:    %s at every size (exit %d when not met)\n", ex.c_str(), kExitExpect);
  }
  std::printf("# host:      %s\n", MachineLine().c_str());
  std::printf("# units:     GB/s = 1e9 B/s, Gb/s = 1e9 bit/s; #iters = requests; MsgRate = "
              "descriptors/s; p50..p99.9 = request latency; CPU%% = this process, srv = the "
              "target process (100 = one core); '# path:' = bytes by path (staged = through the "
              "buffer pool, then the transport)\n");
  std::printf("# rerun:     %s\n", RerunCommand(argv0_, c_).c_str());
  if (invoked_ != RerunCommand(argv0_, c_)) std::printf("# invoked:   %s\n", invoked_.c_str());
  std::fflush(stdout);
}

void Bench::PrintTableHeader(const std::string& test) {
  std::printf("\n## %s (%s)\n", test.c_str(), OpUpper(TestOp(test)));
  if (c_.bidir) std::printf("%-4s ", "dir");
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
  if (c_.bidir) std::printf("%-4s ", r.dir.c_str());
  if (IsLat(r.test))
    std::printf("%-10" PRIu64 " %10" PRIu64 " %11.2f %11.2f %11.2f %11.2f %11.2f %11.2f %11.2f %7s\n",
                r.bytes, r.requests, r.lat.min, r.lat.max, r.lat.median, r.lat.avg, r.lat.stdev,
                r.lat.p99, r.lat.p999, Pct(r.cpu).c_str());
  else
    std::printf("%-10" PRIu64 " %10" PRIu64 " %13.2f %13.2f %14.2f %14.4f %10.1f %10.1f %11.1f %7s %7s\n",
                r.bytes, r.requests, r.bw_avg, r.bw_avg * 8, r.bw_peak, r.msg_rate, r.lat.p50,
                r.lat.p99, r.lat.p999, Pct(r.cpu).c_str(), Pct(r.srv_cpu).c_str());
  if (!r.verify.empty() && r.verify != "ok")
    std::printf("# verify %s B (%s): %s\n", FormatSize(r.bytes).c_str(), r.dir.empty() ? "" : r.dir.c_str(), r.verify.c_str());
  std::fflush(stdout);
}

// The sum of the two directions of a bidirectional size.
Row SumRows(const Row& a, const Row& b) {
  Row s = a;
  s.dir = "sum";
  s.requests = a.requests + b.requests;
  s.descs = a.descs + b.descs;
  s.seconds = std::max(a.seconds, b.seconds);
  s.bw_avg = a.bw_avg + b.bw_avg;
  s.bw_peak = a.bw_peak + b.bw_peak;
  s.msg_rate = a.msg_rate + b.msg_rate;
  s.lat.p50 = std::max(a.lat.p50, b.lat.p50);  // the worse side's figures
  s.lat.p99 = std::max(a.lat.p99, b.lat.p99);
  s.lat.p999 = std::max(a.lat.p999, b.lat.p999);
  s.lat.min = std::min(a.lat.min, b.lat.min);
  s.lat.max = std::max(a.lat.max, b.lat.max);
  s.lat.median = std::max(a.lat.median, b.lat.median);
  s.lat.avg = (a.lat.avg * double(a.lat.n) + b.lat.avg * double(b.lat.n)) / double(std::max<uint64_t>(1, a.lat.n + b.lat.n));
  s.lat.stdev = std::max(a.lat.stdev, b.lat.stdev);
  s.lat.n = a.lat.n + b.lat.n;
  s.verify.clear();
  auto add = [](int64_t x, int64_t y) { return x >= 0 && y >= 0 ? x + y : -1; };
  s.shm_bytes = add(a.shm_bytes, b.shm_bytes);
  s.transport_bytes = add(a.transport_bytes, b.transport_bytes);
  s.cuda_bytes = add(a.cuda_bytes, b.cuda_bytes);
  s.staged_bytes = add(a.staged_bytes, b.staged_bytes);
  return s;
}

int Bench::RunTests() {
  std::string err = Setup(c_.transport);
  if (!err.empty()) {
    Teardown();
    std::fprintf(stderr, "xfer-bench: %s\n", err.c_str());
    return 1;
  }
  PrintHeader("");
  for (const auto& test : c_.tests) {
    PrintTableHeader(test);
    for (uint64_t b : c_.sizes) {
      Row fwd, rev;
      if (!RunOne(test, b, &fwd, &rev, &err)) {
        progress_.Clear();
        Teardown();
        std::fprintf(stderr, "xfer-bench: %s\n", err.c_str());
        return 1;
      }
      if (c_.bidir) {
        fwd.dir = "->";
        rev.dir = "<-";
        Row sum = SumRows(fwd, rev);
        for (const Row* r : {&fwd, &rev, &sum}) {
          PrintRow(*r);
          rows_.push_back(*r);
        }
      } else {
        PrintRow(fwd);
        rows_.push_back(fwd);
      }
    }
    PrintPaths(test);
  }
  Teardown();
  return Finish();
}

// The HIXL-shaped matrix: every (op, block, transport, direction, path); measured where this
// build and machine can, "n/a" with a footnote elsewhere. How a cell is measured:
//   direction  local (initiator) memory 2 remote (target) memory, for READ as for WRITE: H host,
//              D GPU. (HIXL's table reads so: its HCCS D2H cells are empty for both ops.)
//   direct     the transport column forced between this side and the target (a local child:
//              one host id). GPU memory is direct only under transport "cuda" (CUDA IPC and the
//              copy engines: D2D, H2D, D2H); the other transports' D cells and cuda's H2H are n/a.
//   bufferpool measured under transport "tcp" only: EngineOptions::staging = "always" on both
//              engines, and a local target child gets a host id of its own, so no same-host path
//              is taken: every byte goes through a pinned staging buffer (GPU memory: a device
//              copy first) and tcp; the target's tcp threads stage its GPU region. The other
//              transports' bufferpool cells are n/a.
// Each measured (transport, direction, path) is one session; a cell whose bytes the engine
// reports on another path than its label (GetPeerInfo's counters) is n/a, with the path shown.
int Bench::RunTable() {
  const std::string scenario = c_.peer.empty() ? "single_machine" : "dual_machine";
  std::vector<std::string> notes;  // footnotes, numbered from 1
  auto note = [&](const std::string& why) {
    auto it = std::find(notes.begin(), notes.end(), why);
    if (it != notes.end()) return size_t(it - notes.begin()) + 1;
    notes.push_back(why);
    return notes.size();
  };
  const Config saved = c_;
  const std::string gpu_why = GpuWhy();
  // The GPUs of the D cells: cuda:0 on both sides, unless --local-mem / --remote-mem name others.
  const MemSpec lm = MemOf(c_.local_mem), rm = MemOf(c_.remote_mem);
  const std::string dev_local = "cuda:" + std::to_string(lm.device ? lm.gpu : 0);
  const std::string dev_remote = "cuda:" + std::to_string(rm.device ? rm.gpu : 0);
  const std::string pool_target_id = "xfer-bench-table-target";  // bufferpool: the child's host id

  std::printf("# xfer-bench %s: table (shape of ../shared/reference/hixl_a3_bandwidth.tsv)\n",
              XFER_TOOLS_VERSION);
  std::printf("# %s; sizes %s; ", c_.peer.empty() ? "target: a local child process (local: a "
              "target engine in this process)" : ("target: xfer-bench serve at " + c_.peer).c_str(),
              c_.size_arg.c_str());
  char dur[32];
  std::snprintf(dur, sizeof dur, "%g", c_.duration);
  std::printf("%s per cell; batch %" PRIu64 "; depth %" PRIu64 "; %d thread%s; %s\n",
              c_.iters ? (std::to_string(c_.iters) + " requests").c_str() : (std::string(dur) + " s").c_str(),
              c_.batch, c_.depth, c_.threads, c_.threads > 1 ? "s" : "",
              c_.reuse ? "--reuse" : ("walking a " + FormatSize(c_.span) + " span per side").c_str());
  std::printf("# links %s\n", LinksNote(c_, "any").c_str());
  std::printf("# memory: %s\n", MemNote().c_str());
  std::printf("# direction = local (initiator) memory 2 remote (target) memory, H host, D GPU, for "
              "READ as for WRITE (as HIXL's table reads); WRITE moves local to remote, READ "
              "remote to local\n");
  std::printf("# direct: the transport forced between the two engines%s; D cells only under "
              "transport cuda (CUDA IPC + copy engines)\n",
              c_.peer.empty() ? " (one host id)" : "");
  std::printf("# bufferpool: under transport tcp only: EngineOptions::staging = always on both "
              "engines%s; every byte through pinned staging buffers, then tcp\n",
              c_.peer.empty() ? (", the target on host id " + pool_target_id + " (no same-host path)").c_str()
                              : "");
  std::printf("# gpu: %s\n", gpu_why.empty()
                                 ? ("D = " + dev_local + " here, " + dev_remote + " at the target").c_str()
                                 : (gpu_why + " (D cells n/a)").c_str());
  std::printf("# host: %s\n", MachineLine().c_str());
  std::printf("# rerun: %s\n", RerunCommand(argv0_, c_).c_str());
  std::fflush(stdout);

  // One group of cells per (transport, direction, path): measured in one session, or n/a.
  struct Group {
    std::string t, d, p;
    std::string why;                                // n/a reason
    std::vector<std::pair<std::string, Row>> rows;  // test -> row
  };
  auto static_why = [&](const std::string& t, const std::string& d, const std::string& p) -> std::string {
    const bool local_dev = d[0] == 'D', remote_dev = d[2] == 'D';
    if (p == "bufferpool") {
      if (t != "tcp")
        return "bufferpool cells are measured under transport tcp (staging = always on both "
               "engines, different host ids)";
    } else if (t == "cuda") {
      if (!local_dev && !remote_dev)
        return "cuda: moves pairs with GPU memory; host to host between processes is shm or cma";
    } else if (local_dev || remote_dev) {
      return t == "tcp" ? "tcp: reaches GPU memory only through staging (the tcp bufferpool cells)"
                        : t + ": host memory only; GPU memory goes through cuda (one host) or "
                              "the buffer pool (the tcp bufferpool cells)";
    }
    if (t == "local" && !c_.peer.empty()) return "local: both engines in one process only";
    if (t == "shm" && c_.mem != "alloc")
      return "shm: moves only Engine::AllocMem memory (this run: --mem register)";
    // GPU memory here: this side's, and a local target's (a remote serve checks its own).
    if (!gpu_why.empty() && (local_dev || (remote_dev && c_.peer.empty()))) return gpu_why;
    return "";
  };
  std::vector<Group> groups;
  for (const auto& t : kKnownTransports)
    for (const auto& d : kDirections)
      for (const auto& p : kPaths) groups.push_back({t, d, p, static_why(t, d, p), {}});

  for (Group& g : groups) {
    if (!g.why.empty()) continue;
    c_ = saved;
    c_.local_mem = g.d[0] == 'D' ? dev_local : "host";
    c_.remote_mem = g.d[2] == 'D' ? dev_remote : "host";
    c_.buffer_pool = g.p == "bufferpool";
    target_host_id_ = c_.buffer_pool ? pool_target_id : "";
    const std::string label = g.t + (g.d == "H2H" && g.p == "direct" ? "" : " " + g.d + " " + g.p);
    std::string err = Setup(g.t);
    if (err.empty() && g.t == "cuda" && peer_info_.transport != "cuda" && !peer_info_.cuda)
      err = "no cuda path to the target (the engine chose " + peer_info_.transport + ")";
    else if (err.empty() && g.t != "cuda" && peer_info_.transport != g.t)
      err = "the engine chose " + peer_info_.transport + " instead";
    if (!err.empty()) {
      // An engine without the transport either does not know its name or says it has none.
      if (err.find("unknown transport") != std::string::npos ||
          err.find("this build has no") != std::string::npos)
        g.why = g.t + ": transport not built in this version";
      else
        g.why = label + ": " + err;
    } else {
      std::fprintf(stderr, "table: %s ...\n", label.c_str());
      for (const std::string test : {"write_bw", "read_bw"}) {
        for (uint64_t b : c_.sizes) {
          Row fwd, rev;
          if (!RunOne(test, b, &fwd, &rev, &err)) break;
          g.rows.push_back({test, fwd});
          rows_.push_back(fwd);
        }
        if (!err.empty()) break;
      }
      if (!err.empty()) {
        progress_.Clear();
        g.why = label + ": failed: " + err;
      } else if (g.t == "cuda" || g.p == "bufferpool") {
        // The label must be where the bytes went.
        std::vector<Row> rows;
        for (const auto& [test, row] : g.rows) rows.push_back(row), rows.back().test = "any";
        PathTotals pt = SumPaths(rows, "any", "", c_.batch);
        const int64_t on_path = g.t == "cuda" ? pt.cuda : pt.staged;
        if (pt.known && (pt.total() == 0 || on_path != pt.total()))
          g.why = label + ": the engine moved the bytes another way (" + PathText(pt) + ")";
      }
    }
    Teardown();
  }
  c_ = saved;
  target_host_id_.clear();

  // The matrix, in HIXL's column order, plus a note column.
  std::printf("scenario\top\tblock\ttransport\tdirection\tpath\tGBps\tnote\n");
  for (const std::string op : {"write", "read"}) {
    for (uint64_t b : c_.sizes) {
      for (const Group& g : groups) {
        Cell cell{scenario, op, g.t, g.d, g.p, b, -1, -1, ""};
        std::string why = g.why;
        if (why.empty()) {
          const Row* r = nullptr;
          for (const auto& [test, row] : g.rows)
            if (test == op + "_bw" && row.bytes == b) r = &row;
          if (r) {
            cell.gbps = r->bw_avg;
            cell.p99 = r->lat.p99;
          } else {
            why = g.t + ": not measured (the run stopped)";
          }
        }
        cell.why = why;
        if (cell.gbps >= 0)
          std::printf("%s\t%s\t%s\t%s\t%s\t%s\t%.3f\t\n", scenario.c_str(), op.c_str(),
                      FormatSize(b).c_str(), g.t.c_str(), g.d.c_str(), g.p.c_str(), cell.gbps);
        else
          std::printf("%s\t%s\t%s\t%s\t%s\t%s\tn/a\t[%zu]\n", scenario.c_str(), op.c_str(),
                      FormatSize(b).c_str(), g.t.c_str(), g.d.c_str(), g.p.c_str(), note(why));
        cells_.push_back(cell);
      }
    }
  }
  for (size_t i = 0; i < notes.size(); ++i) std::printf("# [%zu] n/a: %s\n", i + 1, notes[i].c_str());
  // A compact view of what was measured: one column per op and measured group.
  struct Col {
    std::string label, op;
    const Group* g;
  };
  std::vector<Col> cols;
  for (const Group& g : groups) {
    if (!g.why.empty() || g.rows.empty()) continue;
    for (const std::string op : {"write", "read"}) {
      std::string label = op + "/" + g.t;
      if (g.d != "H2H" || g.p != "direct") label += "/" + g.d;
      if (g.p == "bufferpool") label += "/pool";
      cols.push_back({label, op, &g});
    }
  }
  std::printf("#\n# measured (GB/s; op/transport[/direction][/pool], H2H direct unless named):\n# %-8s", "block");
  for (auto& col : cols) std::printf(" %*s", int(std::max<size_t>(12, col.label.size())), col.label.c_str());
  std::printf("\n");
  for (uint64_t b : c_.sizes) {
    std::printf("# %-8s", FormatSize(b).c_str());
    for (auto& col : cols) {
      double v = -1;
      for (const auto& [test, row] : col.g->rows)
        if (test == col.op + "_bw" && row.bytes == b) v = row.bw_avg;
      const int w = int(std::max<size_t>(12, col.label.size()));
      if (v >= 0) std::printf(" %*.2f", w, v);
      else std::printf(" %*s", w, "n/a");
    }
    std::printf("\n");
  }
  // Which path each group's bytes took (GetPeerInfo's counters over the timed windows).
  for (const Group& g : groups) {
    if (g.rows.empty()) continue;
    std::vector<Row> rows;
    for (const auto& [test, row] : g.rows) {
      rows.push_back(row);
      rows.back().test = "any";
    }
    const std::string label = g.t + (g.d == "H2H" && g.p == "direct" ? "" : " " + g.d + " " + g.p);
    std::printf("# path %s: %s\n", label.c_str(), PathText(SumPaths(rows, "any", "", c_.batch)).c_str());
  }
  std::fflush(stdout);
  return Finish();
}

// Expectations, then the files.
int Bench::Finish() {
  std::string err;
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
  std::vector<std::string> missed;
  char buf[256];
  for (const Row& r : rows_) {
    if (r.dir == "->" || r.dir == "<-") continue;  // bidirectional: the sum counts
    std::string what = r.test + (r.transport.empty() ? "" : " over " + r.transport) + " at " +
                       std::to_string(r.bytes) + " B";
    if (c_.expect_bw >= 0 && !IsLat(r.test) && r.bw_avg < c_.expect_bw) {
      std::snprintf(buf, sizeof buf, "--expect-bw %g GB/s not met: %s: BW avg %.2f GB/s", c_.expect_bw, what.c_str(), r.bw_avg);
      missed.push_back(buf);
    }
    if (c_.expect_p99 >= 0 && r.lat.p99 > c_.expect_p99) {
      std::snprintf(buf, sizeof buf, "--expect-p99 %g us not met: %s: p99 %.1f us", c_.expect_p99, what.c_str(), r.lat.p99);
      missed.push_back(buf);
    }
  }
  if (!missed.empty()) {
    for (auto& m : missed) std::fprintf(stderr, "xfer-bench: %s\n", m.c_str());
    return kExitExpect;
  }
  return 0;
}

bool Bench::WriteJson(std::string* err) {
  json j;
  j["schema"] = kJsonSchema;
  j["schema_version"] = kJsonVersion;
  j["xfer_version"] = XFER_TOOLS_VERSION;
  j["command"] = RerunCommand(argv0_, c_);
  j["invoked"] = invoked_;
  j["host"] = MachineLine();
  j["config"] = ConfigToJson(c_);
  j["config"]["pattern"] = c_.reuse ? "reuse" : "walk";
  j["config"]["streams_effective"] = c_.streams ? c_.streams : EngineOptions{}.streams;
  j["config"]["links_note"] = LinksNote(c_, peer_info_.transport);
  j["config"]["expect_bw_GBps"] = OptNum(c_.expect_bw);
  j["config"]["expect_p99_us"] = OptNum(c_.expect_p99);
  j["config"]["staging"] = c_.buffer_pool ? "always" : "auto";
  j["peer"] = {{"address", c_.peer.empty() ? json(nullptr) : json(c_.peer)},
               {"name", peer_},
               {"transport", peer_info_.transport},
               {"pid", peer_info_.pid},
               {"host_id", peer_info_.host_id},
               {"local_target", c_.peer.empty()},
               {"shm", peer_info_.shm},
               {"cuda", peer_info_.cuda},
               {"region_shared", remote_shared_},
               {"reverse_transport", c_.bidir ? json(rev_transport_) : json(nullptr)},
               {"reverse_shm", c_.bidir ? json(rev_shm_) : json(nullptr)}};
  j["config"]["page_kb"] = {{"local", c_.huge_pages ? json(local_page_kb_) : json(nullptr)},
                            {"target", c_.huge_pages ? json(srv_page_kb_) : json(nullptr)}};
  // Which path the bytes took, per test (and direction with -b): GetPeerInfo's counters over
  // the timed windows.
  json paths = json::array();
  for (const auto& t : c_.tests) {
    if (t == "table") continue;
    const std::vector<std::string> dirs = c_.bidir ? std::vector<std::string>{"->", "<-"} : std::vector<std::string>{""};
    for (const std::string& dir : dirs) {
      PathTotals p = SumPaths(rows_, t, dir, c_.batch);
      if (!p.known) continue;
      const int64_t total = p.total();
      auto pct = [&](int64_t v) { return total > 0 ? 100.0 * double(v) / double(total) : 0.0; };
      paths.push_back({{"test", t},
                       {"dir", dir.empty() ? json(nullptr) : json(dir)},
                       {"transport", p.transport},
                       {"shm_bytes", p.shm},
                       {"transport_bytes", p.link},
                       {"cuda_bytes", p.cuda},
                       {"staged_bytes", p.staged},
                       {"moved_bytes", p.moved},
                       {"shm_pct", pct(p.shm)},
                       {"cuda_pct", pct(p.cuda)},
                       {"staged_pct", pct(p.staged)}});
    }
  }
  j["paths"] = std::move(paths);
  json rows = json::array();
  for (const Row& r : rows_) rows.push_back(RowToJson(r));
  j["rows"] = std::move(rows);
  if (!cells_.empty()) {
    json cells = json::array();
    for (const Cell& x : cells_)
      cells.push_back({{"scenario", x.scenario}, {"op", x.op}, {"bytes", x.bytes},
                       {"transport", x.transport}, {"direction", x.direction}, {"path", x.path},
                       {"GBps", OptNum(x.gbps)}, {"p99_us", OptNum(x.p99)},
                       {"na_reason", x.why.empty() ? json(nullptr) : json(x.why)}});
    j["table"] = std::move(cells);
  }
  std::ofstream f(c_.json_file);
  if (!f) {
    *err = "cannot write " + c_.json_file;
    return false;
  }
  f << j.dump(2) << "\n";
  return bool(f);
}

bool Bench::WriteCsv(std::string* err) {
  std::ofstream f(c_.csv_file);
  if (!f) {
    *err = "cannot write " + c_.csv_file;
    return false;
  }
  f << "test,op,dir,bytes,iters,descriptors,seconds,bw_avg_GBps,bw_avg_Gbps,bw_peak_GBps,"
       "msg_rate_Mops,t_min_us,t_max_us,t_typical_us,t_avg_us,t_stdev_us,p50_us,p99_us,p99_9_us,"
       "cpu_pct,server_cpu_pct,verify,transport,direction,path,batch,depth,threads,pattern,mem,"
       "shm_bytes,transport_bytes,cuda_bytes,staged_bytes\n";
  for (const Row& r : rows_) {
    f << r.test << ',' << OpUpper(TestOp(r.test)) << ',' << r.dir << ',' << r.bytes << ','
      << r.requests << ',' << r.descs << ',' << r.seconds << ',' << r.bw_avg << ',' << r.bw_avg * 8
      << ',' << r.bw_peak << ',' << r.msg_rate << ',' << r.lat.min << ',' << r.lat.max << ','
      << r.lat.median << ',' << r.lat.avg << ',' << r.lat.stdev << ',' << r.lat.p50 << ','
      << r.lat.p99 << ',' << r.lat.p999 << ',' << (r.cpu >= 0 ? std::to_string(r.cpu) : "") << ','
      << (r.srv_cpu >= 0 ? std::to_string(r.srv_cpu) : "") << ',' << r.verify << ','
      << r.transport << ',' << r.direction << ',' << r.path << ',' << c_.batch << ','
      << c_.depth << ',' << c_.threads << ',' << (c_.reuse ? "reuse" : "walk") << ','
      << c_.mem << ',' << (r.shm_bytes >= 0 ? std::to_string(r.shm_bytes) : "") << ','
      << (r.transport_bytes >= 0 ? std::to_string(r.transport_bytes) : "") << ','
      << (r.cuda_bytes >= 0 ? std::to_string(r.cuda_bytes) : "") << ','
      << (r.staged_bytes >= 0 ? std::to_string(r.staged_bytes) : "") << '\n';
  }
  return bool(f);
}

int Bench::Run() {
  if (c_.tests.size() == 1 && c_.tests[0] == "table") return RunTable();
  return RunTests();
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
  app->add_option("-n,--iters", c.iters, "Requests per size, all threads together (instead of --duration)")
      ->check(CLI::PositiveNumber);
  app->add_option("-D,--duration", c.duration, "Timed seconds per size")
      ->check(CLI::Range(0.001, 3600.0))
      ->capture_default_str();
  app->add_option("-w,--warmup", c.warmup,
                  "Warm-up requests per size and thread (default: one pass over the buffers, >= 8, <= 1 s)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--batch", c.batch, "Descriptors per request")
      ->check(CLI::Range(uint64_t(1), uint64_t(1000000)))
      ->capture_default_str();
  app->add_option("--depth", c.depth, "Requests in flight per thread (TransferAsync); latency tests use 1")
      ->check(CLI::Range(uint64_t(1), uint64_t(1024)))
      ->capture_default_str();
  app->add_option("--threads", c.threads, "Client threads issuing requests concurrently, each with its own --depth")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app->add_option("--links", c.links,
                  "Connections per peer for transports that have them (reported n/a for the others)")
      ->check(CLI::Range(1, 64));
  app->add_option("--streams", c.streams, "Engine data streams (worker threads); default: the engine's")
      ->check(CLI::Range(1, 64));
  app->add_option("--slice-bytes", c.slice_arg,
                  "EngineOptions::slice_bytes: longer descriptors are cut")
      ->type_name("BYTES");
  app->add_option("--batch-bytes", c.batch_bytes_arg,
                  "EngineOptions::batch_bytes: bytes per batch / system call")
      ->type_name("BYTES");
  app->add_option("--spin", c.spin_us,
                  "EngineOptions::spin in us: how long waiters and idle streams spin before they sleep")
      ->check(CLI::Range(int64_t(0), int64_t(1000000)));
  app->add_option("--transport", c.transport,
                  "Force a transport: local, shm (only AllocMem memory, by memcpy from a mapping), "
                  "cma, ucx, tcp (forcing cma, ucx or tcp disables shm and cuda), cuda (only "
                  "pairs with GPU memory, one host: CUDA IPC + copy engines); default: the best "
                  "both sides offer, shm for the peer's AllocMem memory and cuda for GPU memory "
                  "on the same host")
      ->type_name("NAME");
  app->add_option("--mem", c.mem,
                  "How both sides get their buffers: alloc = Engine::AllocMem (a memfd that a "
                  "same-host peer maps: path shm, no system call per transfer), register = "
                  "mmap + RegisterMem (same host: cma). The header and '# path:' lines say "
                  "which path the bytes took")
      ->type_name("alloc|register")
      ->capture_default_str();
  app->add_flag("--huge-pages", c.huge_pages,
                "--mem alloc: ask for huge pages (AllocOptions::huge_pages; the engine falls "
                "back to normal pages when the kernel has none)");
  app->add_option("--local-mem", c.local_mem,
                  "Memory of this side's buffers: host, or cuda:N = GPU N (Engine::AllocMem(kCuda); "
                  "--mem register: cudaMalloc + RegisterMem(kCuda)). Refused with the reason where "
                  "no GPU is usable. table: the GPU of its D cells (default cuda:0)")
      ->type_name("MEM")
      ->capture_default_str();
  app->add_option("--remote-mem", c.remote_mem,
                  "Memory of the target's region, allocated by the target (a local child, or the "
                  "serve side: its GPU N): host, or cuda:N. With -b the peer's buffers are "
                  "--local-mem and this side's region --remote-mem, as the forward direction's")
      ->type_name("MEM")
      ->capture_default_str();
  app->add_flag("--buffer-pool", c.buffer_pool,
                "Stage every transfer through the engines' buffer pools: EngineOptions::staging "
                "= always on both sides (host memory stands in for GPU memory; '# path:' shows "
                "the staged bytes)");
  app->add_option("--staging-buffers", c.staging_buffers,
                  "EngineOptions::staging_buffers on both sides: buffers in the pool")
      ->check(CLI::Range(1, 64));
  app->add_option("--staging-buffer-bytes", c.staging_bytes_arg,
                  "EngineOptions::staging_buffer_bytes on both sides: bytes per pool buffer (64K..1G)")
      ->type_name("BYTES");
  app->add_flag("-b,--bidirectional", c.bidir,
                "Both sides initiate at once: the peer runs the same test toward this side");
  app->add_flag("--reuse", c.reuse,
                "Every request uses the same buffers (as perftest); default: walk a span larger "
                "than the CPU caches");
  app->add_option("--span", c.span_arg, "Bytes walked per side without --reuse (default 256M)")
      ->type_name("BYTES");
  app->add_flag("--verify", c.verify, "Check the data after each size (not timed)");
  app->add_option("--expect-bw", c.expect_bw, "Exit 3 unless every size reaches this BW avg")
      ->type_name("GB/s")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--expect-p99", c.expect_p99, "Exit 3 unless every size's p99 latency is at most this")
      ->type_name("us")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--json", c.json_file, "Also write every row as JSON to FILE")->type_name("FILE");
  app->add_option("--csv", c.csv_file, "Also write every row as CSV to FILE")->type_name("FILE");
  app->add_option("--local", c.local_name,
                  "This engine's name (a host alone: client-only); default 127.0.0.1 for a local "
                  "target, 0.0.0.0 otherwise");
  app->add_option("--host-id", c.host_id,
                  "EngineOptions::host_id of this side (and of a local target child): engines "
                  "with different ids never use same-host transports");
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
      "With no test it runs the main job: a local target child, WRITE then READ, 16K..8M,\n"
      "buffers from Engine::AllocMem (path shm on one host; --mem register: cma)."};
  app.set_version_flag("--version", std::string("xfer-bench ") + XFER_TOOLS_VERSION);
  app.require_subcommand(0, 1);
  app.footer(
      "Examples:\n"
      "  xfer-bench                               the main job (same host, child target, shm)\n"
      "  xfer-bench --mem register                the same through cma (registered memory)\n"
      "  xfer-bench write_bw -s 4K:1M --batch 64  one test, local child target\n"
      "  xfer-bench table -D 0.2                  the HIXL-shaped matrix of what this build supports\n"
      "  xfer-bench write_bw --local-mem cuda:0 --remote-mem cuda:0 --verify\n"
      "                                           D2D, GPU to GPU memory of this host (path cuda)\n"
      "  xfer-bench read_bw --local-mem cuda:0 --transport tcp\n"
      "                                           D2H, this side's GPU memory staged (buffer pool)\n"
      "  xfer-bench write_bw --buffer-pool --transport tcp\n"
      "                                           H2H, every byte staged through the buffer pools\n"
      "  xfer-bench serve --listen 0.0.0.0:18515  on the target machine, then on the other:\n"
      "  xfer-bench read_bw -a -b HOST:18515      (the client's options apply to both sides)\n"
      "Units: GB/s = 1e9 B/s. Exit codes: 0 ok, 1 run failed, 2 argument error, 3 --expect-* not met.");
  AddTestOptions(&app, c);

  const std::vector<std::pair<std::string, std::string>> tests = {
      {"write_bw", "WRITE bandwidth and message rate"},
      {"read_bw", "READ bandwidth and message rate"},
      {"write_lat", "WRITE latency of one request, end to end"},
      {"read_lat", "READ latency of one request, end to end"},
      {"table", "WRITE and READ bandwidth: block sizes x (op, transport, direction, direct or "
                "buffer pool), n/a where unsupported (HIXL's table shape). Direction = local 2 "
                "remote memory (H host, D GPU); D direct cells under transport cuda, bufferpool "
                "cells under tcp (staging = always, different host ids)"}};
  std::vector<CLI::App*> test_apps;
  for (const auto& [name, desc] : tests) {
    CLI::App* sub = app.add_subcommand(name, desc);
    AddTestOptions(sub, c);
    sub->add_option("peer", c.peer,
                    "host:port of an `xfer-bench serve`; without it a local target is started");
    test_apps.push_back(sub);
  }
  CLI::App* serve = app.add_subcommand(
      "serve", "Be the target side: wait for clients; each sends its options, gets an engine and a region");
  serve->add_option("--listen", c.listen, "host:port to listen on for clients (port 0: any free port)")
      ->capture_default_str();
  serve->add_option("--host-id", c.host_id, "EngineOptions::host_id of this side");
  serve->add_flag("--once", c.once, "Serve one client, then exit");
  serve->add_option("--ctl-fd", c.ctl_fd, "")->group("");  // hidden: local child mode

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : kExitArgs;
  }

  try {
    if (serve->parsed()) {
      std::string h, p;
      if (c.ctl_fd < 0 && !SplitHostPort(c.listen, &h, &p))
        throw ArgError{"--listen: bad address '" + c.listen + "' (host:port, or [v6]:port)"};
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
