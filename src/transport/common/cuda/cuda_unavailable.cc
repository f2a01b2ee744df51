// The cuda transport's calls in a build without the CUDA toolkit: every pointer is host memory,
// and everything else says why it cannot be done.
#include "transport/common/cuda/cuda_api.h"

#include <string>

namespace xfer::transport::cuda {
namespace {

constexpr const char* kWhy = "this build has no CUDA (the CUDA toolkit was not found at build time)";

Status No(const char* what) { return {StatusCode::kUnsupported, std::string("cuda: ") + what + ": " + kWhy}; }

}  // namespace

bool Available(std::string* why) {
  if (why != nullptr) *why = kWhy;
  return false;
}

void Classify(const void*, MemType* type, int32_t* device) {
  *type = MemType::kHost;
  *device = -1;
}

Status Export::Create(uint64_t, uint64_t, std::unique_ptr<Export>*) { return No("export"); }

Status Open(const std::string&, uint64_t, const TakeFd&, std::shared_ptr<Mapping>*) {
  return No("open region");
}

Status Copy(Op, std::span<const Slice>, std::chrono::steady_clock::time_point) { return No("copy"); }
Status StartCopy(Op, std::span<const Slice>) { return No("copy"); }
Status FinishCopy(std::chrono::steady_clock::time_point) { return Status::Ok(); }
Status StartSideCopy(Op, std::span<const Slice>) { return No("copy"); }
Status FinishSideCopy(std::chrono::steady_clock::time_point) { return Status::Ok(); }

Status PinHost(void*, uint64_t, bool) { return No("page-lock host memory"); }
void UnpinHost(void*) {}
Status AllocPinned(uint64_t, void** p) {
  if (p != nullptr) *p = nullptr;
  return No("allocate page-locked host memory");
}
void FreePinned(void*) {}
Status AllocDevice(uint64_t len, int32_t device, void** p) {
  if (p != nullptr) *p = nullptr;
  // The argument checks of cuda_memory.cc, which come before any CUDA call there too.
  if (p == nullptr || len == 0)
    return {StatusCode::kInvalidArgument, "cuda: allocate device memory: null output or zero length"};
  if (device < -1) {
    return {StatusCode::kInvalidArgument, "cuda: allocate device memory on device " + std::to_string(device) +
                                              ": a device ordinal, or -1 for the current device"};
  }
  return No("allocate device memory");
}
void FreeDevice(void*) {}

std::string Describe() { return std::string("CUDA: not built: ") + kWhy; }

}  // namespace xfer::transport::cuda
