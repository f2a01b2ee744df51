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
// --buffer-pool sets EngineOptions::staging = Staging::kAlways on both sides: every transfer is staged,
// host memory standing in for GPU memory. --verify fills and checks GPU buffers through
// cuda::Copy. Without a usable GPU (or a build without CUDA), cuda:N is refused with the reason.
//
// Buffer pattern, block layout and statistics come from bench_util.h, shared with the raw
// baselines in bench/, so that both measure the same thing.
#include <signal.h>
#include <cstdlib>

#include <CLI/CLI.hpp>

#include "client.h"
#include "cluster.h"
#include "serve.h"
#include "system.h"

namespace xfer::bench {
namespace {

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
                  "Warm-up requests per size and thread (default: one pass over the buffers, >= 8 and >= 10 "
                  "ms, <= 1 s)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--batch", c.batch, "Descriptors per request")
      ->check(CLI::Range(uint64_t(1), uint64_t(1000000)))
      ->capture_default_str();
  app->add_option("--depth", c.depth, "Requests in flight per thread (TransferAsync); latency tests use 1")
      ->check(CLI::Range(uint64_t(1), uint64_t(1024)))
      ->capture_default_str();
  app->add_option("--threads", c.threads,
                  "Client threads issuing requests concurrently, each with its own --depth")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app->add_option("--links", c.links,
                  "Connections per peer for transports that have them (reported n/a for the others)")
      ->check(CLI::Range(1, 64));
  app->add_option("--streams", c.streams, "Engine data streams (worker threads); default: the engine's")
      ->check(CLI::Range(1, 64));
  app->add_option("--slice-bytes", c.slice_arg, "EngineOptions::slice_bytes: longer descriptors are cut")
      ->type_name("BYTES");
  app->add_option("--batch-bytes", c.batch_bytes_arg,
                  "EngineOptions::batch_bytes: bytes per batch / system call")
      ->type_name("BYTES");
  app->add_option("--spin", c.spin_us,
                  "EngineOptions::spin in us: how long waiters, idle streams and a busy control thread spin "
                  "before they sleep")
      ->check(CLI::Range(int64_t(0), int64_t(1000000)));
  app->add_option(
         "--nics", c.nics,
         "EngineOptions::tcp.nics of this side: the network interfaces (names, local "
         "IPv4 addresses or near:BUS_ID, comma-separated) its tcp data connections use; a target serves "
         "on each, an initiator connects from each (default: the one route the kernel picks)")
      ->type_name("LIST");
  app->add_option("--set", c.set,
                  "Any engine option by name, both sides (repeatable; after the flags above): "
                  "--set tcp.links=4 --set notify.ring_bytes=0 (docs/options.md; xfer-info lists them)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false)  // (one value each time: a peer after it is the peer)
      ->check([](const std::string& kv) { return SetOptionArg(kv); });
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
  app->add_flag("--notify", c.notify,
                "Every request carries a notification (TransferOptions::notify, 16 bytes): it "
                "completes once the target has queued it; the target drains its queue");
  app->add_flag("--no-metrics", c.no_metrics,
                "Engines count nothing on the data path (EngineOptions::metrics = false, both "
                "sides): to measure what counting costs");
  app->add_option("--metrics", c.metrics_listen,
                  "Serve this side's engine's metrics at http://ADDR/metrics (EngineOptions::"
                  "metrics_listen; Prometheus text format) while it runs")
      ->type_name("HOST:PORT");
  app->add_flag("--checksum", c.checksum,
                "Every tcp batch carries a checksum of its payload, checked by the side that "
                "receives it (EngineOptions::tcp.checksum, both sides)");
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
  app->add_flag("--prepared", c.prepared,
                "Requests by index over prepared lists of every block (Engine::PrepareLocalList, "
                "PrepareRemoteList), checked once, instead of descriptors checked per request");
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
  app->add_option("--secret-file", c.secret_file,
                  "EngineOptions::secret_file: authenticate peers with the secret in FILE (the "
                  "peer needs the same; a local target child gets it too); default: "
                  "$XFER_SECRET_FILE")
      ->type_name("FILE");
  app->add_option("--connect-timeout", c.connect_timeout,
                  "Seconds to keep retrying the connection to the peer")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
}

}  // namespace
}  // namespace xfer::bench

