// The cuda transport's CUDA calls, on the CUDA runtime (linked statically: cudart_static). Host
// code only, built by the C++ compiler. Driver API functions (address ranges, VMM export and
// import) come through the runtime's driver entry points, so nothing links libcuda: on a machine
// without the driver this file says so and never calls into CUDA.
#include "transport/cuda/cuda_api.h"

#include <cuda.h>  // types and enums of the driver API only; the functions come from Driver()
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "util/text.h"

namespace xfer::transport::cuda {
using text::Hex;
namespace {

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
std::atomic<bool> exiting{false};

bool Exiting() { return exiting.load(std::memory_order_relaxed); }

// Asks once. The driver library is looked for before the first runtime call: without it the
// runtime can only say "driver version is insufficient", and a process that never calls into
// CUDA keeps none of the runtime's state. Never destroyed (like everything below that outlives
// static destructors): an Engine destroyed by a static destructor after this function's
// statics would still ask Usable() / NotUsable().
const Probe& GetProbe() {
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

bool Usable() { return GetProbe().ok; }

Status NotUsable(const std::string& what) {
  return {StatusCode::kUnsupported, "cuda: " + what + ": " + GetProbe().why};
}

// ---- Errors ------------------------------------------------------------------------------

StatusCode CodeOf(cudaError_t e) {
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
std::string RtErr(const char* call, cudaError_t e) {
  cudaGetLastError();
  return std::string(call) + ": " + cudaGetErrorString(e) + " (" + cudaGetErrorName(e) + ")";
}

Status RtFail(const std::string& what, const char* call, cudaError_t e) {
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
void Resolve(const char* symbol, unsigned version, Fn* fn) {
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
const DriverApi& Driver() {
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

std::string DrvErr(const char* call, CUresult r) {
  const char* s = nullptr;
  if (Driver().GetErrorString == nullptr || Driver().GetErrorString(r, &s) != CUDA_SUCCESS) s = nullptr;
  return std::string(call) + ": " + (s ? s : "CUresult") + " (" + std::to_string(static_cast<int>(r)) + ")";
}

StatusCode CodeOf(CUresult r) {
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
int DeviceOf(const void* p) {
  MemType type = MemType::kHost;
  int32_t device = -1;
  Classify(p, &type, &device);
  return type == MemType::kCuda ? device : -1;
}

// ---- Blob --------------------------------------------------------------------------------
//
// Little-endian record, one of two lengths:
//   0  4  magic "xCUD"
//   4  1  version (1)
//   5  1  kind: 1 = CUDA IPC (cudaMalloc memory), 2 = VMM (POSIX file descriptor)
//   6  2  zero
//   8  4  device ordinal of the allocation in the owner (i32)
//  12  4  vmm: the owner's file descriptor (i32); ipc: -1
//  16  8  offset of the region's first byte from the allocation's base (u64)
//  24  8  allocation size (u64)
//  32 64  ipc only: cudaIpcMemHandle_t
// ipc: 96 bytes, vmm: 32 bytes.

constexpr char kMagic[4] = {'x', 'C', 'U', 'D'};
constexpr uint8_t kVersion = 1;
constexpr uint8_t kKindIpc = 1;
constexpr uint8_t kKindVmm = 2;
constexpr size_t kHeaderBytes = 32;
constexpr size_t kIpcHandleBytes = sizeof(cudaIpcMemHandle_t);
static_assert(kIpcHandleBytes == 64);

struct Record {
  uint8_t kind = 0;
  int32_t device = -1;
  int32_t fd = -1;
  uint64_t offset = 0;
  uint64_t alloc_size = 0;
  cudaIpcMemHandle_t ipc{};
};

template <typename T>
void Put(std::string* out, size_t at, T v) {
  for (size_t i = 0; i < sizeof(T); ++i)
    (*out)[at + i] = static_cast<char>(static_cast<uint64_t>(v) >> (8 * i) & 0xff);
}

template <typename T>
T Get(const std::string& in, size_t at) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= uint64_t{static_cast<uint8_t>(in[at + i])} << (8 * i);
  return static_cast<T>(v);
}

std::string Encode(const Record& r) {
  std::string b(kHeaderBytes + (r.kind == kKindIpc ? kIpcHandleBytes : 0), '\0');
  std::memcpy(b.data(), kMagic, sizeof kMagic);
  b[4] = static_cast<char>(kVersion);
  b[5] = static_cast<char>(r.kind);
  Put<uint32_t>(&b, 8, static_cast<uint32_t>(r.device));
  Put<uint32_t>(&b, 12, static_cast<uint32_t>(r.fd));
  Put<uint64_t>(&b, 16, r.offset);
  Put<uint64_t>(&b, 24, r.alloc_size);
  if (r.kind == kKindIpc) std::memcpy(b.data() + kHeaderBytes, &r.ipc, kIpcHandleBytes);
  return b;
}

// Checks everything a blob can get wrong without calling into CUDA.
Status Decode(const std::string& b, uint64_t len, Record* r) {
  auto bad = [](const std::string& why) {
    return Status(StatusCode::kInvalidArgument, "cuda: bad region handle: " + why);
  };
  if (b.size() < kHeaderBytes) {
    return bad(std::to_string(b.size()) + " bytes, shorter than its " + std::to_string(kHeaderBytes) +
               "-byte header");
  }
  if (std::memcmp(b.data(), kMagic, sizeof kMagic) != 0) return bad("not a cuda region handle (magic)");
  if (static_cast<uint8_t>(b[4]) != kVersion) {
    return bad("version " + std::to_string(static_cast<uint8_t>(b[4])) + ", this build reads " +
               std::to_string(kVersion));
  }
  r->kind = static_cast<uint8_t>(b[5]);
  if (r->kind != kKindIpc && r->kind != kKindVmm) return bad("unknown kind " + std::to_string(r->kind));
  const size_t want = kHeaderBytes + (r->kind == kKindIpc ? kIpcHandleBytes : 0);
  if (b.size() != want) {
    return bad(std::to_string(b.size()) + " bytes for a " + (r->kind == kKindIpc ? "ipc" : "vmm") +
               " handle of " + std::to_string(want));
  }
  r->device = static_cast<int32_t>(Get<uint32_t>(b, 8));
  r->fd = static_cast<int32_t>(Get<uint32_t>(b, 12));
  r->offset = Get<uint64_t>(b, 16);
  r->alloc_size = Get<uint64_t>(b, 24);
  if (r->kind == kKindIpc) std::memcpy(&r->ipc, b.data() + kHeaderBytes, kIpcHandleBytes);
  if (r->device < 0) return bad("device " + std::to_string(r->device));
  if (r->kind == kKindVmm && r->fd < 0) return bad("descriptor " + std::to_string(r->fd));
  if (r->alloc_size == 0) return bad("empty allocation");
  if (r->offset >= r->alloc_size) {
    return bad("offset " + std::to_string(r->offset) + " is outside its allocation of " +
               std::to_string(r->alloc_size) + " bytes");
  }
  if (len == 0) return {StatusCode::kInvalidArgument, "cuda: a region of zero length"};
  if (len > r->alloc_size - r->offset) {
    return {StatusCode::kInvalidArgument, "cuda: the region (" + std::to_string(len) + " bytes at offset " +
                                              std::to_string(r->offset) + ") ends past its allocation of " +
                                              std::to_string(r->alloc_size) + " bytes"};
  }
  return Status::Ok();
}

// ---- Export ------------------------------------------------------------------------------

class ExportImpl final : public Export {
 public:
  ExportImpl(std::string blob, int fd) : blob_(std::move(blob)), fd_(fd) {}
  ~ExportImpl() override {
    if (fd_ >= 0) ::close(fd_);
  }
  const std::string& blob() const override { return blob_; }

 private:
  std::string blob_;
  int fd_;  // vmm: the exported descriptor, which the peer takes with pidfd_getfd
};

// ---- Freed memory ------------------------------------------------------------------------

// Counts device memory handed back (FreeDevice, closed mappings): Copy's per-thread record of
// the last allocation it looked up is only trusted while this has not moved.
std::atomic<uint64_t> freed_generation{0};

void MemoryFreed() { freed_generation.fetch_add(1, std::memory_order_release); }

// ---- Mappings ----------------------------------------------------------------------------

class IpcMapping final : public Mapping {
 public:
  IpcMapping(void* opened, uint64_t offset, int device) : opened_(opened), offset_(offset), device_(device) {}
  ~IpcMapping() override {
    MemoryFreed();
    if (Exiting()) return;  // the process's end closes it
    DeviceScope scope(device_);
    if (cudaIpcCloseMemHandle(opened_) != cudaSuccess) cudaGetLastError();
  }
  uint8_t* base() const override { return static_cast<uint8_t*>(opened_) + offset_; }

 private:
  void* opened_;
  uint64_t offset_;
  int device_;  // where it was opened (-1: the current device then)
};

class VmmMapping final : public Mapping {
 public:
  VmmMapping(CUmemGenericAllocationHandle handle, CUdeviceptr va, uint64_t reserved, uint64_t mapped,
             uint64_t offset)
      : handle_(handle), va_(va), reserved_(reserved), mapped_(mapped), offset_(offset) {}
  ~VmmMapping() override {
    MemoryFreed();
    if (Exiting()) return;  // the process's end unmaps it
    const DriverApi& d = Driver();
    d.MemUnmap(va_, mapped_);
    d.MemAddressFree(va_, reserved_);
    d.MemRelease(handle_);
  }
  uint8_t* base() const override { return reinterpret_cast<uint8_t*>(va_ + offset_); }

 private:
  CUmemGenericAllocationHandle handle_;
  CUdeviceptr va_;
  uint64_t reserved_;
  uint64_t mapped_;
  uint64_t offset_;
};

uint64_t RoundUp(uint64_t n, uint64_t to) { return to == 0 ? n : (n + to - 1) / to * to; }

Status OpenIpc(const Record& r, std::shared_ptr<Mapping>* out) {
  // Opened on the owner's device ordinal when this process has it, else on the current one
  // (peer access is enabled lazily either way).
  const int device = r.device < GetProbe().devices ? r.device : -1;
  DeviceScope scope(device);
  if (scope.error() != cudaSuccess) return RtFail("open ipc region", "cudaSetDevice", scope.error());
  void* p = nullptr;
  const cudaError_t e = cudaIpcOpenMemHandle(&p, r.ipc, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess) {
    const StatusCode code = e == cudaErrorMapBufferObjectFailed || e == cudaErrorInvalidResourceHandle
                                ? StatusCode::kRemoteAccessDenied
                                : CodeOf(e);
    return {code, "cuda: open ipc region of device " + std::to_string(r.device) + ": " +
                      RtErr("cudaIpcOpenMemHandle", e)};
  }
  *out = std::make_shared<IpcMapping>(p, r.offset, device);
  return Status::Ok();
}

Status OpenVmm(const Record& r, const TakeFd& take_fd, std::shared_ptr<Mapping>* out) {
  const std::string what =
      "open vmm region (descriptor " + std::to_string(r.fd) + ", device " + std::to_string(r.device) + ")";
  XFER_NEED_DRIVER(MemImportFromShareableHandle, what);
  XFER_NEED_DRIVER(MemGetAllocationPropertiesFromHandle, what);
  XFER_NEED_DRIVER(MemGetAllocationGranularity, what);
  XFER_NEED_DRIVER(MemAddressReserve, what);
  XFER_NEED_DRIVER(MemAddressFree, what);
  XFER_NEED_DRIVER(MemMap, what);
  XFER_NEED_DRIVER(MemUnmap, what);
  XFER_NEED_DRIVER(MemSetAccess, what);
  XFER_NEED_DRIVER(MemRelease, what);
  if (!take_fd) return {StatusCode::kUnsupported, "cuda: " + what + ": no way to take the peer's descriptor"};
  const DriverApi& d = Driver();
  const int device = r.device < GetProbe().devices ? r.device : -1;
  DeviceScope scope(device);
  if (scope.error() != cudaSuccess) return RtFail(what, "cudaSetDevice", scope.error());

  int fd = -1;
  Status s = take_fd(r.fd, &fd);
  if (!s.ok()) return {s.code(), "cuda: " + what + ": " + s.message()};
  CUmemGenericAllocationHandle h = 0;
  CUresult c = d.MemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  ::close(fd);  // the imported handle keeps the memory
  if (c != CUDA_SUCCESS) {
    return {c == CUDA_ERROR_INVALID_VALUE ? StatusCode::kRemoteAccessDenied : CodeOf(c),
            "cuda: " + what + ": " + DrvErr("cuMemImportFromShareableHandle", c)};
  }
  // Where the memory lives, as this process numbers devices; the blob's ordinal if the driver
  // cannot say.
  CUmemAllocationProp prop{};
  c = d.MemGetAllocationPropertiesFromHandle(&prop, h);
  if (c != CUDA_SUCCESS) {
    prop = CUmemAllocationProp{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = r.device;
  }
  size_t granularity = 0;
  c = d.MemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (c != CUDA_SUCCESS) {
    d.MemRelease(h);
    return {CodeOf(c), "cuda: " + what + ": " + DrvErr("cuMemGetAllocationGranularity", c)};
  }
  const uint64_t reserved = RoundUp(r.alloc_size, granularity);
  CUdeviceptr va = 0;
  c = d.MemAddressReserve(&va, reserved, 0, 0, 0);
  if (c != CUDA_SUCCESS) {
    d.MemRelease(h);
    return {CodeOf(c), "cuda: " + what + ": " + DrvErr("cuMemAddressReserve", c) + " (" +
                           std::to_string(reserved) + " bytes)"};
  }
  c = d.MemMap(va, r.alloc_size, 0, h, 0);
  if (c != CUDA_SUCCESS) {
    d.MemAddressFree(va, reserved);
    d.MemRelease(h);
    return {CodeOf(c),
            "cuda: " + what + ": " + DrvErr("cuMemMap", c) + " (" + std::to_string(r.alloc_size) + " bytes)"};
  }
  // Read/write access: for the memory's own device (required), then for every other device of
  // this process that reaches it directly, so that a copy issued from any of their streams
  // cannot fault: the device the import landed on and the peers of the memory's device. Those
  // grants are best effort, each on its own: without one, copies from that device's streams
  // fail on this region (cudaMemcpy reports it) rather than the whole import.
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  c = d.MemSetAccess(va, r.alloc_size, &access, 1);
  if (c != CUDA_SUCCESS) {
    d.MemUnmap(va, r.alloc_size);
    d.MemAddressFree(va, reserved);
    d.MemRelease(h);
    return {CodeOf(c), "cuda: " + what + ": " + DrvErr("cuMemSetAccess", c)};
  }
  if (prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
    const int owner = prop.location.id;
    int landed = device;
    if (landed < 0 && cudaGetDevice(&landed) != cudaSuccess) {
      cudaGetLastError();
      landed = -1;
    }
    for (int dev = 0; dev < GetProbe().devices; ++dev) {
      if (dev == owner) continue;
      int peer = 0;
      if (dev != landed) {
        const cudaError_t pe = cudaDeviceCanAccessPeer(&peer, dev, owner);
        if (pe != cudaSuccess) {
          cudaGetLastError();
          peer = 0;
        }
        if (peer == 0) continue;
      }
      CUmemAccessDesc more{};
      more.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      more.location.id = dev;
      more.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      (void)d.MemSetAccess(va, r.alloc_size, &more, 1);  // best effort (see above)
    }
  }
  *out = std::make_shared<VmmMapping>(h, va, reserved, r.alloc_size, r.offset);
  return Status::Ok();
}

// ---- Copy --------------------------------------------------------------------------------

// What a thread copies with: for each device, a non-blocking stream and a completion event,
// made on first use with that device current (they belong to its primary context, and the
// batches of that device are issued on them, with it current); and the last device allocation a
// batch was found in, so that batch after batch over the same allocation asks CUDA nothing.
class ThreadCopier {
 public:
  ThreadCopier() = default;
  ThreadCopier(const ThreadCopier&) = delete;
  ThreadCopier& operator=(const ThreadCopier&) = delete;

  // At thread exit. After the exit handler of GetProbe, the runtime is (about to be) torn down:
  // the process's end takes the streams. Before, errors (cudaErrorCudartUnloading among them,
  // should the runtime be gone anyway) are cleared and otherwise ignored. No device switch: a
  // stream and an event are destroyed from any device.
  ~ThreadCopier() {
    if (Exiting()) return;
    for (PerDevice& p : per_device_) {
      if (p.done != nullptr && cudaEventDestroy(p.done) != cudaSuccess) cudaGetLastError();
      if (p.stream != nullptr && cudaStreamDestroy(p.stream) != cudaSuccess) cudaGetLastError();
    }
  }

  // The device of the remembered allocation if a slice side lies in it (and no device memory
  // was freed here since it was remembered); else -1. Memory its owner frees behind our back
  // (registered cudaMalloc memory) can leave the record stale: that only picks another device's
  // stream for the batch, whose copies still go by unified addressing (cudaMemcpyDefault).
  int Remembered(std::span<const Slice> slices, uint64_t generation) const {
    if (range_end_ == 0 || range_generation_ != generation) return -1;
    for (const Slice& sl : slices) {
      if (sl.len == 0) continue;
      if (In(sl.local) || In(sl.remote)) return range_device_;
    }
    return -1;
  }

  // Remembers the allocation around `addr`, on `device` (current: the driver's range query
  // wants a context). Quietly nothing if the driver cannot say.
  void Remember(uint64_t addr, int device, uint64_t generation) {
    const DriverApi& d = Driver();
    if (d.MemGetAddressRange == nullptr) return;
    CUdeviceptr base = 0;
    size_t size = 0;
    if (d.MemGetAddressRange(&base, &size, static_cast<CUdeviceptr>(addr)) != CUDA_SUCCESS || size == 0) return;
    range_base_ = base;
    range_end_ = base + size;
    range_device_ = device;
    range_generation_ = generation;
  }

  // The stream and event of `device`, made on first use; `device` must be current.
  Status Get(int device, cudaStream_t* stream, cudaEvent_t* done) {
    if (per_device_.empty()) per_device_.resize(static_cast<size_t>(GetProbe().devices));
    if (device < 0 || static_cast<size_t>(device) >= per_device_.size()) {
      return {StatusCode::kInternal, "cuda: copy: device " + std::to_string(device) + " of " +
                                         std::to_string(per_device_.size())};
    }
    PerDevice& p = per_device_[static_cast<size_t>(device)];
    if (p.stream == nullptr || p.done == nullptr) {
      cudaError_t e = cudaSuccess;
      if (p.stream == nullptr && (e = cudaStreamCreateWithFlags(&p.stream, cudaStreamNonBlocking)) != cudaSuccess) {
        p.stream = nullptr;
        return RtFail("copy", "cudaStreamCreateWithFlags", e);
      }
      if ((e = cudaEventCreateWithFlags(&p.done, cudaEventDisableTiming)) != cudaSuccess) {
        p.done = nullptr;
        return RtFail("copy", "cudaEventCreateWithFlags", e);
      }
    }
    *stream = p.stream;
    *done = p.done;
    return Status::Ok();
  }

 private:
  struct PerDevice {
    cudaStream_t stream = nullptr;
    cudaEvent_t done = nullptr;
  };

  bool In(uint64_t a) const { return a >= range_base_ && a < range_end_; }

  std::vector<PerDevice> per_device_;  // by device ordinal, sized on first use
  uint64_t range_base_ = 0, range_end_ = 0;  // [base, end): the remembered allocation; end 0: none
  int range_device_ = -1;
  uint64_t range_generation_ = 0;  // freed_generation when it was remembered
};

// The device a batch is issued from: that of the first slice side (local, then remote) in device
// memory, -1 if none is; *addr is that side's address.
int FindDevice(std::span<const Slice> slices, uint64_t* addr) {
  for (const Slice& sl : slices) {
    if (sl.len == 0) continue;
    for (const uint64_t a : {sl.local, sl.remote}) {
      const int device = DeviceOf(reinterpret_cast<const void*>(a));
      if (device >= 0) {
        *addr = a;
        return device;
      }
    }
  }
  return -1;
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Waits for everything queued on the stream, whatever the deadline: the memory the copies
// touch must outlive them. The caller's error wins over any the wait finds.
void Drain(cudaStream_t stream) {
  if (cudaStreamSynchronize(stream) != cudaSuccess) cudaGetLastError();
}

std::string BatchText(size_t n, uint64_t bytes) {
  return std::to_string(n) + (n == 1 ? " slice, " : " slices, ") + std::to_string(bytes) + " bytes";
}

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

Status Export::Create(uint64_t addr, uint64_t len, std::unique_ptr<Export>* out) {
  const std::string what = "export " + Hex(addr) + " (" + std::to_string(len) + " bytes)";
  if (addr == 0 || len == 0)
    return {StatusCode::kInvalidArgument, "cuda: " + what + ": null address or zero length"};
  if (addr + len < addr) return {StatusCode::kInvalidArgument, "cuda: " + what + ": the range wraps around"};
  if (!Usable()) return NotUsable(what);
  const int device = DeviceOf(reinterpret_cast<const void*>(addr));
  if (device < 0) return {StatusCode::kInvalidArgument, "cuda: " + what + ": not device memory"};
  XFER_NEED_DRIVER(MemGetAddressRange, what);
  const DriverApi& d = Driver();
  DeviceScope scope(device);
  if (scope.error() != cudaSuccess) return RtFail(what, "cudaSetDevice", scope.error());

  CUdeviceptr base = 0;
  size_t size = 0;
  CUresult c = d.MemGetAddressRange(&base, &size, static_cast<CUdeviceptr>(addr));
  if (c != CUDA_SUCCESS) {
    return {StatusCode::kInvalidArgument, "cuda: " + what + ": " + DrvErr("cuMemGetAddressRange", c)};
  }
  Record r;
  r.device = device;
  r.offset = addr - base;
  r.alloc_size = size;
  if (r.offset > size || len > size - r.offset) {
    return {StatusCode::kInvalidArgument, "cuda: " + what + ": the range ends past its allocation (" +
                                              Hex(base) + ", " + std::to_string(size) + " bytes)"};
  }

  // cudaMalloc memory: a CUDA IPC handle of the allocation's base.
  const cudaError_t ipc_err = cudaIpcGetMemHandle(&r.ipc, reinterpret_cast<void*>(base));
  if (ipc_err == cudaSuccess) {
    r.kind = kKindIpc;
    *out = std::make_unique<ExportImpl>(Encode(r), -1);
    return Status::Ok();
  }
  const std::string ipc_why = RtErr("cudaIpcGetMemHandle", ipc_err);

  // VMM memory (cuMemCreate + cuMemMap): a POSIX file descriptor, if the allocation allows one.
  if (d.MemRetainAllocationHandle == nullptr || d.MemGetAllocationPropertiesFromHandle == nullptr ||
      d.MemExportToShareableHandle == nullptr || d.MemRelease == nullptr) {
    return {StatusCode::kUnsupported,
            "cuda: " + what + ": " + ipc_why + ", and the driver has no VMM export entry points"};
  }
  CUmemGenericAllocationHandle h = 0;
  c = d.MemRetainAllocationHandle(&h, reinterpret_cast<void*>(addr));
  if (c != CUDA_SUCCESS) {
    return {StatusCode::kUnsupported, "cuda: " + what +
                                          ": neither cudaMalloc nor VMM memory that can be shared (" +
                                          ipc_why + "; " + DrvErr("cuMemRetainAllocationHandle", c) + ")"};
  }
  CUmemAllocationProp prop{};
  c = d.MemGetAllocationPropertiesFromHandle(&prop, h);
  Status s;
  if (c != CUDA_SUCCESS) {
    s = {CodeOf(c), "cuda: " + what + ": " + DrvErr("cuMemGetAllocationPropertiesFromHandle", c)};
  } else if ((prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
    s = {StatusCode::kUnsupported,
         "cuda: " + what +
             ": VMM allocation not created with a POSIX-fd shareable handle type "
             "(cuMemCreate's requestedHandleTypes lacks CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)"};
  }
  int fd = -1;
  if (s.ok()) {
    c = d.MemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (c != CUDA_SUCCESS) {
      fd = -1;
      s = {CodeOf(c), "cuda: " + what + ": " + DrvErr("cuMemExportToShareableHandle", c)};
    }
  }
  d.MemRelease(h);  // balances the retain; the mapping keeps the memory
  if (!s.ok()) return s;
  if (prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE) r.device = prop.location.id;
  r.kind = kKindVmm;
  r.fd = fd;
  *out = std::make_unique<ExportImpl>(Encode(r), fd);
  return Status::Ok();
}

Status Open(const std::string& blob, uint64_t len, const TakeFd& take_fd, std::shared_ptr<Mapping>* out) {
  Record r;
  Status s = Decode(blob, len, &r);
  if (!s.ok()) return s;
  if (!Usable()) return NotUsable("open region");
  return r.kind == kKindIpc ? OpenIpc(r, out) : OpenVmm(r, take_fd, out);
}

Status Copy(Op op, std::span<const Slice> slices, std::chrono::steady_clock::time_point deadline) {
  if (!Usable()) return NotUsable("copy");
  if (slices.empty()) return Status::Ok();
  thread_local ThreadCopier copier;
  // The batch's device: remembered from an earlier batch over the same allocation, else asked.
  const uint64_t generation = freed_generation.load(std::memory_order_acquire);
  int device = copier.Remembered(slices, generation);
  uint64_t lookup = 0;
  if (device < 0) device = FindDevice(slices, &lookup);
  // No device memory in the batch (pinned host to host): the current device's stream.
  int issue = device;
  if (issue < 0 && cudaGetDevice(&issue) != cudaSuccess) {
    cudaGetLastError();
    issue = 0;
  }
  DeviceScope scope(device);
  if (scope.error() != cudaSuccess) return RtFail("copy", "cudaSetDevice", scope.error());
  if (lookup != 0) copier.Remember(lookup, device, generation);
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  Status s = copier.Get(issue, &stream, &done);
  if (!s.ok()) return s;

  uint64_t bytes = 0;
  for (size_t i = 0; i < slices.size(); ++i) {
    const Slice& sl = slices[i];
    if (sl.len == 0) continue;
    const uint64_t dst = op == Op::kWrite ? sl.remote : sl.local;
    const uint64_t src = op == Op::kWrite ? sl.local : sl.remote;
    const cudaError_t e = cudaMemcpyAsync(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src),
                                          sl.len, cudaMemcpyDefault, stream);
    if (e != cudaSuccess) {
      const std::string msg = RtErr("cudaMemcpyAsync", e);
      Drain(stream);  // the slices queued before this one
      return {CodeOf(e), "cuda: copy " + std::string(OpName(op)) + ", slice " + std::to_string(i) + " of " +
                             std::to_string(slices.size()) + " (" + Hex(src) + " -> " + Hex(dst) + ", " +
                             std::to_string(sl.len) + " bytes): " + msg};
    }
    bytes += sl.len;
  }
  // (Only failures spell the batch out: no allocation on the way of a copy that works.)
  const auto what = [&] { return "copy " + std::string(OpName(op)) + " (" + BatchText(slices.size(), bytes) + ")"; };
  cudaError_t e = cudaEventRecord(done, stream);
  if (e != cudaSuccess) {
    const std::string msg = RtErr("cudaEventRecord", e);
    Drain(stream);
    return {CodeOf(e), "cuda: " + what() + ": " + msg};
  }

  // Spin a little (small batches finish in microseconds), then yield, then sleep briefly.
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    e = cudaEventQuery(done);
    if (e == cudaSuccess) return Status::Ok();
    if (e != cudaErrorNotReady) {
      const std::string msg = RtErr("cudaEventQuery", e);
      Drain(stream);
      return {CodeOf(e), "cuda: " + what() + ": " + msg};
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) break;
    const auto waited = now - start;
    if (waited < std::chrono::microseconds(50)) {
      for (int i = 0; i < 32; ++i) CpuRelax();
    } else if (waited < std::chrono::milliseconds(2)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  // Past the deadline: the copies still run on this process's memory, so wait them out.
  e = cudaEventSynchronize(done);
  const auto late =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - deadline);
  if (e != cudaSuccess) {
    const std::string msg = RtErr("cudaEventSynchronize", e);
    Drain(stream);
    return {CodeOf(e), "cuda: " + what() + ": " + msg};
  }
  return {StatusCode::kTimeout, "cuda: " + what() + ": not done by the deadline (finished " +
                                    std::to_string(late.count()) + " us after it)"};
}

Status PinHost(void* p, uint64_t len) {
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
  const cudaError_t e = cudaHostRegister(p, len, cudaHostRegisterPortable);
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
    return {StatusCode::kInvalidArgument, "cuda: " + what + ": a device ordinal, or -1 for the current device"};
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
