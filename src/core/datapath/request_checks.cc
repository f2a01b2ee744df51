#include "core/datapath/request_checks.h"

#include <algorithm>
#include <cstring>

#include "transport/common/memory_sum.h"
#include "util/checksum.h"

namespace xfer {

RequestCheck::RequestCheck(const Plan& plan, Op op, RequestChecks config)
    : plan_(plan), op_(op), config_(std::move(config)) {
  batch_at_.reserve(plan_.batches.size());
  batch_piece_.reserve(plan_.batches.size() + 1);
  uint64_t at = 0;  // the request's bytes before the slice
  size_t desc = 0;  // the descriptor that holds byte `at`
  for (size_t i = 0; i < plan_.batches.size(); ++i) {
    const Plan::Batch& b = plan_.batches[i];
    batch_at_.push_back(at);
    batch_piece_.push_back(static_cast<uint32_t>(pieces_.size()));
    if (InPlace(i)) {
      at += b.bytes;
      continue;
    }
    for (uint32_t k = b.begin; k < b.end; ++k) {
      const transport::Slice& s = plan_.slices[k];
      for (uint64_t off = 0; off < s.len;) {
        while (DescriptorEnd(plan_, desc) <= at + off) ++desc;
        const uint64_t end = std::min(DescriptorEnd(plan_, desc) - at, s.len);
        pieces_.push_back({s.local + off, s.remote + off, end - off, at + off, static_cast<uint32_t>(desc)});
        off = end;
      }
      at += s.len;
    }
  }
  batch_piece_.push_back(static_cast<uint32_t>(pieces_.size()));
  ours_.resize(pieces_.size());
}

void RequestCheck::MaybeCorrupt(uint64_t at, uint64_t len, uint8_t* landed, bool gpu) const {
  const int64_t k = config_.corrupt_landed;
  const size_t descriptors = plan_.desc_ends.empty() ? 1 : plan_.desc_ends.size();
  if (k < 0 || static_cast<uint64_t>(k) >= descriptors) return;
  const uint64_t begin = DescriptorBegin(plan_, static_cast<size_t>(k));
  if (begin >= at && begin < at + len)
    (void)transport::FlipByte(reinterpret_cast<uint64_t>(landed + (begin - at)), gpu);
}

bool RequestCheck::Gpu(uint64_t addr) const { return plan_.gpu_memory && transport::IsGpuMemory(addr); }

void RequestCheck::NoteFailure(Status why) {
  std::lock_guard lock(mu_);
  if (unsummed_.ok()) unsummed_ = std::move(why);
}

void RequestCheck::BatchMoved(size_t i) {
  if (InPlace(i)) return Compare(i);
  for (uint32_t p = batch_piece_[i]; p < batch_piece_[i + 1]; ++p) {
    const Piece& piece = pieces_[p];
    const bool gpu = Gpu(piece.local);
    auto* local = reinterpret_cast<uint8_t*>(piece.local);
    if (op_ == Op::kRead) MaybeCorrupt(piece.at, piece.len, local, gpu);  // (a WRITE's: the peer's engine)
    if (Status s = transport::ChecksumOf(piece.local, piece.len, gpu, &ours_[p]); !s.ok()) {
      return NoteFailure(std::move(s));
    }
  }
}

void RequestCheck::Compare(size_t i) {
  const Plan::Batch& b = plan_.batches[i];
  uint64_t at = batch_at_[i];
  for (uint32_t k = b.begin; k < b.end; ++k) {
    const transport::Slice& s = plan_.slices[k];
    const bool local_gpu = Gpu(s.local), there_gpu = Gpu(s.remote);
    MaybeCorrupt(at, s.len, reinterpret_cast<uint8_t*>(op_ == Op::kWrite ? s.remote : s.local),
                 op_ == Op::kWrite ? there_gpu : local_gpu);
    if (local_gpu || there_gpu) {
      CompareSums(s, at, local_gpu, there_gpu);
    } else {
      CompareBytes(s, at);
    }
    at += s.len;
  }
}

void RequestCheck::CompareBytes(const transport::Slice& s, uint64_t at) {
  auto* local = reinterpret_cast<uint8_t*>(s.local);
  auto* there = reinterpret_cast<uint8_t*>(s.remote);
  // Byte for byte: stronger than a checksum, and cheaper (both sides are in the caches).
  for (uint64_t off = 0; off < s.len && std::memcmp(local + off, there + off, s.len - off) != 0;) {
    while (off < s.len && local[off] == there[off]) ++off;  // (memory may change meanwhile)
    if (off == s.len) break;
    const size_t d = DescriptorAt(plan_, at + off);
    NoteCorrupt(d);
    off = DescriptorEnd(plan_, d) - at;  // (on past that descriptor)
  }
}

void RequestCheck::CompareSums(const transport::Slice& s, uint64_t at, bool local_gpu, bool there_gpu) {
  // The whole slice first (one copy out of each GPU side, however many descriptors it holds
  // part of), then, where it differs, descriptor by descriptor, to name them.
  const auto differ = [&](uint64_t off, uint64_t len, bool* out) {
    uint64_t ours = 0, theirs = 0;
    Status st = transport::ChecksumOf(s.local + off, len, local_gpu, &ours);
    if (st.ok()) st = transport::ChecksumOf(s.remote + off, len, there_gpu, &theirs);
    if (!st.ok()) NoteFailure(std::move(st));
    *out = st.ok() && ours != theirs;
    return st.ok();
  };
  bool differs = false;
  if (!differ(0, s.len, &differs) || !differs) return;
  for (uint64_t off = 0; off < s.len;) {
    const size_t d = DescriptorAt(plan_, at + off);
    const uint64_t end = std::min(DescriptorEnd(plan_, d) - at, s.len);
    if (!differ(off, end - off, &differs)) return;
    if (differs) NoteCorrupt(d);
    off = end;
  }
}

void RequestCheck::NoteCorrupt(size_t desc) {
  std::lock_guard lock(mu_);
  corrupt_.push_back(static_cast<uint32_t>(desc));
}

std::vector<uint32_t> RequestCheck::Corrupt() const {
  std::vector<uint32_t> out;
  {
    std::lock_guard lock(mu_);
    out = corrupt_;
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void RequestCheck::Start(std::chrono::steady_clock::time_point deadline, std::shared_ptr<void> keep) {
  if (op_ == Op::kRead && !pieces_.empty()) Ask(deadline, std::move(keep));
}

void RequestCheck::Ask(std::chrono::steady_clock::time_point deadline, std::shared_ptr<void> keep) {
  {
    std::lock_guard lock(mu_);
    if (asked_ || !canceled_.ok()) return;
    asked_ = true;
  }
  std::vector<wire::DigestRange> ask;
  ask.reserve(pieces_.size());
  for (const Piece& p : pieces_) ask.push_back({p.remote, p.len});
  RequestChecks::Withdraw withdraw =
      config_.ask(op_ == Op::kWrite, std::move(ask), deadline,
                  [this, keep = std::move(keep)](Status why, std::vector<uint64_t> theirs) {
                    Answered(std::move(why), std::move(theirs));
                  });
  bool failed = false;
  {
    std::lock_guard lock(mu_);
    withdraw_ = std::move(withdraw);
    failed = failed_ || !canceled_.ok();
  }
  if (failed) Abandon();  // (a part failed, or the request was canceled, while it was being sent)
}

void RequestCheck::Abandon() {
  RequestChecks::Withdraw withdraw;
  {
    std::lock_guard lock(mu_);
    withdraw = std::move(withdraw_);
  }
  if (withdraw) withdraw();
}

void RequestCheck::Cancel(Status why) {
  Done done;
  {
    std::lock_guard lock(mu_);
    if (!canceled_.ok()) return;
    canceled_ = why;
    done = std::move(done_);  // (set while Finish waits for the answer)
  }
  Abandon();
  if (done) done(std::move(why), Corrupt());
}

void RequestCheck::Answered(Status why, std::vector<uint64_t> theirs) {
  // A part that failed ends the ask: its other parts are withdrawn (the peer stops them).
  if (!why.ok()) {
    {
      std::lock_guard lock(mu_);
      failed_ = true;
    }
    Abandon();
  }
  Done done;
  {
    std::lock_guard lock(mu_);
    if (!done_) {  // (Finish has not come yet: it concludes)
      answered_ = true;
      why_ = std::move(why);
      theirs_ = std::move(theirs);
      return;
    }
    done = std::move(done_);
  }
  Conclude(std::move(why), theirs, done);
}

void RequestCheck::Finish(std::chrono::steady_clock::time_point deadline, Done done,
                          std::shared_ptr<void> keep) {
  if (pieces_.empty()) {
    Status unsummed;
    {
      std::lock_guard lock(mu_);
      unsummed = unsummed_;
    }
    return done(std::move(unsummed), Corrupt());
  }
  bool answered;
  Status canceled;
  {
    std::lock_guard lock(mu_);
    answered = answered_;
    canceled = canceled_;
    if (!answered && canceled.ok()) done_ = std::move(done);
  }
  // (Answered already: why_ and theirs_ no longer change. An answer that failed after a
  // cancel came of it: the withdrawal.)
  if (answered) return Conclude(!why_.ok() && !canceled.ok() ? canceled : why_, theirs_, done);
  if (!canceled.ok()) {
    Abandon();
    return done(std::move(canceled), Corrupt());
  }
  Ask(deadline, std::move(keep));  // (a WRITE's: its bytes have landed now)
}

void RequestCheck::Conclude(Status why, const std::vector<uint64_t>& theirs, const Done& done) {
  {
    std::lock_guard lock(mu_);
    if (why.ok() && !unsummed_.ok()) why = unsummed_;
  }
  if (why.ok() && theirs.size() != pieces_.size()) {
    why = {StatusCode::kInternal, "peer answered " + std::to_string(theirs.size()) + " checksums for " +
                                      std::to_string(pieces_.size()) + " ranges"};
  }
  if (why.ok()) {
    for (size_t p = 0; p < pieces_.size(); ++p) {
      if (theirs[p] != ours_[p]) NoteCorrupt(pieces_[p].desc);
    }
  }
  done(std::move(why), Corrupt());
}

}  // namespace xfer
