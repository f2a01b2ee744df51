#include "transport/common/staging.h"

#include <sys/mman.h>

#include "transport/common/cuda/cuda_api.h"
#include "transport/common/host_copy.h"
#include "util/log.h"
#include "util/text.h"

namespace xfer::transport {

Status StagingBuffer::Allocate(uint64_t bytes, std::unique_ptr<StagingBuffer>* out) {
  void* p = nullptr;
  if (cuda::Available(nullptr)) {
    Status s = cuda::AllocPinned(bytes, &p);
    if (s.ok()) {
      out->reset(new StagingBuffer(static_cast<uint8_t*>(p), bytes, true));
      return s;
    }
    XLOG(WARN) << "staging buffer of " << bytes << " bytes is not page-locked (GPU copies to and "
               << "from it run slower): " << s.ToString();
  }
  p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return {StatusCode::kResourceExhausted,
            "staging buffer of " + std::to_string(bytes) + " bytes: " + text::Errno("mmap")};
  }
  out->reset(new StagingBuffer(static_cast<uint8_t*>(p), bytes, false));
  return Status::Ok();
}

StagingBuffer::~StagingBuffer() {
  if (pinned_) {
    cuda::FreePinned(data_);
  } else {
    ::munmap(data_, bytes_);
  }
}

Status StageCopy(bool to_buffer, std::span<const Slice> copies, bool device, Clock::time_point deadline) {
  PendingCopy copy;
  if (Status s = copy.Start(to_buffer, copies, device); !s.ok()) return s;
  return copy.Finish(deadline);
}

PendingCopy::~PendingCopy() {
  if (running_) (void)Finish(Clock::time_point::max());
}

Status PendingCopy::Start(bool to_buffer, std::span<const Slice> copies, bool device) {
  const Op op = to_buffer ? Op::kWrite : Op::kRead;  // WRITE copies local sides to remote sides
  if (running_) return {StatusCode::kInternal, "staging: a copy started while the last one runs"};
  if (!device) {
    CopyInProcess(op, copies);
    return Status::Ok();
  }
  Status s = cuda::StartCopy(op, copies);
  running_ = s.ok();
  return s;
}

Status PendingCopy::Finish(Clock::time_point deadline) {
  if (!running_) return Status::Ok();
  running_ = false;
  return cuda::FinishCopy(deadline);
}

}  // namespace xfer::transport
