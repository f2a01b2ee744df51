// The cuda backend: whether CUDA is usable, what memory a pointer is, page-locked and device
// memory, and the description for xfer-info.
#include "transport/common/cuda/cuda_common.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "util/text.h"

namespace xfer::transport::cuda {
using namespace detail;
using text::Hex;
namespace {

// ---- Pinned host ranges ------------------------------------------------------------------

// Ranges PinHost registered, with how many PinHost calls hold each: UnpinHost unregisters only
// what it registered, never memory its owner page-locked itself.
std::mutex pinned_mu;
std::map<void*, int>& Pinned() {
  // Never destroyed: an engine torn down by a static destructor may still unpin.
  static auto* m = new std::map<void*, int>();
  return *m;
}

}  // namespace

bool Available(std::string* why) {
  const Probe& p = GetProbe();
  if (!p.ok && why != nullptr) *why = p.why;
  return p.ok;
}

void Classify(const void* p, MemType* type, int32_t* device) {
  *type = MemType::kHost;
  *device = -1;
  if (p == nullptr || !Usable()) return;
  cudaPointerAttributes a{};
  const cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  if (a.type == cudaMemoryTypeDevice) {
    *type = MemType::kCuda;
    *device = a.device;
  }
}

Status PinHost(void* p, uint64_t len, bool read_only) {
  const std::string what =
      "page-lock " + Hex(reinterpret_cast<uint64_t>(p)) + " (" + std::to_string(len) + " bytes)";
  if (p == nullptr || len == 0)
    return {StatusCode::kInvalidArgument, "cuda: " + what + ": null address or zero length"};
  if (!Usable()) return NotUsable(what);
  std::lock_guard<std::mutex> lock(pinned_mu);
  auto it = Pinned().find(p);
  if (it != Pinned().end()) {
    ++it->second;
    return Status::Ok();
  }
  const cudaError_t e =
      cudaHostRegister(p, len, cudaHostRegisterPortable | (read_only ? cudaHostRegisterReadOnly : 0u));
  if (e == cudaErrorHostMemoryAlreadyRegistered) {  // by its owner: already page-locked, not ours
    cudaGetLastError();
    return Status::Ok();
  }
  if (e != cudaSuccess) return RtFail(what, "cudaHostRegister", e);
  Pinned()[p] = 1;
  return Status::Ok();
}

void UnpinHost(void* p) {
  if (p == nullptr || !Usable()) return;
  std::lock_guard<std::mutex> lock(pinned_mu);
  auto it = Pinned().find(p);
  if (it == Pinned().end() || --it->second > 0) return;
  Pinned().erase(it);
  if (Exiting()) return;  // the runtime is going: the process's end unlocks it
  if (cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
}

Status AllocPinned(uint64_t len, void** p) {
  const std::string what = "allocate " + std::to_string(len) + " bytes of page-locked host memory";
  if (p != nullptr) *p = nullptr;  // whatever the outcome, nothing to free on failure
  if (p == nullptr || len == 0)
    return {StatusCode::kInvalidArgument, "cuda: " + what + ": null output or zero length"};
  if (!Usable()) return NotUsable(what);
  const cudaError_t e = cudaHostAlloc(p, len, cudaHostAllocPortable);
  if (e != cudaSuccess) {
    *p = nullptr;
    return RtFail(what, "cudaHostAlloc", e);
  }
  return Status::Ok();
}

void FreePinned(void* p) {
  if (p == nullptr || !Usable() || Exiting()) return;
  if (cudaFreeHost(p) != cudaSuccess) cudaGetLastError();
}

Status AllocDevice(uint64_t len, int32_t device, void** p) {
  const std::string what = "allocate " + std::to_string(len) + " bytes on device " +
                           (device == -1 ? std::string("(current)") : std::to_string(device));
  if (p != nullptr) *p = nullptr;  // whatever the outcome, nothing to free on failure
  if (p == nullptr || len == 0)
    return {StatusCode::kInvalidArgument, "cuda: " + what + ": null output or zero length"};
  // Before CUDA is asked anything (so in every build, and without a GPU too).
  if (device < -1) {
    return {StatusCode::kInvalidArgument,
            "cuda: " + what + ": a device ordinal, or -1 for the current device"};
  }
  if (!Usable()) return NotUsable(what);
  if (device >= GetProbe().devices) {
    return {StatusCode::kInvalidArgument,
            "cuda: " + what + ": this process sees " + std::to_string(GetProbe().devices) + " device(s)"};
  }
  DeviceScope scope(device);
  if (scope.error() != cudaSuccess) return RtFail(what, "cudaSetDevice", scope.error());
  void* mem = nullptr;
  cudaError_t e = cudaMalloc(&mem, len);
  if (e != cudaSuccess) return RtFail(what, "cudaMalloc", e);
  // Zeroed, as AllocMem promises (host memory comes zeroed from the kernel). On the legacy
  // default stream, waited for here: the copies on our non-blocking streams, and the caller's
  // own work, do not wait for that stream.
  const char* call = "cudaMemset";
  e = cudaMemset(mem, 0, len);
  if (e == cudaSuccess) {
    call = "cudaStreamSynchronize";
    e = cudaStreamSynchronize(nullptr);
  }
  if (e != cudaSuccess) {
    Status s = RtFail(what, call, e);
    if (cudaFree(mem) != cudaSuccess) cudaGetLastError();
    return s;
  }
  *p = mem;
  return Status::Ok();
}

void FreeDevice(void* p) {
  if (p == nullptr || !Usable()) return;
  MemoryFreed();
  if (Exiting()) return;  // the process's end frees it
  DeviceScope scope(DeviceOf(p));
  if (cudaFree(p) != cudaSuccess) cudaGetLastError();
}

std::string Describe() {
  const Probe& probe = GetProbe();
  if (!probe.ok) return "CUDA: not usable here: " + probe.why;
  auto version = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
  int runtime = 0, driver = 0;
  if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) cudaGetLastError();
  if (cudaDriverGetVersion(&driver) != cudaSuccess) cudaGetLastError();
  std::string out = "CUDA runtime " + version(runtime) + ", driver " + version(driver);
  for (int i = 0; i < probe.devices; ++i) {
    out += "\ndevice " + std::to_string(i) + ": ";
    cudaDeviceProp prop{};
    cudaError_t e = cudaGetDeviceProperties(&prop, i);
    if (e != cudaSuccess) {
      out += RtErr("cudaGetDeviceProperties", e);
      continue;
    }
    char bus[32] = {};
    e = cudaDeviceGetPCIBusId(bus, sizeof bus, i);
    if (e != cudaSuccess) {
      cudaGetLastError();
      std::snprintf(bus, sizeof bus, "?");
    }
    char mem[32];
    std::snprintf(mem, sizeof mem, "%.1f GiB", static_cast<double>(prop.totalGlobalMem) / (1ull << 30));
    out += std::string(prop.name) + ", " + mem + ", PCI " + bus + ", compute " + std::to_string(prop.major) +
           "." + std::to_string(prop.minor);
  }
  return out;
}

}  // namespace xfer::transport::cuda