using namespace xfer::bench;

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  Config c;
  if (const char* f = std::getenv("XFER_SECRET_FILE")) c.secret_file = f;  // (--secret-file wins)
  CLI::App app{
      "xfer-bench: bandwidth and latency of xfer transfers.\n"
      "With no test it runs the main job: a local target child, WRITE then READ, 16K..8M,\n"
      "buffers from Engine::AllocMem (path shm on one host; --mem register: cma)."};
  app.set_version_flag("--version", "xfer-bench " + std::string(xfer::Version()));
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
      "  xfer-bench serve --listen HOST:18515 --metadata etcd://ETCD:2379 --name prefill-0\n"
      "  xfer-bench read_bw --metadata etcd://ETCD:2379 prefill-0   (found by name)\n"
      "Units: GB/s = 1e9 B/s. Exit codes: 0 ok, 1 run failed, 2 argument error, 3 --expect-* not met.");
  AddTestOptions(&app, c);

  const std::vector<std::pair<std::string, std::string>> tests = {
      {"write_bw", "WRITE bandwidth and message rate"},
      {"read_bw", "READ bandwidth and message rate"},
      {"write_lat", "WRITE latency of one request, end to end"},
      {"read_lat", "READ latency of one request, end to end"},
      {"table",
       "WRITE and READ bandwidth: block sizes x (op, transport, direction, direct or "
       "buffer pool), n/a where unsupported (HIXL's table shape). Direction = local 2 "
       "remote memory (H host, D GPU); D direct cells under transport cuda, bufferpool "
       "cells under tcp (staging = always, different host ids)"}};
  std::vector<CLI::App*> test_apps;
  for (const auto& [name, desc] : tests) {
    CLI::App* sub = app.add_subcommand(name, desc);
    AddTestOptions(sub, c);
    sub->add_option("peer", c.peer,
                    "host:port of an `xfer-bench serve` (with --metadata: its --name); without it "
                    "a local target is started");
    sub->add_option("--metadata", c.metadata,
                    "etcd://host:port[,...][/prefix] or http://host:port/path (an HTTP metadata "
                    "server): find the serve named `peer` there");
    test_apps.push_back(sub);
  }
  CLI::App* serve = app.add_subcommand(
      "serve", "Be the target side: wait for clients; each sends its options, gets an engine and a region");
  serve->add_option("--listen", c.listen, "host:port to listen on for clients (port 0: any free port)")
      ->capture_default_str();
  serve->add_option("--host-id", c.host_id, "EngineOptions::host_id of this side");
  serve
      ->add_option("--secret-file", c.secret_file,
                   "EngineOptions::secret_file of this side (clients need the same secret); "
                   "default: $XFER_SECRET_FILE")
      ->type_name("FILE");
  serve->add_option("--metadata", c.metadata,
                    "etcd://host:port[,...][/prefix] or http://host:port/path: publish this serve "
                    "there as --name, for clients "
                    "that name it (needs --listen with a reachable address)");
  serve->add_option("--name", c.cluster_name, "This serve's cluster name (with --metadata)");
  serve
      ->add_option("--metrics", c.metrics_listen,
                   "Serve the metrics of each client's engine on this side at http://ADDR/metrics "
                   "(EngineOptions::metrics_listen) while the client runs")
      ->type_name("HOST:PORT");
  serve
      ->add_option("--nics", c.nics,
                   "EngineOptions::tcp.nics of this side: the network interfaces (names, local IPv4 "
                   "addresses or near:BUS_ID, comma-separated) it serves tcp data on (default: the "
                   "address clients reach; a client's --nics are its own)")
      ->type_name("LIST");
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
      if (c.metadata.empty() != c.cluster_name.empty())
        throw ArgError{"serve: give --metadata and --name together"};
      return RunServe(c);
    }
    for (size_t i = 0; i < test_apps.size(); ++i)
      if (test_apps[i]->parsed()) c.tests = {tests[i].first};
    if (c.tests.empty()) {
      c.main_job = true;
      c.tests = {"write_bw", "read_bw"};
    }
    Resolve(c);
    if (!c.metadata.empty()) {
      if (c.peer.empty()) throw ArgError{"--metadata needs the name of a serve (the peer argument)"};
      if (std::string why = FindServe(c); !why.empty()) {
        std::fprintf(stderr, "xfer-bench: %s\n", why.c_str());
        return 1;
      }
    }
  } catch (const ArgError& e) {
    std::fprintf(stderr, "xfer-bench: %s\nRun with --help for more information.\n", e.msg.c_str());
    return kExitArgs;
  }
  Bench bench(c, argv[0], JoinArgv(argc, argv));
  return bench.Run();
}
