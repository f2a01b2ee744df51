// Backend "cma": cross-memory attach between processes of one host (cma_transport.h). The
// hello carries the address of a u64 holding our incarnation: a peer reads it through
// process_vm_readv to prove, before any byte is written, that it may and that the pid is us.
#include <sys/prctl.h>

#include "transport/backend.h"
#include "transport/cma/cma_transport.h"
#include "util/bytes.h"
#include "util/log.h"

namespace xfer::transport {
namespace {

class CmaBackend final : public Backend {
 public:
  std::string_view name() const override { return "cma"; }
  std::string About() const override { return "process_vm_readv/writev between processes of this host"; }

  Status Start(const EngineContext& ctx) override {
    cookie_ = ctx.incarnation;
    options_ = *ctx.options;
    // Under Yama ptrace_scope=1 a peer may attach to us only if we say so.
    ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    std::string why;
    if (!CmaTransport::Available(&why)) {
      XLOG(WARN) << "cma transport not offered: " << why;
      return {StatusCode::kUnsupported, why};
    }
    return Status::Ok();
  }
  std::optional<std::string> HelloBlob() const override {
    std::string b;
    bytes::Put(&b, reinterpret_cast<uint64_t>(&cookie_));
    return b;
  }

  Status Connect(const PeerContext& peer, std::shared_ptr<Route>* route) override {
    if (!peer.same_host) return {StatusCode::kUnsupported, "cma: the peer is on another host"};
    if (peer.same_process) return {StatusCode::kUnsupported, "cma: the peer is this process"};
    std::string_view blob = peer.blob;
    uint64_t cookie = 0;
    if (!bytes::Take(&blob, &cookie) || !blob.empty()) {
      return {StatusCode::kUnsupported, "cma: the peer's hello entry is malformed"};
    }
    std::shared_ptr<Link> link;
    Status s = CmaTransport::Connect(CmaPeer{peer.pid, peer.incarnation, cookie, peer.pidfd}, &link);
    if (!s.ok()) return s;
    // One system call a batch: 256 KiB amortizes it, yet lets a 512 KiB request use two cores.
    const PlanLimits limits =
        WithOverrides({256 << 10, 256 << 10, CmaTransport::max_slices_per_batch()}, options_);
    *route = std::make_shared<HostRoute>("cma", std::move(link), limits);
    return Status::Ok();
  }

 private:
  uint64_t cookie_ = 0;  // holds our incarnation; its address is in the hello
  EngineOptions options_;
};

}  // namespace

std::unique_ptr<Backend> MakeCmaBackend() { return std::make_unique<CmaBackend>(); }

}  // namespace xfer::transport
