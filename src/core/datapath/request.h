// One transfer request in flight: its plan, its outstanding batches, and how it ends.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "core/datapath/planner.h"
#include "core/datapath/request_checks.h"
#include "core/peers/peer_state.h"
#include "xfer/types.h"

namespace xfer {

class Request : public std::enable_shared_from_this<Request> {
 public:
  using Clock = std::chrono::steady_clock;

  // Sends a request's notification once it ended: once all its data landed (kCompleted), or,
  // to a peer that asked for outcomes (PeerState::notify_outcomes), once it failed, timed out
  // or was canceled, with the descriptors that landed. Then calls done with the target's
  // answer (ok: queued). done must be called exactly once; it may be called at once.
  using Done = std::function<void(Status)>;
  using Deliver = std::function<void(NotifyOutcome outcome, std::vector<uint64_t> landed, Done done)>;

  // start: when it was submitted (for its duration in the peer's metrics, where counted).
  // deliver: the request's notification (empty: it has none). checks: how it checks its
  // bytes (checks.ask empty: it does not).
  Request(RequestHandle id, Op op, Clock::time_point start, Clock::time_point deadline,
          std::shared_ptr<PeerState> peer, std::shared_ptr<const Plan> plan, Deliver deliver = {},
          RequestChecks checks = {});

  RequestHandle id() const { return id_; }
  bool done() const { return done_.load(std::memory_order_acquire); }
  size_t batch_count() const { return plan_.batches.size(); }
  size_t batches_in_flight() const { return plan_.batches_in_flight; }
  // One batch of at most max_bytes whose route would copy it inline (Route::CopiesInline).
  bool IsSmallCopy(uint64_t max_bytes) const;

  // Claims the next batch nobody has started and executes it on the calling thread (or
  // drops it when the request is stopping). False when every batch has been claimed. Streams
  // and the waiting caller all pull from here, so no thread idles while work is left. The
  // caller holds an execution slot of the StreamPool.
  bool RunNext();

  // Whether every batch goes directly over one route whose link is pipelined (ucx): then the caller starts
  // them all (StartNext, each under an execution slot) and whoever waits drives the link (Drive), so that one
  // thread keeps many requests in flight; no stream runs them.
  bool pipelined() const { return pipelined_ != nullptr; }
  // Claims the next batch and starts it on the pipelined link (or ends it here, when the
  // request is stopping or the batch cannot start). False when every batch has been claimed.
  bool StartNext();
  // Drives the link until every batch ended or `until` (at least one round).
  void Drive(Clock::time_point until);

  // Ask the request to stop; batches not yet started are dropped. First reason wins. A checked
  // request that waits (or will wait) for the peer's checksums ends at once, its bytes moved
  // but unchecked: kCanceled, or kTimeout once its deadline passed.
  void Cancel();
  void Fail(Status why) { Stop(StopReason::kFailed, std::move(why)); }

  // The current status; past the deadline a waiting request is asked to stop (kTimeout).
  RequestStatus Poll();
  // Waits until the request ends or `until` passes: spins for `spin`, then sleeps. While the
  // request only waits for its notification's answer, the spin ends early once `cores_busy()`
  // says other work needs the cores (see awaiting_answer_).
  RequestStatus WaitUntil(Clock::time_point until, std::chrono::microseconds spin,
                          const std::function<bool()>& cores_busy = {});

 private:
  enum class StopReason : uint8_t { kNone, kFailed, kCanceled, kTimeout };
  void Stop(StopReason reason, Status why);
  bool Stopping();
  Status CheckBeforeExecute() const;
  // The route whose pipelined link every batch takes (Plan::Batch::link), else null.
  static transport::Route* PipelinedRoute(const std::shared_ptr<PeerState>& peer, const Plan& plan);
  // Takes the next batch nobody has started; false when every batch has been taken. The
  // first one taken starts the checks (RequestCheck::Start).
  bool Claim(size_t* i);
  // Whether a batch may go out now: kCanceled when the request is stopping (the batch is
  // dropped), else the peer's and the regions' state.
  Status Admit();
  void RunBatch(size_t i);
  // A batch ended with `result`: ok counts its bytes on `counter` (the route's, or the peer's
  // staged bytes); kCanceled (from Admit) means it was dropped because the request was stopping.
  void EndBatch(size_t i, Status result, std::atomic<uint64_t>* counter);
  // Every batch has ended: the request ends, or (all data moved, with a notification) waits
  // for the target to queue the notification. A request that did not complete tells a target
  // that asked for outcomes, and ends without waiting for its answer.
  void Finish();
  // Finish's end once the ending is known: tells the target, or (completed, with a
  // notification) waits for it to queue the notification; then concludes.
  void End(RequestStatus st);
  // The checks of a request that checks its bytes ended (RequestCheck::Finish): it completes,
  // or fails (kDataCorrupted where a descriptor's sides differ).
  void Checked(const Status& why, const std::vector<uint32_t>& corrupt);
  void TellTheEnd(const RequestStatus& st) const;
  void Conclude(RequestStatus st);
  // The descriptors whose batches all moved their bytes (and, checked, whose sides do not
  // differ); mu_ held, every batch ended.
  std::vector<uint64_t> Landed() const;
  // Where the peer's metrics count batch i (EngineMetrics' backend index).
  int BackendOf(size_t i) const { return peer_->routes.routes[plan_.batches[i].route]->backend_index(); }
  // Counts the request's end in the peer's metrics, where they are kept.
  void CountEnd(StatusCode code) const;

  const RequestHandle id_;
  const Op op_;
  const Clock::time_point start_;
  const Clock::time_point deadline_;
  const std::shared_ptr<PeerState> peer_;
  const std::shared_ptr<const Plan> shared_plan_;  // (shared: a prepared request's plan is reused)
  const Plan& plan_;
  transport::Route* const pipelined_;  // null: batches run on streams and callers
  const Deliver deliver_;
  const std::unique_ptr<RequestCheck> checks_;  // null: the request does not check its bytes

  std::atomic<size_t> next_batch_{0};
  std::atomic<size_t> outstanding_;
  std::atomic<size_t> succeeded_{0};  // batches that moved their bytes
  std::atomic<StopReason> stop_{StopReason::kNone};
  std::atomic<bool> done_{false};
  // The data landed and the request waits for its notification's answer, which comes through
  // the control thread. Where the streams have work, a waiter sleeps rather than spin: it
  // would keep a core from them and from the threads that bring the answer. Idle, it spins: a
  // wake-up costs more than the spin (bench/RESULTS.md, "How the defaults were chosen").
  std::atomic<bool> awaiting_answer_{false};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  Status error_;                   // why it failed; mu_
  std::vector<uint32_t> unmoved_;  // batches that failed or were dropped; mu_
  RequestStatus final_;            // valid once done_; mu_
};

}  // namespace xfer
