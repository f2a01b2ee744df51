// Backend "local": a peer in this very process (an engine's transfers to its own name, or
// two engines of one process): memcpy between host ranges as they are.
#include "transport/backend.h"
#include "transport/common/host_copy.h"

namespace xfer::transport {
namespace {

// The peer's memory is this process's own: it is "mapped" where it is, so a small transfer is
// a memcpy on the caller (Route::CopiesInline), as over shm.
class LocalRoute final : public Route {
 public:
  using Route::Route;
  bool Reach(MemType local, RemoteRegion& r, uint8_t** mapped) override {
    if (local != MemType::kHost || r.info.type != MemType::kHost) return false;
    *mapped = reinterpret_cast<uint8_t*>(r.info.addr);
    return true;
  }
  std::string WhyNot(MemType, const RemoteRegion&) const override { return "local: moves host memory only"; }
  bool CopiesInline(uint64_t len) const override { return OneSlice(len); }
};

class LocalBackend final : public Backend {
 public:
  std::string_view name() const override { return "local"; }
  std::string About() const override { return "memcpy between engines of one process"; }
  Status Start(const EngineContext& ctx) override {
    options_ = *ctx.options;
    return Status::Ok();
  }
  Status Connect(const PeerContext& peer, std::shared_ptr<Route>* route) override {
    if (!peer.same_process) return {StatusCode::kUnsupported, "local: the peer is another process"};
    PlanLimits limits = WithOverrides({256 << 10, 256 << 10, 1024}, options_);
    *route = std::make_shared<LocalRoute>("local", std::make_shared<CopyLink>(), limits);
    return Status::Ok();
  }

 private:
  EngineOptions options_;
};

}  // namespace

std::unique_ptr<Backend> MakeLocalBackend() { return std::make_unique<LocalBackend>(); }

}  // namespace xfer::transport
