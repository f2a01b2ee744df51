// A request's end-to-end checksums (TransferOptions::checksum; docs/notifications.md,
// "Checksums"). Each batch is checked as it moves its bytes, on the thread that moved them and
// while they are still in the caches: where both its sides are addressable here (shm, cuda,
// this engine itself) the two are compared, byte for byte in host memory, by checksums where
// either side is GPU memory; elsewhere this side's checksums of its pieces (a slice's part of
// one descriptor) are taken. Once every batch moved, the peer is asked for its side's checksums
// of those pieces, and the descriptors whose sides differ are named. GPU memory is summed
// through host buffers (transport/common/memory_sum.h).
#pragma once

#include <chrono>
#include <functional>
#include <mutex>
#include <vector>

#include "control/wire.h"
#include "core/datapath/planner.h"
#include "xfer/status.h"

namespace xfer {

// How a request checks its bytes (TransferService makes it; Verifier::AskerFor the ask).
struct RequestChecks {
  // Asks the peer for the checksums of ranges of its memory (landed: where a WRITE's bytes
  // landed), answered by the deadline or kTimeout; answer is called exactly once, with one
  // checksum per range; returns what withdraws the ask, if anything can (Verifier::Ask).
  using Answer = std::function<void(Status, std::vector<uint64_t> checksums)>;
  using Withdraw = std::function<void()>;
  using Ask = std::function<Withdraw(bool landed, std::vector<wire::DigestRange> ranges,
                                     std::chrono::steady_clock::time_point deadline, Answer answer)>;
  Ask ask;                      // empty: the request is not checked
  bool self = false;            // the peer is this engine: every remote address is addressable here
  int64_t corrupt_landed = -1;  // the test hook (LocalEngine::corrupt_landed)
};

class RequestCheck {
 public:
  // plan: the request's (it outlives this).
  RequestCheck(const Plan& plan, Op op, RequestChecks config);

  // Whether batch i is compared in place (both sides addressable here).
  bool InPlace(size_t i) const { return config_.self || plan_.batches[i].mapped; }
  // The request's first batch is about to move. A READ asks the peer now: its side (where the
  // bytes come from) does not change while they move, so its pass overlaps the copy. keep: what
  // must live until the answer came (the request).
  void Start(std::chrono::steady_clock::time_point deadline, std::shared_ptr<void> keep);
  // Batch i moved its bytes: checks it (the thread that moved them, in its execution slot).
  void BatchMoved(size_t i);
  // Every batch moved: asks the peer for its checksums of the pieces not compared in place
  // (unless Start did), compares them, then calls done exactly once (at once when nothing is
  // asked) with the descriptors found to differ (ascending) and, when the peer could not
  // answer, why. keep: as Start's.
  using Done = std::function<void(Status why, std::vector<uint32_t> corrupt)>;
  void Finish(std::chrono::steady_clock::time_point deadline, Done done, std::shared_ptr<void> keep);
  // The descriptors found to differ so far (ascending, each once).
  std::vector<uint32_t> Corrupt() const;
  // The request ended without Finish (failed, timed out, canceled): an ask under way (a
  // READ's) is withdrawn, so that the peer stops computing it. (A failed part withdraws the
  // others itself.)
  void Abandon();
  // The request was stopped (Engine::Cancel) while it may still wait for the peer's answer:
  // a Finish waiting for it, or one still to come, calls its done at once with `why` (the bytes
  // moved, unchecked), and the ask is withdrawn. Nothing once done was called.
  void Cancel(Status why);

 private:
  struct Piece {
    uint64_t local = 0, remote = 0, len = 0;
    uint64_t at = 0;  // where it begins in the request's bytes
    uint32_t desc = 0;
  };
  void Compare(size_t i);                                     // an InPlace batch's two sides, slice by slice:
  void CompareBytes(const transport::Slice& s, uint64_t at);  // host memory: byte for byte
  // Either side GPU memory: by checksums, descriptor by descriptor. at: where s begins in the
  // request's bytes.
  void CompareSums(const transport::Slice& s, uint64_t at, bool local_gpu, bool there_gpu);
  // Whether this request's memory at addr is GPU memory (asked only when the plan has some).
  bool Gpu(uint64_t addr) const;
  void NoteFailure(Status why);  // this side could not sum its bytes (a copy of GPU memory failed)
  // Asks the peer for its checksums of the pieces (once); the answer goes to done_ once both
  // it and Finish came.
  void Ask(std::chrono::steady_clock::time_point deadline, std::shared_ptr<void> keep);
  void Answered(Status why, std::vector<uint64_t> theirs);
  // Compares the peer's checksums with ours and calls done (once both are known).
  void Conclude(Status why, const std::vector<uint64_t>& theirs, const Done& done);
  void NoteCorrupt(size_t desc);
  // The test hook: flips the first byte of descriptor config_.corrupt_landed where it landed,
  // when that byte lies in [at, at + len) of the request's bytes (landed: its address).
  void MaybeCorrupt(uint64_t at, uint64_t len, uint8_t* landed, bool gpu) const;

  const Plan& plan_;
  const Op op_;
  const RequestChecks config_;
  std::vector<uint64_t> batch_at_;     // where batch i begins in the request's bytes
  std::vector<uint32_t> batch_piece_;  // batch i's pieces: pieces_[batch_piece_[i], [i + 1])
  std::vector<Piece> pieces_;          // of the batches not compared in place, in order
  std::vector<uint64_t> ours_;         // this side's checksum of each piece (BatchMoved)
  mutable std::mutex mu_;
  std::vector<uint32_t> corrupt_;     // mu_
  bool asked_ = false;                // mu_
  bool answered_ = false;             // mu_: the answer came (why_, theirs_)
  Status why_;                        // mu_
  std::vector<uint64_t> theirs_;      // mu_
  Done done_;                         // mu_: Finish's, while the answer has not come
  RequestChecks::Withdraw withdraw_;  // mu_: the ask's, once made, until used
  bool failed_ = false;               // mu_: its answer was a failure
  Status canceled_;                   // mu_: Cancel's why, once it came
  Status unsummed_;                   // mu_: why this side could not sum its bytes, if it could not
};

}  // namespace xfer
