// MetricsServer on cpp-httplib (Debian's libcpp-httplib-dev).
#include "core/metrics/metrics_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "util/log.h"
#include "util/net.h"

namespace xfer {
namespace {

using Clock = std::chrono::steady_clock;

// httplib's thread pool with a bound on what waits: `workers` threads, and at most `queued`
// accepted connections waiting for one. Past that the listen thread serves the connection
// itself, and accepts nothing meanwhile: later scrapers wait in the kernel's listen backlog,
// holding none of the engine's file descriptors. (httplib's own pool queues without bound,
// a descriptor each: slow scrapers could take them all.) The server holds at most
// workers + queued + 1 connections.
class BoundedPool final : public httplib::TaskQueue {
 public:
  BoundedPool(size_t workers, size_t queued) : max_queued_(queued) {
    for (size_t i = 0; i < workers; ++i) threads_.emplace_back([this] { Work(); });
  }
  ~BoundedPool() override = default;
  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard lock(mu_);
      if (jobs_.size() < max_queued_) {
        jobs_.push_back(std::move(fn));
        cv_.notify_one();
        return;
      }
    }
    fn();  // (full)
  }
  void shutdown() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

 private:
  void Work() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // (stopping, and nothing left)
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      fn();
    }
  }

  const size_t max_queued_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;  // mu_
  bool stop_ = false;                       // mu_
  std::vector<std::thread> threads_;
};

// What the server's threads share with its owner: the page's source, dropped when the owner
// goes (a server left behind then answers 503), and whether the listen thread has returned.
struct Shared {
  std::mutex mu;
  MetricsServer::Render render;  // mu; empty once the owner is gone
  httplib::Server server;
  std::atomic<bool> listening_ended{false};
};

class HttpMetricsServer final : public MetricsServer {
 public:
  explicit HttpMetricsServer(Render render) : shared_(std::make_shared<Shared>()) {
    shared_->render = std::move(render);
    httplib::Server& s = shared_->server;
    // Two workers, four waiting, and short timeouts: a scraper that stalls holds one worker,
    // not the engine (nor its file descriptors).
    s.new_task_queue = [] { return new BoundedPool(2, 4); };
    s.set_read_timeout(1, 0);
    s.set_write_timeout(1, 0);
    s.set_keep_alive_timeout(1);
    s.set_payload_max_length(4096);  // (a GET has no body; nothing else is served)
    // SO_REUSEADDR alone: httplib's default adds SO_REUSEPORT, with which a second engine
    // given the same port would share it (and its scrapes) instead of being refused.
    s.set_socket_options([](int fd) {
      int on = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    });
    std::weak_ptr<Shared> weak = shared_;
    s.Get("/metrics", [weak](const httplib::Request&, httplib::Response& res) {
      std::string body;
      if (auto sh = weak.lock()) {
        std::lock_guard lock(sh->mu);
        if (sh->render) body = sh->render();
      }
      if (body.empty()) {  // (the engine is starting or stopping)
        res.status = 503;
        res.set_content("the engine is not running\n", "text/plain");
        return;
      }
      res.set_content(body, "text/plain; version=0.0.4; charset=utf-8");
    });
    s.Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("xfer engine: metrics at /metrics\n", "text/plain");
    });
  }

  // Stops serving. The owner waits two seconds at most: a client that trickles a request byte
  // by byte can hold a worker longer (httplib's timeouts are per read), and then the server
  // is left to finish on its own thread, answering 503.
  ~HttpMetricsServer() override {
    {
      std::lock_guard lock(shared_->mu);
      shared_->render = nullptr;
    }
    if (!thread_.joinable()) return;  // (it never listened)
    const auto until = Clock::now() + std::chrono::seconds(2);
    while (!shared_->listening_ended.load() && Clock::now() < until) {
      shared_->server.stop();  // (does nothing until the server runs: hence the loop)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (shared_->listening_ended.load()) {
      thread_.join();
    } else {
      XLOG(WARN) << "metrics server at " << bound_.ToString()
                 << ": a scraper still holds a connection; left to close on its own";
      thread_.detach();  // (it holds the shared state until it ends)
    }
  }

  Status Listen(const net::Address& addr) {
    httplib::Server& s = shared_->server;
    const int port = addr.port == 0 ? s.bind_to_any_port(addr.host)
                                    : (s.bind_to_port(addr.host, addr.port) ? addr.port : -1);
    if (port <= 0) {
      return {StatusCode::kInvalidArgument,
              "metrics_listen '" + addr.ToString() +
                  "': cannot listen there (address in use, or not this host's)"};
    }
    bound_ = addr;
    bound_.port = static_cast<uint16_t>(port);
    thread_ = std::thread([shared = shared_] {
      shared->server.listen_after_bind();
      shared->listening_ended = true;
    });
    return Status::Ok();
  }
  std::string address() const override { return bound_.ToString(); }

 private:
  std::shared_ptr<Shared> shared_;
  net::Address bound_;
  std::thread thread_;
};

}  // namespace

Status MetricsServer::Start(const std::string& listen, Render render, std::unique_ptr<MetricsServer>* out) {
  net::Address addr;
  Status s = net::ParseAddress(listen, &addr);
  if (s.ok() && !addr.has_port) s = {StatusCode::kInvalidArgument, "no port"};
  if (!s.ok()) {
    return {StatusCode::kInvalidArgument,
            "metrics_listen '" + listen + "' is not host:port (" + s.message() + ")"};
  }
  auto server = std::make_unique<HttpMetricsServer>(std::move(render));
  s = server->Listen(addr);
  if (!s.ok()) return s;
  XLOG(INFO) << "metrics at http://" << server->address() << "/metrics";
  *out = std::move(server);
  return Status::Ok();
}

}  // namespace xfer
