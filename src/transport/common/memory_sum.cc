#include "transport/common/memory_sum.h"

#include <chrono>
#include <memory>

#include "transport/common/cuda/cuda_api.h"

namespace xfer::transport {

namespace {

constexpr auto kNoDeadline = std::chrono::steady_clock::time_point::max();
constexpr uint64_t kChunk = 1 << 20;  // per copy: large against a copy's fixed cost (~10 us)

// This thread's two page-locked buffers, allocated on its first sum of GPU memory.
struct Bounce {
  void* half[2] = {nullptr, nullptr};
  ~Bounce() {
    for (void* p : half)
      if (p != nullptr) cuda::FreePinned(p);
  }
  Status Get() {
    for (void*& p : half) {
      if (p != nullptr) continue;
      if (Status s = cuda::AllocPinned(kChunk, &p); !s.ok()) {
        p = nullptr;
        return s;
      }
    }
    return Status::Ok();
  }
};

}  // namespace

bool IsGpuMemory(uint64_t addr) {
  MemType type = MemType::kHost;
  int32_t device = -1;
  cuda::Classify(reinterpret_cast<const void*>(addr), &type, &device);
  return type == MemType::kCuda;
}

Status SumMemory(uint64_t addr, uint64_t n, bool gpu, checksum::Running* sum) {
  if (!gpu) {
    sum->Add(reinterpret_cast<const void*>(addr), n);
    return Status::Ok();
  }
  thread_local Bounce bounce;
  if (Status s = bounce.Get(); !s.ok()) return {s.code(), "checksum of GPU memory: " + s.message()};
  // Chunk k is copied into half k % 2 (a READ: from the slice's remote side, the GPU memory,
  // to its local side), and summed once chunk k + 1's copy has started.
  const auto copy = [&](uint64_t k) {
    const uint64_t at = k * kChunk;
    const Slice s{reinterpret_cast<uint64_t>(bounce.half[k % 2]), addr + at, std::min(kChunk, n - at)};
    return cuda::StartSideCopy(Op::kRead, std::span(&s, 1));
  };
  const uint64_t chunks = (n + kChunk - 1) / kChunk;
  Status s = chunks > 0 ? copy(0) : Status::Ok();
  for (uint64_t k = 0; k < chunks && s.ok(); ++k) {
    s = cuda::FinishSideCopy(kNoDeadline);
    if (s.ok() && k + 1 < chunks) s = copy(k + 1);
    if (s.ok()) sum->Add(bounce.half[k % 2], std::min(kChunk, n - k * kChunk));
  }
  // (A failed start leaves nothing running, and a finish, failed or not, waited its copy out.)
  if (!s.ok()) return {s.code(), "checksum of GPU memory: " + s.message()};
  return Status::Ok();
}

Status ChecksumOf(uint64_t addr, uint64_t n, bool gpu, uint64_t* out) {
  if (!gpu) {
    *out = checksum::Of(reinterpret_cast<const void*>(addr), n);
    return Status::Ok();
  }
  checksum::Running sum;
  if (Status s = SumMemory(addr, n, true, &sum); !s.ok()) return s;
  *out = sum.Value();
  return Status::Ok();
}

Status FlipByte(uint64_t addr, bool gpu) {
  if (!gpu) {
    *reinterpret_cast<uint8_t*>(addr) ^= 0xff;
    return Status::Ok();
  }
  uint8_t byte = 0;
  const Slice s{reinterpret_cast<uint64_t>(&byte), addr, 1};
  const auto copy = [&](Op op) {
    Status st = cuda::StartSideCopy(op, std::span(&s, 1));
    return st.ok() ? cuda::FinishSideCopy(kNoDeadline) : st;
  };
  if (Status st = copy(Op::kRead); !st.ok()) return st;
  byte ^= 0xff;
  return copy(Op::kWrite);
}

}  // namespace xfer::transport
