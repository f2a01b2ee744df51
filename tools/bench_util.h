// Helpers shared by xfer-bench (tools/) and the raw baselines (bench/), so that both measure
// the same block sizes over the same buffer pattern. Header-only, no dependency on the engine.
#pragma once

#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace xfer::bench {

// Default span that the non --reuse pattern walks through: larger than every CPU cache of the
// machines this runs on (this VM: 32 MiB L3), so each block comes from memory, as KV-cache
// traffic does.
inline constexpr uint64_t kDefaultSpan = 256ull << 20;
// A sanity cap on what one side allocates: a quarter of the machine's memory (each run holds
// two or three such spans).
inline uint64_t MaxSpan() { return uint64_t(sysconf(_SC_PHYS_PAGES)) * uint64_t(sysconf(_SC_PAGESIZE)) / 4; }

inline uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

// The clock that timed loops read once a request, in ns (its own epoch: compare only with
// itself). Where the kernel keeps time by the TSC (its clocksource is "tsc": invariant and in
// step on every CPU) and reading it is cheaper than clock_gettime, it reads the TSC, as
// ucx_perftest does, scaled by a 10 ms calibration against CLOCK_MONOTONIC made on first use.
// Elsewhere it is NowNs. (clock_gettime can cost a tenth of a 16 KiB copy: bench/RESULTS.md,
// "How the defaults were chosen".)
class LoopClock {
 public:
  static uint64_t Now() {
    static const LoopClock clock;
    return clock.Read();
  }

 private:
  LoopClock() {
#if defined(__x86_64__)
    char src[32] = {0};
    if (FILE* f = std::fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r")) {
      if (!std::fgets(src, sizeof src, f)) src[0] = 0;
      std::fclose(f);
    }
    if (std::strcmp(src, "tsc\n") != 0) return;
    // Each end of the calibration: a TSC read between two clock reads close together (an
    // interrupt between them would skew every figure of the run), its time their midpoint.
    auto pair = [](uint64_t* ns, uint64_t* tsc) {
      for (int tries = 0; tries < 100; ++tries) {
        const uint64_t before = NowNs(), ticks = __builtin_ia32_rdtsc(), after = NowNs();
        if (after - before <= 2000) {
          *ns = before + (after - before) / 2;
          *tsc = ticks;
          return true;
        }
      }
      return false;
    };
    uint64_t t0 = 0, c0 = 0, t1 = 0, c1 = 0;
    if (!pair(&t0, &c0)) return;
    while (NowNs() - t0 < 10000000ull) {
    }
    if (!pair(&t1, &c1) || c1 <= c0) return;
    // Cheaper? (A hypervisor may trap the instruction.)
    constexpr int kReads = 2000;
    uint64_t sink = 0;
    const uint64_t a = NowNs();
    for (int i = 0; i < kReads; ++i) sink += __builtin_ia32_rdtsc();
    const uint64_t b = NowNs();
    for (int i = 0; i < kReads; ++i) sink += NowNs();
    const uint64_t c = NowNs();
    if (sink == 0 || b - a >= c - b) return;
    base_ns_ = t1;
    base_tsc_ = c1;
    ns_per_tick_ = double(t1 - t0) / double(c1 - c0);
#endif
  }
  uint64_t Read() const {
#if defined(__x86_64__)
    if (ns_per_tick_ > 0) {
      // (A read on another CPU just after the base could precede it by a few ticks.)
      const int64_t ticks = int64_t(__builtin_ia32_rdtsc() - base_tsc_);
      return base_ns_ + uint64_t(std::max<int64_t>(0, int64_t(double(ticks) * ns_per_tick_)));
    }
#endif
    return NowNs();
  }
  [[maybe_unused]] uint64_t base_ns_ = 0, base_tsc_ = 0;  // (read on x86-64 only)
  [[maybe_unused]] double ns_per_tick_ = 0;
};

// CPU time (user + system) of this whole process, all threads, in ns.
inline uint64_t ProcessCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

