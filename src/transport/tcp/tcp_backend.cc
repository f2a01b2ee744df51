// Backend "tcp": any host (tcp_transport.h). The hello carries our data port; the target's
// threads check every range a peer names and stage GPU memory through buffers of their own.
#include "transport/backend.h"
#include "transport/tcp/nics.h"
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
  std::string About() const override { return "TCP sockets to peers on any host"; }

  std::vector<options::Row> Options() const override {
    return {
        XFER_OPTION_COUNT("tcp.links", tcp.links, 1, 64, "data connections per peer"),
        XFER_OPTION_BOOL("tcp.least_loaded", tcp.least_loaded,
                         "a batch takes a free connection first, not the next in turn"),
        XFER_OPTION_BOOL("tcp.checksum", tcp.checksum, "every batch carries a checksum of its bytes (XXH3)"),
        XFER_OPTION_LIST(
            "tcp.nics", tcp.nics,
            "the interfaces the data connections use: names, addresses, near:BUS_ID (none: the kernel's)"),
    };
  }
  Status CheckOptions(const EngineOptions& o) const override {
    if (o.tcp.checksum && !checksum::Available()) {
      return {StatusCode::kUnsupported, "tcp.checksum needs a build with libxxhash (libxxhash-dev)"};
    }
    return Status::Ok();  // (tcp.nics: resolved once, in Start, which fails Initialize as well)
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
    hooks.peer_auth_keys = ctx.peer_auth_keys;
    TcpOptions to{o.tcp.links,
                  o.tcp.least_loaded,
                  std::min<std::chrono::milliseconds>(o.heartbeat_timeout, std::chrono::hours(24)),
                  o.spin,
                  o.tcp.checksum,
                  {}};
    if (Status s = ResolveNics(o.tcp.nics, &to.nics); !s.ok()) return s;
    transport_ = std::make_unique<TcpTransport>(std::move(to), hooks);
    if (Status s = transport_->Start(ctx.listen_host); !s.ok()) {
      transport_.reset();
      if (s.code() == StatusCode::kInvalidArgument) return s;  // a NIC of tcp.nics: Initialize fails
      XLOG(WARN) << "tcp transport not offered: cannot listen on " << ctx.listen_host << ": " << s.message();
      return {s.code(), "tcp cannot listen here: " + s.message()};
    }
    return Status::Ok();
  }
  // Our data port, then (when tcp.nics names any) u8 count, and per NIC: u8 length, its
  // address, u16 port. (An engine that names no NICs sends the port alone, as earlier versions
  // did; those refuse the longer entry, and tcp is then not offered between the two.)
  std::optional<std::string> HelloBlob() const override {
    std::string b;
    bytes::Put(&b, transport_->port());
    const auto& nics = transport_->nic_addresses();
    if (nics.empty()) return b;
    bytes::Put(&b, static_cast<uint8_t>(nics.size()));
    for (const net::Address& a : nics) {
      bytes::Put(&b, static_cast<uint8_t>(a.host.size()));
      b += a.host;
      bytes::Put(&b, a.port);
    }
    return b;
  }

  Status Connect(const PeerContext& peer, std::shared_ptr<Route>* route) override {
    TcpPeer at{peer.incarnation, peer.host, 0, peer.auth_key, {}};
    if (!ParseHello(peer.blob, &at))
      return {StatusCode::kUnsupported, "tcp: the peer's hello entry is malformed"};
    std::shared_ptr<Link> link;
    Status s = transport_->Connect(at, &link);
    if (!s.ok()) return s;
    *route = std::make_shared<TcpRoute>(std::move(link), transport_->Limits(options_));
    return Status::Ok();
  }

  void Fence(Clock::time_point deadline) override { transport_->Fence(deadline); }
  void DropPeer(uint64_t incarnation) override { transport_->DropPeer(incarnation); }
  void StopServing() override { transport_->Stop(); }

 private:
  // The NICs tcp.nics names (kInvalidArgument: Initialize fails), at most kMaxNics once
  // "near:" entries are expanded.
  static Status ResolveNics(const std::vector<std::string>& wanted, std::vector<net::Nic>* nics) {
    if (Status s = net::ResolveNics(wanted, nics); !s.ok()) return s;
    if (nics->size() > kMaxNics) {
      return {StatusCode::kInvalidArgument, "tcp.nics names " + std::to_string(nics->size()) +
                                                " interfaces; at most " + std::to_string(kMaxNics)};
    }
    return Status::Ok();
  }
  static bool ParseHello(std::string_view blob, TcpPeer* at) {
    uint8_t count = 0;
    if (!bytes::Take(&blob, &at->port) || at->port == 0) return false;
    if (blob.empty()) return true;
    if (!bytes::Take(&blob, &count) || count == 0 || count > kMaxNics) return false;
    for (uint8_t i = 0; i < count; ++i) {
      uint8_t len = 0;
      uint16_t port = 0;
      if (!bytes::Take(&blob, &len) || len == 0 || blob.size() < len) return false;
      net::Address a{std::string(blob.substr(0, len)), 0, true};
      blob.remove_prefix(len);
      if (!bytes::Take(&blob, &port) || port == 0) return false;
      a.port = port;
      // Only an IPv4 address that can be another host's is used: no names (no lookups on the
      // peer's word), no loopback or unspecified address unless the peer is reached on
      // loopback. Others are left out (a peer's NIC list is a hint; its host and port stay).
      if (net::IsRemoteIpv4(a.host, at->host)) at->nics.push_back(a.ToString());
    }
    return blob.empty();
  }
  static constexpr uint8_t kMaxNics = 16;
  EngineOptions options_;
  std::unique_ptr<TcpTransport> transport_;  // null until started
};

}  // namespace

std::unique_ptr<Backend> MakeTcpBackend() { return std::make_unique<TcpBackend>(); }

}  // namespace xfer::transport
