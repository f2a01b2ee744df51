// The client's output: the header, the rows, the path lines, --json and --csv, --expect-*.
#include <fstream>

#include "client.h"

namespace xfer::bench {

std::string Bench::WhereLine() const {
  if (srv_in_process_) return "a target engine in this process";
  if (c_.peer.empty()) return "a local target child process, pid " + std::to_string(target_.pid());
  return "xfer-bench serve at " + c_.peer + " (pid " + std::to_string(srv_pid_) + " on " +
         srv_host_.substr(0, srv_host_.find(',')) + ")";
}

std::string Bench::MemNote() const {
  const bool device = MemOf(c_.local_mem).device || MemOf(c_.remote_mem).device;
  if (c_.mem == "alloc")
    return std::string(
               "--mem alloc: both sides' buffers from Engine::AllocMem (memfd; a same-host "
               "peer maps it: path shm)") +
           (engine_ && !remote_shared_ && !MemOf(c_.remote_mem).device
                ? " (but the peer's region is not shared memory)"
                : "") +
           (device ? "; GPU buffers from Engine::AllocMem(kCuda)" : "");
  return std::string(
             "--mem register: both sides' buffers mmap'd and registered (RegisterMem: the "
             "peer's transport, cma on one host)") +
         (device ? "; GPU buffers cudaMalloc'd and registered (RegisterMem(kCuda))" : "");
}

// The peer line's word on the cuda path, when GPU memory is in play (or the path is up).
std::string Bench::GpuNote() const {
  const bool device = MemOf(c_.local_mem).device || MemOf(c_.remote_mem).device;
  if (peer_info_.Reaches("cuda"))
    return "; cuda: yes (the peer's GPU memory is opened here: CUDA IPC, copy engines)";
  if (!device) return "";
  std::string why = GpuWhy();
  if (why.empty() && !c_.transport.empty() && c_.transport != "cuda")
    why = "forcing transport " + c_.transport + " disables it";
  if (why.empty())
    why =
        "no cuda path to this peer: another host id, or no GPU there; GPU memory then goes "
        "through the buffer pool";
  return "; cuda: no (" + why + ")";
}

std::string Bench::HugeNote() const {
  if (!c_.huge_pages) return "";
  auto got = [](uint64_t kb) { return kb == 0 ? std::string("unknown") : std::to_string(kb) + " kB"; };
  const bool small = local_page_kb_ == 4 || srv_page_kb_ == 4;
  return "; --huge-pages: page size here " + got(local_page_kb_) + ", at the target " + got(srv_page_kb_) +
         (small ? " (4 kB: the kernel had no huge pages to give)" : "");
}

// After a test's rows: which path the bytes took (this side's engine; with -b, the peer's too).
void Bench::PrintPaths(const std::string& test) {
  if (!c_.bidir) {
    std::printf("# path: %s\n", PathText(SumPaths(rows_, test, "", c_.batch)).c_str());
    if (const std::string nics = NicText(rows_, test, ""); !nics.empty())
      std::printf("# nics: %s\n", nics.c_str());
  } else {
    std::printf("# path ->: %s\n", PathText(SumPaths(rows_, test, "->", c_.batch)).c_str());
    std::printf("# path <-: %s\n", PathText(SumPaths(rows_, test, "<-", c_.batch)).c_str());
  }
  std::fflush(stdout);
}

void Bench::PrintHeader(const std::string& transport_note) {
  std::string tests;
  for (auto& t : c_.tests) tests += (tests.empty() ? "" : ", then ") + t;
  std::printf("# xfer-bench %s: %s\n", std::string(xfer::Version()).c_str(), tests.c_str());
  if (!transport_note.empty()) {
    std::printf("# peer:      %s\n", transport_note.c_str());
  } else {
    // Where this run's bytes go, first: host memory from the peer's AllocMem takes shm where it
    // reaches the peer, whatever the transport (which carries the rest).
    const bool over_shm = peer_info_.transport != "shm" && peer_info_.Reaches("shm") && remote_shared_ &&
                          c_.local_mem == "host" && c_.remote_mem == "host" && !c_.buffer_pool;
    std::string shm;
    if (peer_info_.transport != "shm" && !over_shm)
      shm = !c_.transport.empty()       ? "; shm: no (forcing a transport disables it)"
            : peer_info_.Reaches("shm") ? "; shm: for the peer's AllocMem memory (mapped here)"
                                        : "; shm: no (no mapped path to this peer)";
    shm += GpuNote();
    if (c_.bidir)
      shm += "; reverse direction: transport " + rev_transport_ + ", shm " + (rev_shm_ ? "yes" : "no");
    std::printf("# peer:      %s (%s); %stransport %s%s%s%s\n", peer_.c_str(), WhereLine().c_str(),
                over_shm ? "bytes over shm (the peer's AllocMem memory is mapped here); " : "",
                peer_info_.transport.c_str(), c_.transport.empty() ? " (best available)" : " (forced)",
                over_shm ? " for other memory" : "", shm.c_str());
  }
  std::printf("# engine:    streams %s; links %s\n",
              c_.streams ? std::to_string(c_.streams).c_str()
                         : (std::to_string(EngineOptions{}.streams) + " (default)").c_str(),
              LinksNote(c_, transport_note.empty() ? peer_info_.transport : "any").c_str());
  std::string sizes =
      c_.size_arg + " (" + std::to_string(c_.sizes.size()) + (c_.sizes.size() == 1 ? " size)" : " sizes)");
  std::printf("# sizes:     %s; batch %" PRIu64 " descriptor%s per request; depth %" PRIu64
              " request%s in flight per thread; %d thread%s\n",
              sizes.c_str(), c_.batch, c_.batch > 1 ? "s" : "", c_.depth, c_.depth > 1 ? "s" : "", c_.threads,
              c_.threads > 1 ? "s" : "");
  std::printf("# memory:    local %s, remote %s; %s%s; %s%s\n", c_.local_mem.c_str(), c_.remote_mem.c_str(),
              MemNote().c_str(), HugeNote().c_str(),
              c_.buffer_pool ? "--buffer-pool: every transfer staged through the engines' buffer "
                               "pools (EngineOptions::staging = always, both sides)"
                             : "staging auto (the buffer pool only for pairs no path reaches "
                               "directly, e.g. GPU memory to another host)",
              c_.bidir ? "; bidirectional: the peer runs the same test toward this side at the "
                         "same time (rows ->, <- and their sum)"
                       : "");
  if (c_.checksum)
    std::printf("# checksum:  every tcp batch carries its payload's checksum (tcp.checksum)\n");
  char dur[32];
  std::snprintf(dur, sizeof dur, "%g", c_.duration);
  std::string run =
      c_.iters ? std::to_string(c_.iters) + " requests per size" : std::string(dur) + " s per size";
  std::string warm = c_.warmup >= 0
                         ? std::to_string(c_.warmup) + " requests per thread"
                         : "one pass over the buffers (at least 8 requests and 10 ms, at most 1 s)";
  std::printf("# run:       %s; warm-up %s%s\n", run.c_str(), warm.c_str(),
              c_.verify ? "; --verify: data checked after each size (not timed)" : "");
  if (c_.reuse)
    std::printf("# buffers:   --reuse: every request uses the same blocks (%s per side)\n",
                FormatSize(c_.span).c_str());
  else
    std::printf(
        "# buffers:   walk a %s span per side%s (--reuse: one set, as perftest); remote "
        "blocks pair-swapped so none coalesce\n",
        FormatSize(c_.span).c_str(), c_.span >= kDefaultSpan ? ", larger than the CPU caches" : " (--span)");
  if (c_.expect_bw >= 0 || c_.expect_p99 >= 0) {
    std::string ex;
    if (c_.expect_bw >= 0) ex += "BW avg >= " + std::to_string(c_.expect_bw).substr(0, 8) + " GB/s";
    if (c_.expect_p99 >= 0)
      ex += std::string(ex.empty() ? "" : ", ") + "p99 <= " + std::to_string(c_.expect_p99).substr(0, 8) +
            " us";
    std::printf("# expect:    %s at every size (exit %d when not met)\n", ex.c_str(), kExitExpect);
  }
  std::printf("# host:      %s\n", MachineLine().c_str());
  std::printf(
      "# units:     GB/s = 1e9 B/s, Gb/s = 1e9 bit/s; #iters = requests; MsgRate = "
      "descriptors/s; p50..p99.9 = request latency; CPU%% = this process, srv = the "
      "target process (100 = one core); '# path:' = bytes by path (staged = through the "
      "buffer pool, then the route named after via)\n");
  std::printf("# rerun:     %s\n", RerunCommand(argv0_, c_).c_str());
  if (invoked_ != RerunCommand(argv0_, c_)) std::printf("# invoked:   %s\n", invoked_.c_str());
  std::fflush(stdout);
}

void Bench::PrintTableHeader(const std::string& test) {
  std::printf("\n## %s (%s)\n", test.c_str(), OpUpper(TestOp(test)));
  if (c_.bidir) std::printf("%-4s ", "dir");
  if (IsLat(test))
    std::printf("%-10s %10s %11s %11s %11s %11s %11s %11s %11s %7s\n", "#bytes", "#iters", "t_min[us]",
                "t_max[us]", "t_typ[us]", "t_avg[us]", "t_stdev[us]", "99%[us]", "99.9%[us]", "CPU%");
  else
    std::printf("%-10s %10s %13s %13s %14s %14s %10s %10s %11s %7s %7s\n", "#bytes", "#iters", "BW avg[GB/s]",
                "BW avg[Gb/s]", "BW peak[GB/s]", "MsgRate[Mops]", "p50[us]", "p99[us]", "p99.9[us]", "CPU%",
                "srvCPU%");
  std::fflush(stdout);
}

namespace {

// A CPU percentage for a row; "-" when unknown.
std::string Pct(double v) {
  if (v < 0) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.0f", v);
  return b;
}

}  // namespace

void Bench::PrintRow(const Row& r) {
  if (c_.bidir) std::printf("%-4s ", r.dir.c_str());
  if (IsLat(r.test))
    std::printf("%-10" PRIu64 " %10" PRIu64 " %11.2f %11.2f %11.2f %11.2f %11.2f %11.2f %11.2f %7s\n",
                r.bytes, r.requests, r.lat.min, r.lat.max, r.lat.median, r.lat.avg, r.lat.stdev, r.lat.p99,
                r.lat.p999, Pct(r.cpu).c_str());
  else
    std::printf("%-10" PRIu64 " %10" PRIu64 " %13.2f %13.2f %14.2f %14.4f %10.1f %10.1f %11.1f %7s %7s\n",
                r.bytes, r.requests, r.bw_avg, r.bw_avg * 8, r.bw_peak, r.msg_rate, r.lat.p50, r.lat.p99,
                r.lat.p999, Pct(r.cpu).c_str(), Pct(r.srv_cpu).c_str());
  if (!r.verify.empty() && r.verify != "ok")
    std::printf("# verify %s B (%s): %s\n", FormatSize(r.bytes).c_str(), r.dir.empty() ? "" : r.dir.c_str(),
                r.verify.c_str());
  std::fflush(stdout);
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
      std::snprintf(buf, sizeof buf, "--expect-bw %g GB/s not met: %s: BW avg %.2f GB/s", c_.expect_bw,
                    what.c_str(), r.bw_avg);
      missed.push_back(buf);
    }
    if (c_.expect_p99 >= 0 && r.lat.p99 > c_.expect_p99) {
      std::snprintf(buf, sizeof buf, "--expect-p99 %g us not met: %s: p99 %.1f us", c_.expect_p99,
                    what.c_str(), r.lat.p99);
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
  j["xfer_version"] = std::string(xfer::Version());
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
               {"shm", peer_info_.Reaches("shm")},
               {"cuda", peer_info_.Reaches("cuda")},
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
    const std::vector<std::string> dirs =
        c_.bidir ? std::vector<std::string>{"->", "<-"} : std::vector<std::string>{""};
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
      cells.push_back({{"scenario", x.scenario},
                       {"op", x.op},
                       {"bytes", x.bytes},
                       {"transport", x.transport},
                       {"direction", x.direction},
                       {"path", x.path},
                       {"GBps", OptNum(x.gbps)},
                       {"p99_us", OptNum(x.p99)},
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
    f << r.test << ',' << OpUpper(TestOp(r.test)) << ',' << r.dir << ',' << r.bytes << ',' << r.requests
      << ',' << r.descs << ',' << r.seconds << ',' << r.bw_avg << ',' << r.bw_avg * 8 << ',' << r.bw_peak
      << ',' << r.msg_rate << ',' << r.lat.min << ',' << r.lat.max << ',' << r.lat.median << ',' << r.lat.avg
      << ',' << r.lat.stdev << ',' << r.lat.p50 << ',' << r.lat.p99 << ',' << r.lat.p999 << ','
      << (r.cpu >= 0 ? std::to_string(r.cpu) : "") << ',' << (r.srv_cpu >= 0 ? std::to_string(r.srv_cpu) : "")
      << ',' << r.verify << ',' << r.transport << ',' << r.direction << ',' << r.path << ',' << c_.batch
      << ',' << c_.depth << ',' << c_.threads << ',' << (c_.reuse ? "reuse" : "walk") << ',' << c_.mem << ','
      << (r.shm_bytes >= 0 ? std::to_string(r.shm_bytes) : "") << ','
      << (r.transport_bytes >= 0 ? std::to_string(r.transport_bytes) : "") << ','
      << (r.cuda_bytes >= 0 ? std::to_string(r.cuda_bytes) : "") << ','
      << (r.staged_bytes >= 0 ? std::to_string(r.staged_bytes) : "") << '\n';
  }
  return bool(f);
}

}  // namespace xfer::bench
