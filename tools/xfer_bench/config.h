// The run's configuration: as the command line gave it, resolved and checked, and as it travels
// to the target.
#pragma once

#include "common.h"

namespace xfer::bench {

struct Config {
  // Tests to run, in order: "write_bw", "read_bw", "write_lat", "read_lat", or "table".
  std::vector<std::string> tests;
  bool main_job = false;  // no subcommand: write_bw then read_bw

  std::string size_arg = "16K:8M";
  bool all = false;
  std::vector<uint64_t> sizes;
  uint64_t iters = 0;     // requests per size (all threads together); 0 = use the duration
  double duration = 1.0;  // seconds per size
  int64_t warmup = -1;    // requests per thread; -1 = one pass over the span (>= 8 and 10 ms, <= 1 s)
  uint64_t batch = 1;     // descriptors per request
  uint64_t depth = 1;     // requests in flight, per thread
  int threads = 1;        // client threads issuing requests concurrently
  int links = 0;          // 0 = the transport's default
  int streams = 0;        // 0 = the engine's default
  std::string slice_arg, batch_bytes_arg;  // EngineOptions::slice_bytes / batch_bytes
  uint64_t slice_bytes = 0, batch_bytes = 0;
  int64_t spin_us = -1;   // EngineOptions::spin; -1 = the engine's default
  std::string transport;  // empty = the best both sides offer
  // "host" or "cuda:N": this side's buffers (and a bidirectional peer's), the target's region
  // (and this side's, bidirectional).
  std::string local_mem = "host", remote_mem = "host";
  // How both sides get their buffers: "alloc" = Engine::AllocMem (a memfd that a same-host peer
  // maps: path shm), "register" = mmap'd memory + RegisterMem (same host: cma).
  std::string mem = "alloc";
  bool huge_pages = false;  // AllocOptions::huge_pages (alloc only)
  bool notify = false;      // every request carries a notification (TransferOptions::notify)
  bool checksum = false;    // EngineOptions::tcp.checksum on both sides
  std::string nics;         // EngineOptions::tcp.nics of this side, comma-separated
  // --set KEY=VALUE: any engine option by name (xfer::SetOption), both sides, after the named
  // flags above.
  std::vector<std::string> set;
  bool buffer_pool = false;       // EngineOptions::staging = Staging::kAlways on both sides
  int staging_buffers = 0;        // EngineOptions::staging_buffers; 0 = the engine's default
  std::string staging_bytes_arg;  // EngineOptions::staging_buffer_bytes as typed
  uint64_t staging_bytes = 0;     // 0 = the engine's default
  bool bidir = false;
  bool reuse = false;
  bool prepared = false;  // requests by index over prepared lists (Engine::PrepareLocalList...)
  uint64_t walk_span = kDefaultSpan;
  std::string span_arg;  // --span as typed
  bool verify = false;
  double expect_bw = -1;   // GB/s, every bandwidth row
  double expect_p99 = -1;  // us, every row
  std::string json_file, csv_file;
  std::string peer;            // host:port of a serve; empty = local target
  std::string local_name;      // the client engine's name (host alone: client-only)
  std::string host_id;         // EngineOptions::host_id of this side
  std::string metadata;        // etcd://...: peer may be a cluster name (serve: announced as cluster_name)
  std::string cluster_name;    // serve --name
  std::string secret_file;     // EngineOptions::secret_file of this side (never sent to the peer)
  std::string metrics_listen;  // EngineOptions::metrics_listen of this side (never sent)
  bool no_metrics = false;     // EngineOptions::metrics = false on both sides
  double connect_timeout = 30;

  // serve
  std::string listen = kDefaultListen;
  int ctl_fd = -1;    // hidden: serve one client on this fd (a local child), then exit
  bool once = false;  // serve one client, then exit

  uint64_t span = 0;  // resolved bytes per side
};

inline bool IsLat(const std::string& t) { return t.size() > 4 && t.substr(t.size() - 4) == "_lat"; }
inline Op TestOp(const std::string& t) { return t.rfind("write", 0) == 0 ? Op::kWrite : Op::kRead; }
inline const char* OpUpper(Op op) { return op == Op::kWrite ? "WRITE" : "READ"; }

// A --local-mem / --remote-mem value: "host", or "cuda:N" (GPU N).
struct MemSpec {
  bool device = false;
  int32_t gpu = -1;
};

// Parses "host" or "cuda:N". Returns an error for the user, empty when well-formed.
std::string ParseMem(const std::string& opt, const std::string& v, MemSpec* out);
MemSpec MemOf(const std::string& v);
// Why GPU memory cannot be used by this process: "" when it can, else "no GPU: <why>" or "not
// built with CUDA (...)".
std::string GpuWhy();
// "H2D": this side's memory, then the target's (H host, D GPU).
std::string DirectionOf(const Config& c);
// Checks and completes c (sizes, spans, memory kinds against the transport); throws ArgError.
void Resolve(Config& c);
// The options that travel to the target (everything that shapes the run).
json ConfigToJson(const Config& c);
void ConfigFromJson(const json& j, Config* c);
// The command that reproduces this run with every setting spelled out.
std::string RerunCommand(const std::string& argv0, const Config& c);

}  // namespace xfer::bench
