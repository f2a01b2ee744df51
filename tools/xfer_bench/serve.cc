#include "serve.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>

#include <thread>
#include <vector>

#include "cluster.h"
#include "initiator.h"

namespace xfer::bench {

std::string ServeSession(Ctl& ctl, const std::string& engine_host, const Config& side, bool in_process,
                         bool verbose) {
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
  c.host_id = side.host_id;
  c.secret_file = side.secret_file;
  c.metrics_listen = side.metrics_listen;
  // NICs are a host's own: a serve uses those named on its command line; a local child (same
  // host) those of the client.
  if (side.ctl_fd < 0) c.nics = side.nics;
  // So are these, whatever the client's --set says (its host id, secret and metrics address;
  // a serve's NICs).
  std::erase_if(c.set, [&](const std::string& kv) {
    const std::string key = kv.substr(0, kv.find('='));
    return key == "host_id" || key == "secret" || key == "secret_file" || key == "metrics_listen" ||
           (side.ctl_fd < 0 && key == "tcp.nics");
  });
  // This side's region is the client's remote memory; its own buffers (bidirectional) the
  // client's local memory: the same test both ways.
  const MemSpec region_mem = MemOf(c.remote_mem), local_mem = MemOf(c.local_mem);
  if (region_mem.device || (c.bidir && local_mem.device)) {
    std::string gpu = GpuWhy();
    if (!gpu.empty())
      return refuse("GPU memory (" + (region_mem.device ? c.remote_mem : c.local_mem) + ") at the target (" +
                    MachineLine().substr(0, MachineLine().find(',')) + "): " + gpu);
  }

  // Declared before the engine, so that they outlive it (registered memory is unmapped only
  // after the engine finalized).
  BenchMem region, local;
  Engine engine;
  Status st = engine.Initialize(engine_host + ":0", MakeEngineOptions(c));
  if (!st.ok()) return refuse("Initialize(" + engine_host + ":0): " + st.ToString());
  auto drain = std::make_unique<NotifyDrain>(engine);  // the client's --notify requests
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
    std::printf("xfer-bench serve: client %s: engine %s, %s %s%s%s\n", hello.value("client", "?").c_str(),
                engine.LocalName().c_str(), FormatSize(region.size()).c_str(),
                c.mem == "alloc" ? "allocated (AllocMem)" : "registered", region_mem.device ? " on " : "",
                region_mem.device ? c.remote_mem.c_str() : "");
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
      ctl.Send({{"type", "ok"}, {"transport", pi.transport}, {"shm", pi.Reaches("shm")}});
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
      if (bytes == 0 ||
          (test != "write_bw" && test != "read_bw" && test != "write_lat" && test != "read_lat")) {
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
        if (ok)
          row = r;
        else
          run_err = err;
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
        if (!run_err.empty())
          reply = {{"type", "error"}, {"msg", "reverse direction: " + run_err}};
        else
          reply["row"] = RowToJson(row);
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
  drain.reset();
  engine.Finalize();
  if (result.empty() && !free_err.empty()) result = free_err;
  return result;
}

int RunServe(const Config& c) {
  if (c.ctl_fd >= 0) {  // a local child: one session on the inherited socket
    Ctl ctl(c.ctl_fd);
    // Errors went to the client over the channel; it reports them.
    std::string e = ServeSession(ctl, "127.0.0.1", c, false, false);
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
  std::unique_ptr<Engine> announcer;  // (with --metadata: how clients find this serve by name)
  if (!c.metadata.empty()) {
    if (std::string why = AnnounceServe(c, port, &announcer); !why.empty()) {
      std::fprintf(stderr, "xfer-bench serve: %s\n", why.c_str());
      return 1;
    }
    std::printf("xfer-bench serve: published as '%s' at %s\n", c.cluster_name.c_str(), c.metadata.c_str());
  }
  std::printf(
      "xfer-bench serve: waiting for clients on %s (port %d); each client's options "
      "apply to its run; Ctrl-C to stop\n",
      c.listen.c_str(), port);
  std::fflush(stdout);
  // Clients one after another. A connection waits among the pending ones until it sends
  // something, so idle or garbage connections never hold up a real client behind them; one
  // that stays silent for kIdle is closed, and past kMaxPending the oldest goes.
  constexpr size_t kMaxPending = 64;
  constexpr auto kIdle = std::chrono::seconds(30);
  struct Pending {
    int fd;
    std::chrono::steady_clock::time_point since;
  };
  std::vector<Pending> pending;
  for (;;) {
    std::vector<pollfd> p{{lfd, POLLIN, 0}};
    for (const auto& w : pending) p.push_back({w.fd, POLLIN, 0});
    if (poll(p.data(), p.size(), 1000) < 0 && errno != EINTR) {
      std::fprintf(stderr, "xfer-bench serve: poll: %s\n", std::strerror(errno));
      break;
    }
    const auto now = std::chrono::steady_clock::now();
    int ready = -1;  // a pending connection that sent something (or hung up)
    for (size_t i = 1; i < p.size() && ready < 0; ++i) {
      if (p[i].revents != 0) ready = p[i].fd;
    }
    std::erase_if(pending, [&](const Pending& w) {
      if (w.fd == ready || now - w.since < kIdle) return false;
      close(w.fd);
      return true;
    });
    if (p[0].revents & POLLIN) {
      int fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0 && errno != EINTR && errno != ECONNABORTED && errno != EAGAIN) {
        std::fprintf(stderr, "xfer-bench serve: accept: %s\n", std::strerror(errno));
        if (errno == EMFILE || errno == ENFILE) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      if (fd >= 0) {
        if (pending.size() >= kMaxPending) {
          close(pending.front().fd);
          pending.erase(pending.begin());
        }
        pending.push_back({fd, now});
      }
    }
    if (ready < 0) continue;
    std::erase_if(pending, [&](const Pending& w) { return w.fd == ready; });
    const int fd = ready;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    // The engine listens on the address the client reached us at, so the name it advertises
    // is one the client can connect to.
    std::string host = SockHost(fd, false);
    Ctl ctl(fd);
    std::string e = ServeSession(ctl, host.empty() ? "0.0.0.0" : host, c, false, true);
    if (!e.empty())
      std::fprintf(stderr, "xfer-bench serve: session ended: %s\n", e.c_str());
    else if (!c.once)
      std::printf("xfer-bench serve: session done; waiting for the next client\n");
    std::fflush(stdout);
    if (c.once) break;
  }
  for (const auto& w : pending) close(w.fd);
  close(lfd);
  return 0;
}

}  // namespace xfer::bench