// CPU time of another process (all its threads) from /proc/<pid>/stat; -1 when unknown.
inline double OtherProcessCpuSeconds(int pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (!f) return -1;
  char buf[1024];
  size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* p = std::strrchr(buf, ')');  // comm may hold spaces
  if (!p) return -1;
  // Fields after ")": state(3) ppid(4) ... utime(14) stime(15).
  unsigned long long utime = 0, stime = 0;
  int field = 2;
  for (const char* q = p + 1; *q; ++q) {
    if (*q == ' ') {
      ++field;
      if (field == 14) utime = std::strtoull(q + 1, nullptr, 10);
      if (field == 15) {
        stime = std::strtoull(q + 1, nullptr, 10);
        break;
      }
    }
  }
  return double(utime + stime) / double(sysconf(_SC_CLK_TCK));
}

// "4096", "16K", "16KB", "16KiB", "8M", "1G" (binary multiples, as perftest). Rejects 0.
inline bool ParseSize(std::string s, uint64_t* out) {
  if (s.empty()) return false;
  size_t i = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
  if (i == 0 || i > 15) return false;
  uint64_t v = std::stoull(s.substr(0, i));
  std::string suf = s.substr(i);
  for (auto& c : suf) c = char(std::toupper(static_cast<unsigned char>(c)));
  uint64_t mul = 1;
  if (suf.empty() || suf == "B")
    mul = 1;
  else if (suf == "K" || suf == "KB" || suf == "KIB")
    mul = 1ull << 10;
  else if (suf == "M" || suf == "MB" || suf == "MIB")
    mul = 1ull << 20;
  else if (suf == "G" || suf == "GB" || suf == "GIB")
    mul = 1ull << 30;
  else
    return false;
  if (v == 0 || v > (UINT64_MAX / mul)) return false;
  *out = v * mul;
  return true;
}

// A comma list of sizes and doubling ranges: "64K", "4K,1M", "16K:8M", "2,16K:64K".
inline bool ParseSizeList(const std::string& s, std::vector<uint64_t>* out, std::string* err) {
  out->clear();
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t colon = item.find(':');
    if (colon == std::string::npos) {
      uint64_t v;
      if (!ParseSize(item, &v)) {
        *err = "bad size '" + item + "' (examples: 4096, 16K, 8M)";
        return false;
      }
      out->push_back(v);
    } else {
      uint64_t a, b;
      if (!ParseSize(item.substr(0, colon), &a) || !ParseSize(item.substr(colon + 1), &b) || a > b) {
        *err = "bad size range '" + item + "' (example: 16K:8M, doubling from the first to the last)";
        return false;
      }
      for (uint64_t v = a; v <= b; v *= 2) {
        out->push_back(v);
        if (v > UINT64_MAX / 2) break;
      }
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (out->empty()) {
    *err = "empty size list";
    return false;
  }
  return true;
}

// 16384 -> "16K", 8388608 -> "8M", 1000 -> "1000".
inline std::string FormatSize(uint64_t v) {
  if (v >= (1ull << 30) && v % (1ull << 30) == 0) return std::to_string(v >> 30) + "G";
  if (v >= (1ull << 20) && v % (1ull << 20) == 0) return std::to_string(v >> 20) + "M";
  if (v >= (1ull << 10) && v % (1ull << 10) == 0) return std::to_string(v >> 10) + "K";
  return std::to_string(v);
}

// The buffer pattern. A request carries `batch` blocks of `block` bytes.
//  - reuse: every request uses the same blocks: local slots 0..batch-1 (as perftest and
//    ucx_perftest do: the data stays in the caches once it fits).
//  - walk (default): descriptor g (counted over the whole run) uses local slot g % slots, so
//    the run walks the span block by block and wraps around.
// In both, the remote slot of local slot s is s with its lowest bit flipped (pairs swapped), so
// no two descriptors of a request are adjacent on both sides: an engine cannot coalesce them
// into one large copy, and batches measure per-descriptor cost, not coalescing. Locality stays
// the same as a sequential walk.
struct Layout {
  uint64_t block = 0;
  uint64_t batch = 1;
  bool reuse = false;
  uint64_t local_slots = 0;   // blocks that fit the local span
  uint64_t remote_slots = 0;  // blocks that fit the remote span

  static uint64_t Swap(uint64_t s, uint64_t slots) {
    uint64_t t = s ^ 1;
    return t < slots ? t : s;
  }
  uint64_t LocalSlot(uint64_t req, uint64_t j) const { return reuse ? j : (req * batch + j) % local_slots; }
  uint64_t LocalOff(uint64_t req, uint64_t j) const { return LocalSlot(req, j) * block; }
  uint64_t RemoteSlot(uint64_t req, uint64_t j) const {
    uint64_t g = reuse ? j : (req * batch + j);
    return Swap(g % remote_slots, remote_slots);
  }
  uint64_t RemoteOff(uint64_t req, uint64_t j) const { return RemoteSlot(req, j) * block; }
  // Requests that make one full pass over the span (1 for reuse).
  uint64_t RequestsPerPass() const {
    if (reuse) return 1;
    return std::max<uint64_t>(1, (local_slots + batch - 1) / batch);
  }
};

// The bytes one side must allocate for a run of these sizes: the reused set is one request;
// the walk covers walk_span, and at least every in-flight request's own blocks.
inline uint64_t SpanFor(const std::vector<uint64_t>& sizes, uint64_t batch, uint64_t depth, bool reuse,
                        uint64_t walk_span) {
  uint64_t need = 0;
  for (uint64_t b : sizes) {
    uint64_t slots = reuse ? batch : std::max<uint64_t>(walk_span / b, batch * std::max<uint64_t>(1, depth));
    need = std::max(need, slots * b);
  }
  return need;
}

inline uint64_t PageRound(uint64_t n) {
  uint64_t p = uint64_t(sysconf(_SC_PAGESIZE));
  return (n + p - 1) / p * p;
}

// Anonymous private memory, every page touched (faulted in) with a fixed byte pattern, so the
// first timed access pays no page fault. No huge-page advice: both the baselines and the engine
// benchmark get the kernel's default for plain mmap.
class Span {
 public:
  Span() = default;
  explicit Span(uint64_t len) { Allocate(len); }
  ~Span() { Release(); }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

  bool Allocate(uint64_t len) {
    Release();
    len_ = PageRound(std::max<uint64_t>(len, 1));
    void* p = mmap(nullptr, len_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      p_ = nullptr;
      len_ = 0;
      return false;
    }
    p_ = static_cast<uint8_t*>(p);
    std::memset(p_, 0x5a, len_);
    return true;
  }
  void Release() {
    if (p_) munmap(p_, len_);
    p_ = nullptr;
    len_ = 0;
  }
  uint8_t* data() const { return p_; }
  uint64_t size() const { return len_; }
  uint64_t addr() const { return reinterpret_cast<uint64_t>(p_); }

 private:
  uint8_t* p_ = nullptr;
  uint64_t len_ = 0;
};

// Deterministic fill for --verify.
inline void FillPattern(uint8_t* p, uint64_t len, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  uint64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(p + i, &x, 8);
  }
  for (; i < len; ++i) p[i] = uint8_t(x >> (8 * (i & 7)));
}

