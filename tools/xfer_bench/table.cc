#include "client.h"

namespace xfer::bench {
namespace {

// Memory kinds of the table's directions: H = host, D = device (cuda); the first letter is the
// initiator's (local) memory, the second the target's (remote) region, for WRITE and READ alike.
const std::vector<std::string> kDirections = {"D2D", "H2D", "D2H", "H2H"};
const std::vector<std::string> kPaths = {"direct", "bufferpool"};

}  // namespace

// The HIXL-shaped matrix: every (op, block, transport, direction, path); measured where this
// build and machine can, "n/a" with a footnote elsewhere. How a cell is measured:
//   direction  local (initiator) memory 2 remote (target) memory, for READ as for WRITE: H host,
//              D GPU. (HIXL's table reads so: its HCCS D2H cells are empty for both ops.)
//   direct     the transport column forced between this side and the target (a local child:
//              one host id). GPU memory is direct only under transport "cuda" (CUDA IPC and the
//              copy engines: D2D, H2D, D2H); the other transports' D cells and cuda's H2H are n/a.
//   bufferpool measured under transport "tcp" only: EngineOptions::staging = Staging::kAlways on both
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

  std::printf("# xfer-bench %s: table (shape of bench/reference/hixl_a3_bandwidth.tsv)\n",
              std::string(xfer::Version()).c_str());
  std::printf("# %s; sizes %s; ",
              c_.peer.empty() ? "target: a local child process (local: a "
                                "target engine in this process)"
                              : ("target: xfer-bench serve at " + c_.peer).c_str(),
              c_.size_arg.c_str());
  char dur[32];
  std::snprintf(dur, sizeof dur, "%g", c_.duration);
  std::printf("%s per cell; batch %" PRIu64 "; depth %" PRIu64 "; %d thread%s; %s\n",
              c_.iters ? (std::to_string(c_.iters) + " requests").c_str() : (std::string(dur) + " s").c_str(),
              c_.batch, c_.depth, c_.threads, c_.threads > 1 ? "s" : "",
              c_.reuse ? "--reuse" : ("walking a " + FormatSize(c_.span) + " span per side").c_str());
  std::printf("# links %s\n", LinksNote(c_, "any").c_str());
  std::printf("# memory: %s\n", MemNote().c_str());
  std::printf(
      "# direction = local (initiator) memory 2 remote (target) memory, H host, D GPU, for "
      "READ as for WRITE (as HIXL's table reads); WRITE moves local to remote, READ "
      "remote to local\n");
  std::printf(
      "# direct: the transport forced between the two engines%s; D cells only under "
      "transport cuda (CUDA IPC + copy engines)\n",
      c_.peer.empty() ? " (one host id)" : "");
  std::printf(
      "# bufferpool: under transport tcp only: EngineOptions::staging = always on both "
      "engines%s; every byte through pinned staging buffers, then tcp\n",
      c_.peer.empty() ? (", the target on host id " + pool_target_id + " (no same-host path)").c_str() : "");
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
                        : t + ": the table's GPU cells are cuda (one host) and the buffer pool (the tcp "
                              "bufferpool cells)";
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
    if (err.empty() && g.t == "cuda" && peer_info_.transport != "cuda" && !peer_info_.Reaches("cuda"))
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
          std::printf("%s\t%s\t%s\t%s\t%s\t%s\t%.3f\t\n", scenario.c_str(), op.c_str(), FormatSize(b).c_str(),
                      g.t.c_str(), g.d.c_str(), g.p.c_str(), cell.gbps);
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
  std::printf("#\n# measured (GB/s; op/transport[/direction][/pool], H2H direct unless named):\n# %-8s",
              "block");
  for (auto& col : cols) std::printf(" %*s", int(std::max<size_t>(12, col.label.size())), col.label.c_str());
  std::printf("\n");
  for (uint64_t b : c_.sizes) {
    std::printf("# %-8s", FormatSize(b).c_str());
    for (auto& col : cols) {
      double v = -1;
      for (const auto& [test, row] : col.g->rows)
        if (test == col.op + "_bw" && row.bytes == b) v = row.bw_avg;
      const int w = int(std::max<size_t>(12, col.label.size()));
      if (v >= 0)
        std::printf(" %*.2f", w, v);
      else
        std::printf(" %*s", w, "n/a");
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

}  // namespace xfer::bench
