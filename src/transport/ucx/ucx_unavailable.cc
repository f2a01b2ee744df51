// The ucx transport in a build without UCX (CMake did not find libucx-dev): it never starts,
// and says how to get it.
#include "transport/ucx/ucx_transport.h"

namespace xfer::transport {

struct UcxTransport::Impl {};

namespace {
Status NotBuilt() {
  return {StatusCode::kUnsupported,
          "ucx: this build has no UCX (install libucx-dev, e.g. scripts/setup.sh, and rebuild)"};
}
}  // namespace

UcxTransport::UcxTransport(UcxOptions) {}
UcxTransport::~UcxTransport() = default;
Status UcxTransport::Start() { return NotBuilt(); }
void UcxTransport::Stop() {}
const std::string& UcxTransport::worker_address() const {
  static const std::string none;
  return none;
}
bool UcxTransport::cuda_memory() const { return false; }
Status UcxTransport::MapMemory(uint64_t, uint64_t, std::unique_ptr<UcxMemory>*, bool, bool) {
  return NotBuilt();
}
Status UcxTransport::Connect(const UcxPeer&, std::shared_ptr<Link>*) { return NotBuilt(); }
PlanLimits UcxTransport::Limits(const EngineOptions& o) const {
  return WithOverrides({1 << 20, 1 << 20, 1024}, o);
}
std::string UcxTransport::Describe() { return "not built (UCX was not found at build time)"; }
std::string UcxTransport::GpuVerdict(bool) { return "through the buffer pool (this build has no UCX)"; }

}  // namespace xfer::transport
