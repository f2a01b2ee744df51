// The CUDA helpers: what every part of the engine that touches GPU memory uses. The cuda
// backend (same-host peers open each other's device regions: CUDA IPC for cudaMalloc memory, a
// POSIX file descriptor for VMM memory; the copy engines move the bytes: D2D, H2D and D2H,
// batched on one CUDA stream per calling thread and device), the staging buffers and the tcp
// target's copies all go through Copy(); checksums of GPU memory (memory_sum.h) through the
// side lane (StartSideCopy: streams of their own per thread and device).
//
// Built when CMake finds the CUDA toolkit (cuda_memory.cc, cuda_ipc.cc, cuda_copy.cc, over
// cuda_common.h; common.cmake); otherwise cuda_unavailable.cc, whose functions say why. A
// build with CUDA on a machine without a GPU behaves like the latter.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "transport/link.h"
#include "xfer/status.h"
#include "xfer/types.h"

namespace xfer::transport::cuda {

// True when this build has CUDA and at least one device answers; *why says why not.
bool Available(std::string* why);

// What memory a pointer refers to: kCuda with its device ordinal for device memory
// (cudaMalloc or VMM), kHost (device -1) for anything else, including pinned host memory.
void Classify(const void* p, MemType* type, int32_t* device);

// Owner side: what a same-host peer needs to open one registered device region. For a VMM
// allocation the export holds a file descriptor that the peer takes with pidfd_getfd.
class Export {
 public:
  // addr may lie inside an allocation; [addr, addr+len) must lie inside that allocation.
  static Status Create(uint64_t addr, uint64_t len, std::unique_ptr<Export>* out);
  virtual ~Export() = default;
  // Opaque bytes that travel in the region table (WireRegion::cuda_handle). Never empty.
  virtual const std::string& blob() const = 0;
};

// Initiator side: a peer's device region opened in this process. Closed (cudaIpcCloseMemHandle
// or unmapped) when the last user lets go.
class Mapping {
 public:
  virtual ~Mapping() = default;
  // Where the region's first byte is addressable here (a device pointer in our address space).
  virtual uint8_t* base() const = 0;
};

// Takes descriptor `remote_fd` of the peer process into this one (pidfd_getfd); used for VMM.
using TakeFd = std::function<Status(int32_t remote_fd, int* local_fd)>;

// Opens a region from its blob; len is the region's length as advertised, and is checked
// against what the handle covers.
Status Open(const std::string& blob, uint64_t len, const TakeFd& take_fd, std::shared_ptr<Mapping>* out);

// Copies a batch between memory addressable in this process (device pointers, opened peer
// regions, host memory): WRITE copies each slice's local range to its remote range, READ the
// other way. Issued from the device of the batch's first slice side in device memory (the
// current device if none is), made current for the call, on the calling thread's own stream of
// that device (non-blocking, created on first use; the thread remembers the last allocation it
// looked up, so batches over the same allocation ask CUDA nothing to find the device), then
// waits for the copies, polling (never past the deadline by more than the copies themselves
// take: memory must not be released under a copy in flight).
Status Copy(Op op, std::span<const Slice> slices, std::chrono::steady_clock::time_point deadline);
// Copy in two steps, so that the thread can move other bytes while the copy engines run:
// StartCopy queues the batch and returns; FinishCopy waits for it as Copy does (Ok when none
// was started). One started batch per thread: the thread starts or copies nothing else until
// it finished it, and must finish it before the memory it touches goes.
Status StartCopy(Op op, std::span<const Slice> slices);
Status FinishCopy(std::chrono::steady_clock::time_point deadline);
// The same on a side lane of the thread, with streams of its own: for work that may come while
// the thread has a batch started (checksums of GPU memory, summed in a completion callback).
// Its own one started batch at a time.
Status StartSideCopy(Op op, std::span<const Slice> slices);
Status FinishSideCopy(std::chrono::steady_clock::time_point deadline);

// Page-locks host memory so copies to and from it run at the PCIe link's speed (cudaHostRegister;
// read_only: memory mapped without write permission, which copies only read).
Status PinHost(void* p, uint64_t len, bool read_only = false);
void UnpinHost(void* p);
// Page-locked host memory for staging buffers (cudaHostAlloc).
Status AllocPinned(uint64_t len, void** p);
void FreePinned(void* p);
// Zeroed device memory on `device` (-1: the current device; below -1 refused with
// kInvalidArgument before CUDA is asked), for Engine::AllocMem(kCuda).
Status AllocDevice(uint64_t len, int32_t device, void** p);
void FreeDevice(void* p);

// Several lines for xfer-info: runtime and driver versions, each device (name, memory, PCI
// bus), or why CUDA is not usable here.
std::string Describe();

}  // namespace xfer::transport::cuda
