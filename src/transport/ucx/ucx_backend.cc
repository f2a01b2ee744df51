// Backend "ucx": one-sided put/get through UCX (ucx_transport.h). The hello carries our
// target worker's address, a region's record its packed remote key (GPU regions too, where
// UCX registers CUDA memory).
#include "transport/backend.h"
#include "transport/ucx/ucx_transport.h"
#include "util/host.h"
#include "util/log.h"
#include "util/text.h"

namespace xfer::transport {
namespace {

// Host memory, and GPU memory where UCX registers it: a peer's region is reached when the peer
// mapped it for UCX (its record has a key: GPU memory only where the peer's UCX registers
// CUDA memory), local GPU memory when ours does.
class UcxRoute final : public Route {
 public:
  UcxRoute(std::shared_ptr<Link> link, PlanLimits limits, bool gpu)
      : Route("ucx", std::move(link), limits), gpu_(gpu) {}
  bool Reach(MemType local, RemoteRegion& r, uint8_t**) override {
    return (local == MemType::kHost || gpu_) && FindBlob(r.blobs, "ucx") != nullptr;
  }
  // Both sides' reasons, where both have one.
  std::string WhyNot(MemType local, const RemoteRegion& r) const override {
    std::string why;
    if (local != MemType::kHost && !gpu_) why = "our GPU memory: " + UcxTransport::GpuVerdict(false);
    if (FindBlob(r.blobs, "ucx") == nullptr) {
      text::Append(&why, r.info.type != MemType::kHost
                             ? "the peer's GPU region has no ucx key (its UCX registers no CUDA memory, or "
                               "could not map it)"
                             : "the peer could not map the region for UCX");
    }
    return "ucx: " + why;
  }
  bool OneSided() const override { return true; }

 private:
  const bool gpu_;  // our UCX registers GPU memory
};

class UcxBackend final : public Backend {
 public:
  std::string_view name() const override { return "ucx"; }
  std::string About() const override { return "RDMA through UCX: " + UcxTransport::Describe(); }

  std::vector<options::Row> Options() const override {
    return {
        XFER_OPTION_CHOICE("ucx.mode", ucx.mode, ParseUcxMode, UcxModeName, "auto, on, off",
                           "offer ucx with an RDMA device here, always, or never"),
        XFER_OPTION_COUNT("ucx.endpoints", ucx.endpoints, 1, 64, "endpoints per peer, a worker each"),
    };
  }
  Status CheckOptions(const EngineOptions& o) const override {
    if (o.transport == "ucx" && o.ucx.mode == UcxMode::kOff) {
      return {StatusCode::kInvalidArgument, "transport 'ucx' forced but ucx.mode is off"};
    }
    return Status::Ok();
  }

  Status Start(const EngineContext& ctx) override {
    const EngineOptions& o = *ctx.options;
    options_ = o;
    const bool forced = ctx.forced == "ucx";
    if (o.ucx.mode == UcxMode::kOff) {
      return {StatusCode::kUnsupported, "ucx is off here (EngineOptions::ucx.mode)"};
    }
    if (!forced && !ctx.forced.empty()) {
      return {StatusCode::kUnsupported, "ucx is off here (transport forced to " + ctx.forced + ")"};
    }
    if (!forced && o.ucx.mode == UcxMode::kAuto && host::RdmaDevices().empty()) {
      return {StatusCode::kUnsupported,
              "ucx is off here (no RDMA device; EngineOptions::ucx.mode = kOn offers it)"};
    }
    transport_ = std::make_unique<UcxTransport>(UcxOptions{o.ucx.endpoints});
    if (Status s = transport_->Start(); !s.ok()) {
      // Forced: the user asked for it. Otherwise tcp serves other hosts; say so quietly.
      if (forced) {
        XLOG(WARN) << "ucx transport not offered: " << s.message();
      } else {
        XLOG(INFO) << "ucx transport not offered: " << s.message();
      }
      transport_.reset();
      return {s.code(), "ucx could not start here: " + s.message()};
    }
    return Status::Ok();
  }
  std::optional<std::string> HelloBlob() const override { return transport_->worker_address(); }

  Status PrepareRegion(const RegionInfo& info, const RegionResource*, std::optional<std::string>* blob,
                       std::unique_ptr<RegionResource>* res) override {
    const bool gpu = info.type == MemType::kCuda;
    if (gpu && !transport_->cuda_memory()) return Status::Ok();  // (Start said so, once)
    std::unique_ptr<UcxMemory> m;
    const bool remote_write = info.access == PeerAccess::kReadWrite;
    if (Status s = transport_->MapMemory(info.addr, info.len, &m, remote_write, gpu); !s.ok()) {
      XLOG(WARN) << (gpu ? "GPU memory at " : "memory at ") << text::Hex(info.addr) << " (" << info.len
                 << " bytes) is not reachable through ucx: " << s.ToString();
      return Status::Ok();
    }
    *blob = m->packed_key();
    *res = std::make_unique<Owned<UcxMemory>>(std::move(m));
    return Status::Ok();
  }

  Status Connect(const PeerContext& peer, std::shared_ptr<Route>* route) override {
    // A ucx link finds each range's remote key in the peer's region table.
    UcxPeer up{std::string(peer.blob),
               [find = peer.find_region](uint64_t addr, uint64_t len, bool write, UcxRemoteKey* key) {
                 auto r = find(addr, len, write);
                 const std::string* packed = r ? FindBlob(r->blobs, "ucx") : nullptr;
                 if (packed == nullptr) return false;
                 *key = {r->id, *packed, r->info.addr, r->info.len};
                 return true;
               },
               peer.name};
    std::shared_ptr<Link> link;
    Status s = transport_->Connect(up, &link);
    if (!s.ok()) return s;
    *route =
        std::make_shared<UcxRoute>(std::move(link), transport_->Limits(options_), transport_->cuda_memory());
    return Status::Ok();
  }

 private:
  EngineOptions options_;
  std::unique_ptr<UcxTransport> transport_;  // null until started
};

}  // namespace

std::unique_ptr<Backend> MakeUcxBackend() { return std::make_unique<UcxBackend>(); }

}  // namespace xfer::transport

namespace xfer {
namespace {
constexpr std::string_view kUcxModeNames[] = {"auto", "on", "off"};
}  // namespace

bool ParseUcxMode(std::string_view text, UcxMode* out) { return text::ParseEnum(text, kUcxModeNames, out); }
std::string_view UcxModeName(UcxMode m) { return text::EnumName(m, kUcxModeNames); }

}  // namespace xfer
