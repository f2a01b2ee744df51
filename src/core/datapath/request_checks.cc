// A request's end-to-end checksums (TransferOptions::checksum): Request::CheckInPlace, Check
// and Compare.
#include <algorithm>
#include <cstring>

#include "core/datapath/request.h"
#include "util/checksum.h"
#include "util/log.h"

namespace xfer {

// What Check gathers for Compare: this side's checksums of the descriptors not checked in
// place and the peer's answer for them; whichever comes last calls Compare.
struct Request::Checking {
  std::vector<uint32_t> asked;  // the descriptors whose checksums the peer was asked for
  std::vector<uint64_t> ours;   // this side's, in that order
  Status answered;
  std::vector<uint64_t> theirs;
  std::atomic<int> waiting{2};  // this side's and the peer's
};

void Request::CheckInPlace(size_t i) {
  const Plan::Batch& b = plan_.batches[i];
  const size_t descriptors = plan_.desc_ends.empty() ? 1 : plan_.desc_ends.size();
  uint64_t at = batch_offsets_[i];  // the request's bytes before the slice
  for (uint32_t k = b.begin; k < b.end; ++k) {
    const transport::Slice& s = plan_.slices[k];
    auto* local = reinterpret_cast<uint8_t*>(s.local);
    auto* there = reinterpret_cast<uint8_t*>(s.remote);
    const int64_t hook = verify_.corrupt_landed;
    if (hook >= 0 && static_cast<uint64_t>(hook) < descriptors) {
      const uint64_t begin = DescriptorBegin(plan_, hook);
      if (begin >= at && begin < at + s.len) (op_ == Op::kWrite ? there : local)[begin - at] ^= 0xff;
    }
    // Both sides are compared byte for byte (stronger than a checksum, and cheaper: they were
    // just copied, so they are in the caches).
    for (uint64_t off = 0; off < s.len && std::memcmp(local + off, there + off, s.len - off) != 0;) {
      while (local[off] == there[off]) ++off;
      const size_t d = DescriptorAt(plan_, at + off);
      {
        std::lock_guard lock(mu_);
        corrupt_.push_back(static_cast<uint32_t>(d));
      }
      off = DescriptorEnd(plan_, d) - at;  // (on past that descriptor)
    }
    at += s.len;
  }
}

void Request::Check() {
  auto c = std::make_shared<Checking>();
  const std::vector<PlannedDescriptor> descs = PlannedDescriptors(plan_);
  std::vector<wire::DigestRange> ask;
  for (size_t k = 0; k < descs.size(); ++k) {
    if (verify_.self || descs[k].mapped) continue;  // (checked in place)
    c->asked.push_back(static_cast<uint32_t>(k));
    ask.push_back({descs[k].remote, descs[k].len});
  }
  if (c->asked.empty()) return Compare(*c);
  // Asked first: the peer computes its checksums while this side computes its own.
  awaiting_answer_.store(true, std::memory_order_release);
  verify_.ask(op_ == Op::kWrite, std::move(ask), deadline_,
              [self = shared_from_this(), c](Status answered, std::vector<uint64_t> theirs) {
                c->answered = std::move(answered);
                c->theirs = std::move(theirs);
                if (c->waiting.fetch_sub(1, std::memory_order_acq_rel) == 1) self->Compare(*c);
              });
  c->ours.reserve(c->asked.size());
  for (uint32_t k : c->asked) {
    auto* local = reinterpret_cast<uint8_t*>(descs[k].local);
    if (op_ == Op::kRead && verify_.corrupt_landed == static_cast<int64_t>(k)) local[0] ^= 0xff;  // the hook
    c->ours.push_back(checksum::Of(local, descs[k].len));
  }
  if (c->waiting.fetch_sub(1, std::memory_order_acq_rel) == 1) Compare(*c);
}

void Request::Compare(const Checking& c) {
  Status why = c.answered;
  if (why.ok() && c.theirs.size() != c.asked.size()) {
    why = {StatusCode::kInternal, "peer answered " + std::to_string(c.theirs.size()) + " checksums for " +
                                      std::to_string(c.asked.size()) + " ranges"};
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
  std::vector<uint32_t> corrupt;
  {
    std::lock_guard lock(mu_);
    corrupt = corrupt_;
  }
  for (size_t i = 0; i < c.asked.size(); ++i) {
    if (c.theirs[i] != c.ours[i]) corrupt.push_back(c.asked[i]);
  }
  if (corrupt.empty()) return End({RequestState::kCompleted, {}, {}});
  std::sort(corrupt.begin(), corrupt.end());
  corrupt.erase(std::unique(corrupt.begin(), corrupt.end()), corrupt.end());
  std::string what = "descriptor " + std::to_string(corrupt[0]) +
                     ": its bytes where they landed differ from where they came from";
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
