// Backend "local": a peer in this very process (an engine's transfers to its own name, or
// two engines of one process): memcpy between host ranges as they are.
#include "transport/backend.h"
#include "transport/local/local_transport.h"

namespace xfer::transport {
namespace {

class LocalRoute final : public Route {
 public:
  LocalRoute(std::shared_ptr<Link> link, PlanLimits limits)
      : Route("local", std::move(link), limits) {}
  Status Reach(MemType local, RemoteRegion& r, uint8_t** mapped) override {
    if (local != MemType::kHost || r.info.type != MemType::kHost) {
      return {StatusCode::kUnsupported, "local: moves host memory only"};
    }
    return Status::Ok();
  }
};

class LocalBackend final : public Backend {
 public:
  std::string_view name() const override { return "local"; }
  Status Start(const EngineContext&) override { return Status::Ok(); }
  Status Connect(const PeerContext& peer, std::shared_ptr<Route>* route) override {
    if (!peer.same_process) return {StatusCode::kUnsupported, "local: the peer is another process"};
    std::shared_ptr<Link> link;
    Status s = transport_.Connect(PeerEndpoint{peer.pid, peer.incarnation, 0, "", 0}, &link);
    if (!s.ok()) return s;
    PlanLimits limits;
    limits.slice_bytes = limits.batch_bytes = transport_.default_batch_bytes();
    limits.max_slices_per_batch = transport_.max_slices_per_batch();
    *route = std::make_shared<LocalRoute>(std::move(link), limits);
    return Status::Ok();
  }

 private:
  LocalTransport transport_;
};

}  // namespace

std::unique_ptr<Backend> MakeLocalBackend() { return std::make_unique<LocalBackend>(); }

}  // namespace xfer::transport
