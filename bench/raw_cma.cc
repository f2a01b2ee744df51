// raw_cma: the baseline xfer's cma transport is judged against. Two processes (fork): the parent
// moves blocks into / out of the child's memory with a raw loop of process_vm_writev /
// process_vm_readv, one call per block; optionally batches of N blocks per call (iovec arrays of
// up to 1024 entries); and a plain memcpy column in one process. Same block sizes and buffer
// pattern (--reuse, or walking a span larger than the caches) as xfer-bench: see
// tools/bench_util.h.
//
//   raw_cma [-s 16K:8M] [-a] [-D 1] [-n N] [--reuse] [--span 256M] [--batch N] [--op both]
//           [--no-memcpy] [--json FILE]
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "bench_util.h"

namespace {

using namespace xfer::bench;

struct Config {
  std::vector<uint64_t> sizes;
  std::string size_arg = "16K:8M";
  double duration = 1.0;
  uint64_t iters = 0;  // requests per cell; 0 = use duration
  bool reuse = false;
  uint64_t span = kDefaultSpan;
  uint64_t batch = 1;
  uint64_t iov_max = IOV_MAX;
  bool do_write = true, do_read = true, do_memcpy = true;
  std::string json;
};

struct Cell {
  std::string name;  // memcpy, write, read, write_bN, read_bN
  std::string op;    // memcpy, write, read
  uint64_t block = 0, batch = 1;
  uint64_t requests = 0, calls = 0;
  double seconds = 0;
  double gbps = 0;
  double cpu_pct = 0;  // CPU of this process over the timed loop (100 = one core)
};

[[noreturn]] void Usage(const char* msg) {
  std::fprintf(stderr,
               "raw_cma: %s\n"
               "usage: raw_cma [-s|--size LIST] [-a|--all] [-D|--duration SEC] [-n|--iters N]\n"
               "               [--reuse] [--span BYTES] [--batch N] [--iov-max N]\n"
               "               [--op write|read|both] [--no-memcpy] [--json FILE]\n"
               "  LIST: sizes and doubling ranges, e.g. 64K, 4K,1M, 16K:8M (default 16K:8M)\n",
               msg);
  std::exit(2);
}

struct Target {
  pid_t pid = -1;
  uint64_t addr = 0;
  uint64_t len = 0;
  int ctl = -1;  // closing it tells the child to exit
};

// The child: allocates and touches its span, reports the address, waits for EOF on ctl.
Target StartTarget(uint64_t len) {
  int ready[2], ctl[2];
  if (pipe(ready) != 0 || pipe(ctl) != 0) {
    std::perror("raw_cma: pipe");
    std::exit(1);
  }
  pid_t pid = fork();
  if (pid < 0) {
    std::perror("raw_cma: fork");
    std::exit(1);
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(ready[0]);
    close(ctl[1]);
    Span span;
    uint64_t msg[2] = {0, 0};
    if (span.Allocate(len)) {
      msg[0] = span.addr();
      msg[1] = span.size();
    }
    if (write(ready[1], msg, sizeof msg) != sizeof msg) _exit(1);
    close(ready[1]);
    char c;
    while (read(ctl[0], &c, 1) != 0) {
      if (errno != EINTR) break;
    }
    _exit(0);
  }
  close(ready[1]);
  close(ctl[0]);
  uint64_t msg[2] = {0, 0};
  if (read(ready[0], msg, sizeof msg) != sizeof msg || msg[0] == 0) {
    std::fprintf(stderr, "raw_cma: the target process could not allocate %llu bytes\n",
                 (unsigned long long)len);
    std::exit(1);
  }
  close(ready[0]);
  Target t;
  t.pid = pid;
  t.addr = msg[0];
  t.len = msg[1];
  t.ctl = ctl[1];
  return t;
}

void StopTarget(Target& t) {
  if (t.pid <= 0) return;
  close(t.ctl);
  int st;
  waitpid(t.pid, &st, 0);
  t.pid = -1;
}

// Moves one request: `batch` blocks, in calls of up to iov_max iovecs. Returns the calls made.
uint64_t MoveRequest(bool write_op, pid_t pid, uint8_t* local, uint64_t remote, const Layout& lay,
                     uint64_t req, uint64_t iov_max, std::vector<iovec>& liov, std::vector<iovec>& riov) {
  uint64_t calls = 0;
  for (uint64_t j0 = 0; j0 < lay.batch; j0 += iov_max) {
    uint64_t n = std::min(iov_max, lay.batch - j0);
    liov.resize(n);
    riov.resize(n);
    for (uint64_t k = 0; k < n; ++k) {
      liov[k].iov_base = local + lay.LocalOff(req, j0 + k);
      liov[k].iov_len = lay.block;
      riov[k].iov_base = reinterpret_cast<void*>(remote + lay.RemoteOff(req, j0 + k));
      riov[k].iov_len = lay.block;
    }
    ssize_t want = ssize_t(n * lay.block);
    ssize_t got = write_op ? process_vm_writev(pid, liov.data(), n, riov.data(), n, 0)
                           : process_vm_readv(pid, liov.data(), n, riov.data(), n, 0);
    ++calls;
    if (got != want) {
      int e = errno;
      if (got < 0) {
        std::fprintf(stderr, "raw_cma: %s: %s%s\n", write_op ? "process_vm_writev" : "process_vm_readv",
                     std::strerror(e),
                     e == EPERM ? " (ptrace not permitted: see kernel.yama.ptrace_scope)" : "");
      } else {
        std::fprintf(stderr, "raw_cma: short transfer: %zd of %zd bytes\n", got, want);
      }
      std::exit(1);
    }
  }
  return calls;
}

// Runs one cell: warm-up (one pass over the span, at least 8 requests, at most 0.5 s), then
// the timed loop for the duration or the given number of requests.
Cell RunCell(const Config& cfg, const std::string& op, uint64_t block, uint64_t batch, const Target& t,
             Span& local, Span& local2) {
  Layout lay;
  lay.block = block;
  lay.batch = batch;
  lay.reuse = cfg.reuse;
  lay.local_slots = local.size() / block;
  lay.remote_slots = (op == "memcpy" ? local2.size() : t.len) / block;
  std::vector<iovec> liov, riov;
  liov.reserve(cfg.iov_max);
  riov.reserve(cfg.iov_max);
  const bool is_memcpy = op == "memcpy";
  const bool w = op == "write";
  uint64_t req = 0, calls = 0;
  auto one = [&](uint64_t r) {
    if (is_memcpy) {
      for (uint64_t j = 0; j < batch; ++j)
        std::memcpy(local2.data() + lay.RemoteOff(r, j), local.data() + lay.LocalOff(r, j), block);
      return uint64_t(batch);
    }
    return MoveRequest(w, t.pid, local.data(), t.addr, lay, r, cfg.iov_max, liov, riov);
  };
  uint64_t warm = std::max<uint64_t>(8, lay.RequestsPerPass());
  uint64_t t0 = LoopClock::Now();  // (its first read calibrates it: not in the timed CPU)
  for (uint64_t i = 0; i < warm && LoopClock::Now() - t0 < 500000000ull; ++i) one(req++);

  uint64_t dur_ns = uint64_t(cfg.duration * 1e9);
  uint64_t cpu0 = ProcessCpuNs();
  uint64_t start = LoopClock::Now(), now = start, n = 0;  // (xfer-bench's clock)
  for (;;) {
    calls += one(req++);
    ++n;
    now = LoopClock::Now();
    if (cfg.iters ? n >= cfg.iters : now - start >= dur_ns) break;
  }
  Cell c;
  c.op = op;
  c.block = block;
  c.batch = batch;
  c.name = batch > 1 ? op + "_b" + std::to_string(batch) : op;
  c.requests = n;
  c.calls = calls;
  c.seconds = double(now - start) / 1e9;
  c.gbps = double(n) * double(batch) * double(block) / c.seconds / 1e9;
  c.cpu_pct = double(ProcessCpuNs() - cpu0) / double(now - start) * 100;
  return c;
}

std::string Hostname() {
  char h[256] = {0};
  gethostname(h, sizeof h - 1);
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  enum { kReuse = 256, kSpan, kBatch, kIovMax, kOp, kNoMemcpy, kJson, kPrintSizes };
  static const option longopts[] = {{"size", required_argument, nullptr, 's'},
                                    {"all", no_argument, nullptr, 'a'},
                                    {"duration", required_argument, nullptr, 'D'},
                                    {"iters", required_argument, nullptr, 'n'},
                                    {"reuse", no_argument, nullptr, kReuse},
                                    {"span", required_argument, nullptr, kSpan},
                                    {"batch", required_argument, nullptr, kBatch},
                                    {"iov-max", required_argument, nullptr, kIovMax},
                                    {"op", required_argument, nullptr, kOp},
                                    {"no-memcpy", no_argument, nullptr, kNoMemcpy},
                                    {"json", required_argument, nullptr, kJson},
                                    {"help", no_argument, nullptr, 'h'},
                                    {"print-sizes", no_argument, nullptr, kPrintSizes},
                                    {nullptr, 0, nullptr, 0}};
  opterr = 0;
  bool print_sizes = false;
  int c;
  while ((c = getopt_long(argc, argv, ":s:aD:n:h", longopts, nullptr)) != -1) {
    std::string arg = optarg ? optarg : "";
    switch (c) {
      case 's':
        cfg.size_arg = arg;
        break;
      case 'a':
        cfg.size_arg = "2:8M";
        break;
      case 'D': {
        char* end;
        cfg.duration = std::strtod(arg.c_str(), &end);
        if (*end || !(cfg.duration > 0) || cfg.duration > 3600) Usage("--duration: seconds in (0, 3600]");
        break;
      }
      case 'n': {
        char* end;
        cfg.iters = std::strtoull(arg.c_str(), &end, 10);
        if (*end || cfg.iters == 0) Usage("--iters: a positive count");
        break;
      }
      case kReuse:
        cfg.reuse = true;
        break;
      case kSpan:
        if (!ParseSize(arg, &cfg.span)) Usage("--span: a size such as 256M");
        break;
      case kBatch: {
        char* end;
        cfg.batch = std::strtoull(arg.c_str(), &end, 10);
        if (*end || cfg.batch == 0 || cfg.batch > 1000000) Usage("--batch: 1..1000000 blocks per request");
        break;
      }
      case kIovMax: {
        char* end;
        cfg.iov_max = std::strtoull(arg.c_str(), &end, 10);
        if (*end || cfg.iov_max == 0 || cfg.iov_max > IOV_MAX) Usage("--iov-max: 1..1024");
        break;
      }
      case kOp:
        if (arg == "write")
          cfg.do_read = false;
        else if (arg == "read")
          cfg.do_write = false;
        else if (arg != "both")
          Usage("--op: write, read or both");
        break;
      case kNoMemcpy:
        cfg.do_memcpy = false;
        break;
      case kJson:
        cfg.json = arg;
        break;
      case kPrintSizes:
        print_sizes = true;
        break;
      case 'h':
        std::printf(
            "raw_cma: raw process_vm_writev/readv loop between two processes, the baseline for "
            "xfer's cma transport\n"
            "  -s, --size LIST     block sizes: 64K | 4K,1M | 16K:8M (doubling); default 16K:8M\n"
            "  -a, --all           2 B .. 8 MiB, doubling\n"
            "  -D, --duration SEC  timed seconds per cell (default 1)\n"
            "  -n, --iters N       requests per cell instead of a duration\n"
            "      --reuse         every request uses the same buffers (default: walk the span)\n"
            "      --span BYTES    span walked without --reuse (default 256M)\n"
            "      --batch N       also measure N blocks per request, iovec arrays of up to\n"
            "                      --iov-max (1024) per call\n"
            "      --op OP         write, read or both (default both)\n"
            "      --no-memcpy     skip the memcpy column\n"
            "      --json FILE     also write every cell as JSON\n"
            "      --print-sizes   print the block sizes of --size, one a line, and exit\n");
        return 0;
      case ':':
        Usage((std::string("option needs a value: ") + argv[optind - 1]).c_str());
      default:
        Usage((std::string("unknown option: ") + argv[optind - 1]).c_str());
    }
  }
  if (optind < argc) Usage((std::string("unexpected argument: ") + argv[optind]).c_str());
  std::string err;
  if (!ParseSizeList(cfg.size_arg, &cfg.sizes, &err)) Usage(err.c_str());
  if (print_sizes) {
    for (uint64_t b : cfg.sizes) std::printf("%llu\n", (unsigned long long)b);
    return 0;
  }
  uint64_t span = SpanFor(cfg.sizes, cfg.batch, 1, cfg.reuse, cfg.span);
  if (span > MaxSpan())
    Usage(("each side would need " + FormatSize(span) +
           " (largest size x --batch), over a quarter "
           "of this machine's memory: lower --size or --batch")
              .c_str());

  // Fork first: buffers allocated before it would be copy-on-write shared with the child, and
  // the timed writes would pay the copy faults.
  Target t = StartTarget(span);
  Span local(span), local2;
  if (!local.data()) {
    std::fprintf(stderr, "raw_cma: cannot allocate %llu bytes\n", (unsigned long long)span);
    return 1;
  }
  if (cfg.do_memcpy && !local2.Allocate(span)) {
    std::fprintf(stderr, "raw_cma: cannot allocate %llu bytes\n", (unsigned long long)span);
    return 1;
  }

  std::vector<std::string> cols;
  if (cfg.do_memcpy) cols.push_back("memcpy");
  if (cfg.do_write) cols.push_back("write");
  if (cfg.do_read) cols.push_back("read");
  if (cfg.batch > 1) {
    if (cfg.do_write) cols.push_back("write_b" + std::to_string(cfg.batch));
    if (cfg.do_read) cols.push_back("read_b" + std::to_string(cfg.batch));
  }

  std::printf(
      "# raw_cma: process_vm_writev/readv from this process into a forked child, one "
      "call per block%s\n",
      cfg.batch > 1 ? "; _bN columns: N blocks per request, up to 1024 iovecs per call" : "");
  std::printf("# pattern: %s\n", cfg.reuse ? "reuse (every request uses the same buffers)"
                                           : ("walk a " + FormatSize(span) +
                                              " span per side (larger than the CPU "
                                              "caches), remote slots pair-swapped")
                                                 .c_str());
  char dur[48];
  if (cfg.iters)
    std::snprintf(dur, sizeof dur, "%llu requests", (unsigned long long)cfg.iters);
  else
    std::snprintf(dur, sizeof dur, "%g s", cfg.duration);
  std::printf("# %s per cell; GB/s = 1e9 B/s; host %s, %ld CPUs\n", dur, Hostname().c_str(),
              sysconf(_SC_NPROCESSORS_ONLN));
  std::printf("# command: %s\n", JoinArgv(argc, argv).c_str());
  std::printf("%-10s", "#bytes");
  for (auto& col : cols) std::printf(" %14s", (col + "[GB/s]").c_str());
  std::printf("\n");
  std::fflush(stdout);

  std::vector<Cell> cells;
  for (uint64_t b : cfg.sizes) {
    std::printf("%-10llu", (unsigned long long)b);
    for (auto& col : cols) {
      bool batched = col.find("_b") != std::string::npos;
      std::string op = batched ? col.substr(0, col.find("_b")) : col;
      Cell cell = RunCell(cfg, op, b, batched ? cfg.batch : 1, t, local, local2);
      std::printf(" %14.2f", cell.gbps);
      std::fflush(stdout);
      cells.push_back(cell);
    }
    std::printf("\n");
  }
  StopTarget(t);

  if (!cfg.json.empty()) {
    std::ofstream f(cfg.json);
    if (!f) {
      std::fprintf(stderr, "raw_cma: cannot write %s\n", cfg.json.c_str());
      return 1;
    }
    f << "{\n  \"schema\": \"xfer-raw-cma\",\n  \"version\": 1,\n";
    f << "  \"config\": {\"pattern\": \"" << (cfg.reuse ? "reuse" : "walk") << "\", \"span\": " << span
      << ", \"duration_s\": " << cfg.duration << ", \"iters\": " << cfg.iters << ", \"batch\": " << cfg.batch
      << ", \"iov_max\": " << cfg.iov_max << "},\n  \"rows\": [\n";
    for (size_t i = 0; i < cells.size(); ++i) {
      const Cell& x = cells[i];
      f << "    {\"name\": \"" << x.name << "\", \"op\": \"" << x.op << "\", \"bytes\": " << x.block
        << ", \"batch\": " << x.batch << ", \"requests\": " << x.requests << ", \"calls\": " << x.calls
        << ", \"seconds\": " << x.seconds << ", \"bw_gbps\": " << x.gbps << ", \"cpu_pct\": " << x.cpu_pct
        << "}" << (i + 1 < cells.size() ? "," : "") << "\n";
    }
    f << "  ]\n}\n";
  }
  return 0;
}
