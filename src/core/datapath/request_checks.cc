// A request's end-to-end checksums (TransferOptions::checksum): Request::Check and Compare.
#include <algorithm>

#include "core/datapath/request.h"
#include "util/checksum.h"
#include "util/log.h"

namespace xfer {

void Request::Check() {
  const std::vector<PlannedDescriptor> descs = PlannedDescriptors(plan_);
  const bool write = op_ == Op::kWrite;
  std::vector<uint64_t> ours(descs.size());
  std::vector<uint32_t> corrupt, asked;
  std::vector<wire::DigestRange> ask;
  for (size_t k = 0; k < descs.size(); ++k) {
    const PlannedDescriptor& d = descs[k];
    auto* local = reinterpret_cast<uint8_t*>(d.local);
    auto* mapped = reinterpret_cast<uint8_t*>(d.remote);  // (only where d.mapped)
    if (verify_.corrupt_landed == static_cast<int64_t>(k) && (!write || d.mapped)) {
      (write ? mapped : local)[0] ^= 0xff;  // the test hook, where this side reads the landed bytes
    }
    // Where the peer's region is mapped here (shm, or this engine's own memory seen through
    // shm), both sides are read here, without a round trip.
    ours[k] = checksum::Of(local, d.len);
    if (d.mapped) {
      if (checksum::Of(mapped, d.len) != ours[k]) corrupt.push_back(static_cast<uint32_t>(k));
      continue;
    }
    asked.push_back(static_cast<uint32_t>(k));
    ask.push_back({d.remote, d.len});
  }
  if (ask.empty()) return Compare(std::move(corrupt), asked, ours, Status::Ok(), {});
  awaiting_answer_.store(true, std::memory_order_release);
  verify_.ask(write, std::move(ask), deadline_,
              [self = shared_from_this(), corrupt = std::move(corrupt), asked = std::move(asked),
               ours = std::move(ours)](Status answered, std::vector<uint64_t> theirs) mutable {
                self->Compare(std::move(corrupt), asked, ours, answered, theirs);
              });
}

void Request::Compare(std::vector<uint32_t> corrupt, const std::vector<uint32_t>& asked,
                      const std::vector<uint64_t>& ours, const Status& answered,
                      const std::vector<uint64_t>& theirs) {
  Status why = answered;
  if (why.ok() && theirs.size() != asked.size()) {
    why = {StatusCode::kInternal, "peer answered " + std::to_string(theirs.size()) + " checksums for " +
                                      std::to_string(asked.size()) + " ranges"};
  }
  if (!why.ok()) {  // (unchecked: the bytes moved, but nobody knows whether they landed intact)
    RequestStatus st{why.code() == StatusCode::kTimeout ? RequestState::kTimeout : RequestState::kFailed,
                     {why.code(), "checksum: " + why.message()},
                     {}};
    XLOG(WARN) << OpName(op_) << " to " << peer_->info.name << " failed: " << st.status.ToString();
    {
      std::lock_guard lock(mu_);
      st.landed = Landed();
    }
    return End(std::move(st));
  }
  for (size_t i = 0; i < asked.size(); ++i) {
    if (theirs[i] != ours[asked[i]]) corrupt.push_back(asked[i]);
  }
  if (corrupt.empty()) return End({RequestState::kCompleted, {}, {}});
  std::sort(corrupt.begin(), corrupt.end());
  std::string what = "descriptor " + std::to_string(corrupt[0]) +
                     ": its bytes where they landed differ from where they came from (checksums differ)";
  if (corrupt.size() > 1) what += ", and " + std::to_string(corrupt.size() - 1) + " more descriptors";
  RequestStatus st{RequestState::kFailed, {StatusCode::kDataCorrupted, what}, {}};
  XLOG(WARN) << OpName(op_) << " to " << peer_->info.name << " failed: " << st.status.ToString();
  {
    std::lock_guard lock(mu_);
    for (uint64_t k : Landed()) {
      if (!std::binary_search(corrupt.begin(), corrupt.end(), static_cast<uint32_t>(k)))
        st.landed.push_back(k);
    }
  }
  End(std::move(st));
}

}  // namespace xfer
