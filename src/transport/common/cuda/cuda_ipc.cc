// The cuda backend: a device region as a same-host peer opens it. The owner exports it (CUDA IPC
// for cudaMalloc memory, a POSIX file descriptor for VMM memory) as an opaque blob; the peer
// opens the blob into a mapping of its own.
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

// The peer's VMM allocation as a handle of ours: its descriptor taken and imported.
Status ImportVmm(const Record& r, const TakeFd& take_fd, const std::string& what,
                 CUmemGenericAllocationHandle* h) {
  int fd = -1;
  Status s = take_fd(r.fd, &fd);
  if (!s.ok()) return {s.code(), "cuda: " + what + ": " + s.message()};
  CUresult c = Driver().MemImportFromShareableHandle(h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  ::close(fd);  // the imported handle keeps the memory
  if (c != CUDA_SUCCESS) {
    return {c == CUDA_ERROR_INVALID_VALUE ? StatusCode::kRemoteAccessDenied : CodeOf(c),
            "cuda: " + what + ": " + DrvErr("cuMemImportFromShareableHandle", c)};
  }
  return Status::Ok();
}

// Maps the imported allocation h at an address range reserved here (*va, *reserved bytes) with
// read/write access for the memory's own device; on failure nothing stays reserved or mapped
// (h is the caller's to release).
Status MapVmm(const Record& r, CUmemGenericAllocationHandle h, const CUmemAllocationProp& prop,
              const std::string& what, CUdeviceptr* va, uint64_t* reserved) {
  const DriverApi& d = Driver();
  size_t granularity = 0;
  CUresult c = d.MemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (c != CUDA_SUCCESS) {
    return {CodeOf(c), "cuda: " + what + ": " + DrvErr("cuMemGetAllocationGranularity", c)};
  }
  *reserved = RoundUp(r.alloc_size, granularity);
  c = d.MemAddressReserve(va, *reserved, 0, 0, 0);
  if (c != CUDA_SUCCESS) {
    return {CodeOf(c), "cuda: " + what + ": " + DrvErr("cuMemAddressReserve", c) + " (" +
                           std::to_string(*reserved) + " bytes)"};
  }
  c = d.MemMap(*va, r.alloc_size, 0, h, 0);
  if (c != CUDA_SUCCESS) {
    d.MemAddressFree(*va, *reserved);
    return {CodeOf(c),
            "cuda: " + what + ": " + DrvErr("cuMemMap", c) + " (" + std::to_string(r.alloc_size) + " bytes)"};
  }
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  c = d.MemSetAccess(*va, r.alloc_size, &access, 1);
  if (c != CUDA_SUCCESS) {
    d.MemUnmap(*va, r.alloc_size);
    d.MemAddressFree(*va, *reserved);
    return {CodeOf(c), "cuda: " + what + ": " + DrvErr("cuMemSetAccess", c)};
  }
  return Status::Ok();
}

// Read/write access for every other device of this process that reaches the memory directly,
// so that a copy issued from any of their streams cannot fault: the device the import landed
// on and the peers of the memory's device. Best effort, each on its own: without one, copies
// from that device's streams fail on this region (cudaMemcpy reports it) rather than the whole
// import.
void GrantPeerAccess(CUdeviceptr va, uint64_t size, const CUmemAllocationProp& prop, int device) {
  if (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE) return;
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
    (void)Driver().MemSetAccess(va, size, &more, 1);  // best effort (see above)
  }
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
  const int device = r.device < GetProbe().devices ? r.device : -1;
  DeviceScope scope(device);
  if (scope.error() != cudaSuccess) return RtFail(what, "cudaSetDevice", scope.error());
  CUmemGenericAllocationHandle h = 0;
  if (Status s = ImportVmm(r, take_fd, what, &h); !s.ok()) return s;
  // Where the memory lives, as this process numbers devices; the blob's ordinal if the driver
  // cannot say.
  CUmemAllocationProp prop{};
  if (Driver().MemGetAllocationPropertiesFromHandle(&prop, h) != CUDA_SUCCESS) {
    prop = CUmemAllocationProp{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = r.device;
  }
  CUdeviceptr va = 0;
  uint64_t reserved = 0;
  if (Status s = MapVmm(r, h, prop, what, &va, &reserved); !s.ok()) {
    Driver().MemRelease(h);
    return s;
  }
  GrantPeerAccess(va, r.alloc_size, prop, device);
  *out = std::make_shared<VmmMapping>(h, va, reserved, r.alloc_size, r.offset);
  return Status::Ok();
}

// VMM memory (cuMemCreate + cuMemMap), once CUDA IPC refused it (ipc_why): a POSIX file
// descriptor of the allocation, if it allows one; r->device is the memory's own device.
Status ExportVmm(uint64_t addr, const std::string& what, const std::string& ipc_why, Record* r, int* fd_out) {
  const DriverApi& d = Driver();
  if (d.MemRetainAllocationHandle == nullptr || d.MemGetAllocationPropertiesFromHandle == nullptr ||
      d.MemExportToShareableHandle == nullptr || d.MemRelease == nullptr) {
    return {StatusCode::kUnsupported,
            "cuda: " + what + ": " + ipc_why + ", and the driver has no VMM export entry points"};
  }
  CUmemGenericAllocationHandle h = 0;
  CUresult c = d.MemRetainAllocationHandle(&h, reinterpret_cast<void*>(addr));
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
  if (prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE) r->device = prop.location.id;
  *fd_out = fd;
  return Status::Ok();
}

}  // namespace

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
  int fd = -1;
  if (Status s = ExportVmm(addr, what, ipc_why, &r, &fd); !s.ok()) return s;
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

}  // namespace xfer::transport::cuda
