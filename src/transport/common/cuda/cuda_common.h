// Shared by the cuda backend's files (cuda_ipc.cc, cuda_copy.cc, cuda_memory.cc): whether
// CUDA is usable here, errors as statuses, the driver API's entry points (resolved through the
// runtime, so nothing links libcuda), the current device, and the count of freed memory. Only
// in builds with the CUDA toolkit.
#pragma once

#include <cuda.h>  // types and enums of the driver API only; the functions come from Driver()
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include "transport/common/cuda/cuda_api.h"

namespace xfer::transport::cuda::detail {

// ---- Availability ------------------------------------------------------------------------

struct Probe {
  bool ok = false;
  int devices = 0;
  std::string why;
};

// Set by an exit handler that runs before the runtime's own teardown (see GetProbe): from then
// on, destructors that would hand CUDA resources back (thread-local streams, mappings, device and
// pinned memory of engines destroyed by static destructors) leave them to the process's end
// instead of calling into a runtime that is unloading.
inline std::atomic<bool> exiting{false};

inline bool Exiting() { return exiting.load(std::memory_order_relaxed); }

// Asks once. The driver library is looked for before the first runtime call: without it the
// runtime can only say "driver version is insufficient", and a process that never calls into
// CUDA keeps none of the runtime's state. Never destroyed (like everything below that outlives
// static destructors): an Engine destroyed by a static destructor after this function's
// statics would still ask Usable() / NotUsable().
inline const Probe& GetProbe() {
  static std::once_flag once;
  static Probe* const probe = new Probe();
  std::call_once(once, [] {
    // Kept loaded: the runtime loads the same library right after.
    if (::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL) == nullptr) {
      const char* e = ::dlerror();
      probe->why = std::string("no CUDA driver/GPU: the driver library libcuda.so.1 cannot be loaded (") +
                   (e ? e : "dlopen failed") + ")";
      return;
    }
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    // Registered after the runtime's first call, hence after whatever teardown the runtime
    // registers then: exit handlers run in reverse order, so this one runs before it.
    std::atexit([] { exiting.store(true, std::memory_order_relaxed); });
    if (e != cudaSuccess) {
      cudaGetLastError();
      probe->why = std::string("no CUDA driver/GPU: ") + cudaGetErrorString(e);
      return;
    }
    if (n <= 0) {
      probe->why = "no CUDA driver/GPU: the driver sees no CUDA device";
      return;
    }
    probe->ok = true;
    probe->devices = n;
  });
  return *probe;
}

inline bool Usable() { return GetProbe().ok; }

inline Status NotUsable(const std::string& what) {
  return {StatusCode::kUnsupported, "cuda: " + what + ": " + GetProbe().why};
}

// ---- Errors ------------------------------------------------------------------------------

inline StatusCode CodeOf(cudaError_t e) {
  switch (e) {
    case cudaErrorMemoryAllocation:
      return StatusCode::kResourceExhausted;
    case cudaErrorNotSupported:
      return StatusCode::kUnsupported;
    default:
      return StatusCode::kInternal;
  }
}

// "call: <text> (<name>)", after clearing the thread's last error so that the failure stays ours.
inline std::string RtErr(const char* call, cudaError_t e) {
  cudaGetLastError();
  return std::string(call) + ": " + cudaGetErrorString(e) + " (" + cudaGetErrorName(e) + ")";
}

inline Status RtFail(const std::string& what, const char* call, cudaError_t e) {
  return {CodeOf(e), "cuda: " + what + ": " + RtErr(call, e)};
}

// ---- Driver entry points -----------------------------------------------------------------

struct DriverApi {
  PFN_cuGetErrorString_v6000 GetErrorString = nullptr;
  PFN_cuMemGetAddressRange_v3020 MemGetAddressRange = nullptr;
  PFN_cuMemRetainAllocationHandle_v11000 MemRetainAllocationHandle = nullptr;
  PFN_cuMemGetAllocationPropertiesFromHandle_v10020 MemGetAllocationPropertiesFromHandle = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 MemExportToShareableHandle = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 MemImportFromShareableHandle = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 MemGetAllocationGranularity = nullptr;
  PFN_cuMemAddressReserve_v10020 MemAddressReserve = nullptr;
  PFN_cuMemAddressFree_v10020 MemAddressFree = nullptr;
  PFN_cuMemMap_v10020 MemMap = nullptr;
  PFN_cuMemUnmap_v10020 MemUnmap = nullptr;
  PFN_cuMemSetAccess_v10020 MemSetAccess = nullptr;
  PFN_cuMemRelease_v10020 MemRelease = nullptr;
  PFN_cuCtxGetCurrent_v4000 CtxGetCurrent = nullptr;
  PFN_cuCtxSetCurrent_v4000 CtxSetCurrent = nullptr;
};

// Each function in the ABI version its typedef names (the number after _v). Null when the
// driver lacks it; callers say so.
template <typename Fn>
inline void Resolve(const char* symbol, unsigned version, Fn* fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  const cudaError_t e = cudaGetDriverEntryPointByVersion(symbol, &p, version, cudaEnableDefault, &q);
#else
  (void)version;  // older runtimes: the version of the toolkit's headers
  const cudaError_t e = cudaGetDriverEntryPoint(symbol, &p, cudaEnableDefault, &q);
#endif
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    p = nullptr;
  }
  *fn = reinterpret_cast<Fn>(p);
}