inline std::string ShellQuote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789-_./:=,@%+") == std::string::npos)
    return s;
  std::string r = "'";
  for (char c : s) {
    if (c == '\'')
      r += "'\\''";
    else
      r += c;
  }
  return r + "'";
}

inline std::string JoinArgv(int argc, char** argv) {
  std::string r;
  for (int i = 0; i < argc; ++i) {
    if (i) r += ' ';
    r += ShellQuote(argv[i]);
  }
  return r;
}

// Sorted-sample statistics (all samples kept, as perftest computes them).
struct LatStats {
  uint64_t n = 0;
  double min = 0, max = 0, median = 0, avg = 0, stdev = 0, p50 = 0, p99 = 0, p999 = 0;
};

// samples in ns; results in us. Sorts the vector.
inline LatStats ComputeLatStats(std::vector<uint64_t>& samples) {
  LatStats s;
  s.n = samples.size();
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  auto at = [&](double q) {
    size_t idx = size_t(std::ceil(q * double(samples.size())));
    if (idx > 0) --idx;
    if (idx >= samples.size()) idx = samples.size() - 1;
    return double(samples[idx]) / 1e3;
  };
  s.min = double(samples.front()) / 1e3;
  s.max = double(samples.back()) / 1e3;
  s.median = at(0.5);
  s.p50 = s.median;
  s.p99 = at(0.99);
  s.p999 = at(0.999);
  long double sum = 0, sq = 0;
  for (uint64_t v : samples) sum += v;
  double mean = double(sum / samples.size());
  for (uint64_t v : samples) sq += (double(v) - mean) * (double(v) - mean);
  s.avg = mean / 1e3;
  s.stdev = std::sqrt(double(sq / samples.size())) / 1e3;
  return s;
}

}  // namespace xfer::bench
