// The cuda backend: batches of copies between memory addressable here, on the copy engines.
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
    if (d.MemGetAddressRange(&base, &size, static_cast<CUdeviceptr>(addr)) != CUDA_SUCCESS || size == 0)
      return;
    range_base_ = base;
    range_end_ = base + size;
    range_device_ = device;
    range_generation_ = generation;
  }

  // The stream and event of `device`, made on first use; `device` must be current.
  Status Get(int device, cudaStream_t* stream, cudaEvent_t* done) {
    if (per_device_.empty()) per_device_.resize(static_cast<size_t>(GetProbe().devices));
    if (device < 0 || static_cast<size_t>(device) >= per_device_.size()) {
      return {StatusCode::kInternal,
              "cuda: copy: device " + std::to_string(device) + " of " + std::to_string(per_device_.size())};
    }
    PerDevice& p = per_device_[static_cast<size_t>(device)];
    if (p.stream == nullptr || p.done == nullptr) {
      cudaError_t e = cudaSuccess;
      if (p.stream == nullptr &&
          (e = cudaStreamCreateWithFlags(&p.stream, cudaStreamNonBlocking)) != cudaSuccess) {
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

  std::vector<PerDevice> per_device_;        // by device ordinal, sized on first use
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

// "copy WRITE (3 slices, 4096 bytes)": a batch in an error message.
std::string CopyText(Op op, size_t n, uint64_t bytes) {
  return "copy " + std::string(OpName(op)) + " (" + BatchText(n, bytes) + ")";
}

// Queues the batch's copies on the stream; on a failure, waits for those queued before it.
Status Enqueue(Op op, std::span<const Slice> slices, cudaStream_t stream, uint64_t* bytes) {
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
    *bytes += sl.len;
  }
  return Status::Ok();
}

// Waits for the event that ends the batch: spins a little (small batches finish in
// microseconds), then yields, then sleeps briefly. Past the deadline the copies still run on
// this process's memory, so they are waited out (and the batch is a timeout).
template <class What>
Status AwaitCopies(cudaStream_t stream, cudaEvent_t done, std::chrono::steady_clock::time_point deadline,
                   const What& what) {
  const auto start = std::chrono::steady_clock::now();
  cudaError_t e;
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

// The batch a lane started and has not finished yet.
struct Started {
  bool active = false;
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  Op op = Op::kWrite;
  size_t slices = 0;
  uint64_t bytes = 0;
};

// A thread's lane of copies: its streams and events, and the batch started on it. Each thread
// has two: the data path's (StartCopy), and a side lane (StartSideCopy) for work that may come
// while the first has a batch started (a checksum of GPU memory, in a completion callback).
struct Lane {
  ThreadCopier copier;
  Started started;
};
thread_local Lane main_lane, side_lane;

Status StartOn(Lane& lane, Op op, std::span<const Slice> slices) {
  Started& started = lane.started;
  ThreadCopier& copier = lane.copier;
  if (started.active) return {StatusCode::kInternal, "cuda: copy started while this thread's last one runs"};
  if (!Usable()) return NotUsable("copy");
  if (slices.empty()) return Status::Ok();
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
  s = Enqueue(op, slices, stream, &bytes);
  if (!s.ok()) return s;
  const cudaError_t e = cudaEventRecord(done, stream);
  if (e != cudaSuccess) {
    const std::string msg = RtErr("cudaEventRecord", e);
    Drain(stream);
    return {CodeOf(e), "cuda: " + CopyText(op, slices.size(), bytes) + ": " + msg};
  }
  started = {true, stream, done, op, slices.size(), bytes};
  return Status::Ok();
}

Status FinishOn(Lane& lane, std::chrono::steady_clock::time_point deadline) {
  Started& started = lane.started;
  if (!started.active) return Status::Ok();
  const Started b = started;
  started.active = false;
  // (Only failures spell the batch out: no allocation on the way of a copy that works.)
  const auto what = [&] { return CopyText(b.op, b.slices, b.bytes); };
  return AwaitCopies(b.stream, b.done, deadline, what);
}

}  // namespace

Status StartCopy(Op op, std::span<const Slice> slices) { return StartOn(main_lane, op, slices); }
Status FinishCopy(std::chrono::steady_clock::time_point deadline) { return FinishOn(main_lane, deadline); }
Status StartSideCopy(Op op, std::span<const Slice> slices) { return StartOn(side_lane, op, slices); }
Status FinishSideCopy(std::chrono::steady_clock::time_point deadline) {
  return FinishOn(side_lane, deadline);
}

Status Copy(Op op, std::span<const Slice> slices, std::chrono::steady_clock::time_point deadline) {
  if (Status s = StartCopy(op, slices); !s.ok()) return s;
  return FinishCopy(deadline);
}

}  // namespace xfer::transport::cuda
