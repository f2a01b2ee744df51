// MetricsServer on cpp-httplib (Debian's libcpp-httplib-dev).
#include "core/metrics_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <thread>

#include "util/log.h"
#include "util/net.h"

namespace xfer {
namespace {

class HttpMetricsServer final : public MetricsServer {
 public:
  HttpMetricsServer(Render render) : render_(std::move(render)) {
    // Two threads, short timeouts: a stalled scraper holds a thread for a second at most,
    // and Finalize waits no longer than that.
    server_.new_task_queue = [] { return new httplib::ThreadPool(2); };
    server_.set_read_timeout(1, 0);
    server_.set_write_timeout(1, 0);
    server_.set_keep_alive_timeout(1);
    // SO_REUSEADDR alone: httplib's default adds SO_REUSEPORT, with which a second engine
    // given the same port would share it (and its scrapes) instead of being refused.
    server_.set_socket_options([](int fd) {
      int on = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    });
    server_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(render_(), "text/plain; version=0.0.4; charset=utf-8");
    });
    server_.Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("xfer engine: metrics at /metrics\n", "text/plain");
    });
  }
  ~HttpMetricsServer() override {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }

  Status Listen(const net::Address& addr) {
    const int port = addr.port == 0 ? server_.bind_to_any_port(addr.host)
                                    : (server_.bind_to_port(addr.host, addr.port) ? addr.port : -1);
    if (port <= 0) {
      return {StatusCode::kInvalidArgument,
              "metrics_listen '" + addr.ToString() + "': cannot listen there (address in use, or not this host's)"};
    }
    bound_ = addr;
    bound_.port = static_cast<uint16_t>(port);
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // stop() does nothing before the server runs: wait until it does.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!server_.is_running() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return Status::Ok();
  }
  std::string address() const override { return bound_.ToString(); }

 private:
  const Render render_;
  httplib::Server server_;
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
