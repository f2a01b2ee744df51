// Backend "tcp": any host (tcp_transport.h). The hello carries our data port; the target's
// threads check every range a peer names and stage GPU memory through buffers of their own.
#include "transport/backend.h"
#include "transport/tcp/tcp_transport.h"
#include "util/bytes.h"
#include "util/checksum.h"
#include "util/log.h"

namespace xfer::transport {
namespace {

class TcpRoute final : public Route {
 public:
  TcpRoute(std::shared_ptr<Link> link, PlanLimits limits) : Route("tcp", std::move(link), limits) {}
  // The target stages its own GPU memory; ours passes through our staging buffers.
  bool Reach(MemType local, RemoteRegion&, uint8_t**) override { return local == MemType::kHost; }
  std::string WhyNot(MemType, const RemoteRegion&) const override {
    return "tcp: sends host memory only (local GPU memory goes through the buffer pool)";
  }
};

class TcpBackend final : public Backend {
 public:
  std::string_view name() const override { return "tcp"; }

  Status CheckOptions(const EngineOptions& o) const override {
    if (o.tcp.links < 1 || o.tcp.links > 64) {
      return {StatusCode::kInvalidArgument, "tcp.links must be 1..64"};
    }
    if (o.tcp.checksum && !checksum::Available()) {
      return {StatusCode::kUnsupported, "tcp.checksum needs a build with libxxhash (libxxhash-dev)"};
    }
    return Status::Ok();
  }

  Status Start(const EngineContext& ctx) override {
    const EngineOptions& o = *ctx.options;
    options_ = o;
    TcpTargetHooks hooks;
    hooks.incarnation = ctx.incarnation;
    hooks.region_access = ctx.region_access;
    hooks.staging_bytes = ctx.staging_bytes;
    hooks.is_peer = ctx.is_peer;
    hooks.authenticate = ctx.authenticate;
    hooks.peer_auth_key = ctx.peer_auth_key;
    transport_ = std::make_unique<TcpTransport>(
        TcpOptions{o.tcp.links, o.tcp.least_loaded, std::min<std::chrono::milliseconds>(o.heartbeat_timeout, std::chrono::hours(24)),
                   o.spin, o.tcp.checksum},
        hooks);
    if (Status s = transport_->Start(ctx.listen_host); !s.ok()) {
      XLOG(WARN) << "tcp transport not offered: cannot listen on " << ctx.listen_host << ": "
                 << s.message();
      transport_.reset();
      return {s.code(), "tcp cannot listen here: " + s.message()};
    }
    return Status::Ok();
  }
  std::optional<std::string> HelloBlob() const override {
    std::string b;
    bytes::Put(&b, transport_->port());
    return b;
  }

  Status Connect(const PeerContext& peer, std::shared_ptr<Route>* route) override {
    std::string_view blob = peer.blob;
    uint16_t port = 0;
    if (!bytes::Take(&blob, &port) || !blob.empty() || port == 0) {
      return {StatusCode::kUnsupported, "tcp: the peer's hello entry is malformed"};
    }
    std::shared_ptr<Link> link;
    Status s = transport_->Connect(PeerEndpoint{peer.pid, peer.incarnation, 0, peer.host, port, peer.auth_key, -1}, &link);
    if (!s.ok()) return s;
    *route = std::make_shared<TcpRoute>(std::move(link), LimitsOf(*transport_, options_));
    return Status::Ok();
  }

  void Fence(Clock::time_point deadline) override { transport_->Fence(deadline); }
  void DropPeer(uint64_t incarnation) override { transport_->DropPeer(incarnation); }
  void StopServing() override { transport_->Stop(); }

 private:
  EngineOptions options_;
  std::unique_ptr<TcpTransport> transport_;  // null until started
};

}  // namespace

std::unique_ptr<Backend> MakeTcpBackend() { return std::make_unique<TcpBackend>(); }

}  // namespace xfer::transport