// Only called once Usable(). Plain function pointers: nothing to destroy at exit.
inline const DriverApi& Driver() {
  static std::once_flag once;
  static DriverApi d;
  std::call_once(once, [] {
    Resolve("cuGetErrorString", 6000, &d.GetErrorString);
    Resolve("cuMemGetAddressRange", 3020, &d.MemGetAddressRange);
    Resolve("cuMemRetainAllocationHandle", 11000, &d.MemRetainAllocationHandle);
    Resolve("cuMemGetAllocationPropertiesFromHandle", 10020, &d.MemGetAllocationPropertiesFromHandle);
    Resolve("cuMemExportToShareableHandle", 10020, &d.MemExportToShareableHandle);
    Resolve("cuMemImportFromShareableHandle", 10020, &d.MemImportFromShareableHandle);
    Resolve("cuMemGetAllocationGranularity", 10020, &d.MemGetAllocationGranularity);
    Resolve("cuMemAddressReserve", 10020, &d.MemAddressReserve);
    Resolve("cuMemAddressFree", 10020, &d.MemAddressFree);
    Resolve("cuMemMap", 10020, &d.MemMap);
    Resolve("cuMemUnmap", 10020, &d.MemUnmap);
    Resolve("cuMemSetAccess", 10020, &d.MemSetAccess);
    Resolve("cuMemRelease", 10020, &d.MemRelease);
    Resolve("cuCtxGetCurrent", 4000, &d.CtxGetCurrent);
    Resolve("cuCtxSetCurrent", 4000, &d.CtxSetCurrent);
  });
  return d;
}

inline std::string DrvErr(const char* call, CUresult r) {
  const char* s = nullptr;
  if (Driver().GetErrorString == nullptr || Driver().GetErrorString(r, &s) != CUDA_SUCCESS) s = nullptr;
  return std::string(call) + ": " + (s ? s : "CUresult") + " (" + std::to_string(static_cast<int>(r)) + ")";
}

inline StatusCode CodeOf(CUresult r) {
  switch (r) {
    case CUDA_ERROR_OUT_OF_MEMORY:
      return StatusCode::kResourceExhausted;
    case CUDA_ERROR_NOT_SUPPORTED:
      return StatusCode::kUnsupported;
    default:
      return StatusCode::kInternal;
  }
}

// Null entry points make a status, so every call site reads the same.
#define XFER_NEED_DRIVER(fn, what)                                                        \
  do {                                                                                    \
    if (Driver().fn == nullptr)                                                           \
      return {StatusCode::kUnsupported,                                                   \
              std::string("cuda: ") + (what) + ": the driver has no entry point cu" #fn}; \
  } while (0)

// ---- Current device ----------------------------------------------------------------------

// Makes `device` current on this thread for a scope, then puts back what was there:
//  - device < 0, or `device` already current with a context current (primary or not): nothing
//    at all. No context is made on another GPU (GPU 0 above all), and a context the caller made
//    current is never replaced.
//  - `device` is the thread's device but no context is current yet (a thread new to CUDA): its
//    primary context is made current (cudaSetDevice; the driver API calls made under the scope
//    need one) and stays: that is what the thread's next runtime call would do anyway, and the
//    next scope then has nothing to do.
//  - another device: cudaSetDevice(device) for the scope; then the thread's previous context
//    comes back, the very same one (cuCtxSetCurrent), so a non-primary context is not replaced
//    by its device's primary one. A thread that had no context keeps `device`'s: going back
//    with cudaSetDevice would create a context on its old device just to say so.
// Only with a usable GPU (the driver entry points are resolved).
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (device < 0) return;
    const DriverApi& d = Driver();
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess) {
      cudaGetLastError();
      cur = -1;
    }
    CUcontext ctx = nullptr;
    const bool ctx_known = d.CtxGetCurrent != nullptr && d.CtxGetCurrent(&ctx) == CUDA_SUCCESS;
    if (!ctx_known) ctx = nullptr;
    if (cur == device && (ctx != nullptr || !ctx_known)) return;
    err_ = cudaSetDevice(device);
    if (err_ != cudaSuccess) {
      cudaGetLastError();
      return;
    }
    if (cur == device) return;  // the thread's own device, bound: nothing to give back
    if (ctx_known && d.CtxSetCurrent != nullptr) {
      prev_ctx_ = ctx;  // null: nothing to give back
    } else {
      prev_device_ = cur;
    }
  }
  ~DeviceScope() {
    if (Exiting()) return;
    if (prev_ctx_ != nullptr) {
      Driver().CtxSetCurrent(prev_ctx_);
    } else if (prev_device_ >= 0 && cudaSetDevice(prev_device_) != cudaSuccess) {
      cudaGetLastError();
    }
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  cudaError_t error() const { return err_; }

 private:
  cudaError_t err_ = cudaSuccess;
  CUcontext prev_ctx_ = nullptr;  // what to make current again, or null
  int prev_device_ = -1;          // without the driver's context calls: the device to set again
};

// The device of device memory, or -1 (any other pointer).
inline int DeviceOf(const void* p) {
  MemType type = MemType::kHost;
  int32_t device = -1;
  Classify(p, &type, &device);
  return type == MemType::kCuda ? device : -1;
}

// ---- Freed memory ------------------------------------------------------------------------

// Counts device memory handed back (FreeDevice, closed mappings): Copy's per-thread record of
// the last allocation it looked up is only trusted while this has not moved.
inline std::atomic<uint64_t> freed_generation{0};

inline void MemoryFreed() { freed_generation.fetch_add(1, std::memory_order_release); }

}  // namespace xfer::transport::cuda::detail
