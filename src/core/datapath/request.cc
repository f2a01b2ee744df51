#include "core/datapath/request.h"

#include <algorithm>

#include "util/log.h"
#include "util/spin.h"

namespace xfer {

Request::Request(RequestHandle id, Op op, Clock::time_point start, Clock::time_point deadline,
                 std::shared_ptr<PeerState> peer, std::shared_ptr<const Plan> plan, Deliver deliver,
                 RequestChecks checks)
    : id_(id),
      op_(op),
      start_(start),
      deadline_(deadline),
      peer_(std::move(peer)),
      shared_plan_(std::move(plan)),
      plan_(*shared_plan_),
      pipelined_(PipelinedRoute(peer_, plan_)),
      deliver_(std::move(deliver)),
      checks_(checks.ask ? std::make_unique<RequestCheck>(plan_, op_, std::move(checks)) : nullptr),
      outstanding_(plan_.batches.size()) {
  if (peer_ && peer_->metrics) peer_->metrics->Started(op_, plan_.bytes);
}

void Request::Stop(StopReason reason, Status why) {
  std::lock_guard lock(mu_);  // rare: keeps the first reason and its error together
  if (stop_.load() != StopReason::kNone) return;
  if (reason == StopReason::kFailed) error_ = std::move(why);
  stop_.store(reason, std::memory_order_release);
}

void Request::Cancel() {
  Stop(StopReason::kCanceled, {});
  if (!checks_ || done()) return;
  checks_->Cancel(Clock::now() >= deadline_
                      ? Status(StatusCode::kTimeout, "the deadline passed before the peer's checksums came")
                      : Status(StatusCode::kCanceled, "canceled before the peer's checksums came"));
}

bool Request::Stopping() {
  if (stop_.load(std::memory_order_acquire) != StopReason::kNone) return true;
  if (Clock::now() >= deadline_) {
    Stop(StopReason::kTimeout, {});
    return true;
  }
  return false;
}

Status Request::CheckBeforeExecute() const {
  bool revoked = false;
  for (const auto& r : plan_.regions) revoked = revoked || r->revoked.load(std::memory_order_acquire);
  // A peer that goes away is marked dead before its regions are revoked: read in the other
  // order, a revoked region of a dead peer is reported as the peer's loss.
  if (!peer_->alive.load(std::memory_order_acquire)) {
    return {StatusCode::kConnectionLost, "peer " + peer_->info.name + " is gone"};
  }
  if (revoked) {
    return {StatusCode::kRemoteAccessDenied,
            "peer " + peer_->info.name + " deregistered the remote region during the transfer"};
  }
  return Status::Ok();
}

bool Request::Claim(size_t* i) {
  if (next_batch_.load(std::memory_order_relaxed) >= plan_.batches.size()) return false;
  *i = next_batch_.fetch_add(1, std::memory_order_relaxed);
  // (Before any byte moves; not for a request that ends before it began.)
  if (*i == 0 && checks_ && !Stopping()) checks_->Start(deadline_, shared_from_this());
  return *i < plan_.batches.size();
}

bool Request::RunNext() {
  size_t i;
  if (!Claim(&i)) return false;
  RunBatch(i);
  return true;
}

void Request::RunBatch(size_t i) {
  Status s = Admit();
  const Plan::Batch& b = plan_.batches[i];
  transport::Route& route = *peer_->routes.routes[b.route];
  std::atomic<uint64_t>* counter = b.staged ? &route.staged_bytes() : &route.bytes();
  if (s.ok()) {
    const auto slices = std::span(plan_.slices).subspan(b.begin, b.end - b.begin);
    // (The plan holds the regions, and a region what was opened of it, for mapping routes.)
    s = b.link != nullptr
            ? b.link->Execute(op_, slices, deadline_)
            : Status{StatusCode::kInternal, "no link for a batch over " + std::string(route.backend())};
  }
  EndBatch(i, std::move(s), counter);
}

bool Request::IsSmallCopy(uint64_t max_bytes) const {
  if (plan_.batches.size() != 1 || plan_.bytes > max_bytes) return false;
  const Plan::Batch& b = plan_.batches[0];
  if (b.staged || b.streaming) return false;
  const transport::Route& route = *peer_->routes.routes[b.route];
  for (uint32_t k = b.begin; k < b.end; ++k) {
    if (!route.CopiesInline(plan_.slices[k].len)) return false;
  }
  return true;
}

transport::Route* Request::PipelinedRoute(const std::shared_ptr<PeerState>& peer, const Plan& plan) {
  if (!peer || plan.batches.empty()) return nullptr;
  transport::Link* const link = plan.batches[0].link;
  if (link == nullptr || !link->pipelined()) return nullptr;
  for (const auto& b : plan.batches) {
    if (b.link != link) return nullptr;
  }
  return peer->routes.routes[plan.batches[0].route].get();
}

Status Request::Admit() {
  if (Stopping()) return {StatusCode::kCanceled, "request stopping: batch dropped"};
  return CheckBeforeExecute();
}

bool Request::StartNext() {
  size_t i;
  if (!Claim(&i)) return false;
  Status s = Admit();
  if (!s.ok()) {
    EndBatch(i, std::move(s), nullptr);
    return true;
  }
  const Plan::Batch& b = plan_.batches[i];
  // The callbacks hold the request, and so the plan that the slices live in. A batch still
  // waiting for its turn is admitted again just before it goes out.
  b.link->Start(
      op_, std::span(plan_.slices).subspan(b.begin, b.end - b.begin), deadline_,
      [self = shared_from_this(), i](Status st) {
        self->EndBatch(i, std::move(st), &self->pipelined_->bytes());
      },
      [self = shared_from_this()] { return self->Admit(); });
  return true;
}

void Request::Drive(Clock::time_point until) {
  // Until every batch ended: a notification's answer comes on the control thread, not the link.
  plan_.batches[0].link->Drive(until, [this] { return outstanding_.load(std::memory_order_acquire) == 0; });
}

void Request::EndBatch(size_t i, Status result, std::atomic<uint64_t>* counter) {
  if (result.ok()) {
    if (checks_) checks_->BatchMoved(i);  // (while its bytes are in the caches)
    counter->fetch_add(plan_.batches[i].bytes, std::memory_order_relaxed);
    if (EngineMetrics* m = peer_->metrics.get()) {
      m->Moved(peer_->metrics_slot, op_, BackendOf(i), plan_.batches[i].bytes);
    }
    succeeded_.fetch_add(1, std::memory_order_relaxed);
  } else {
    {
      std::lock_guard lock(mu_);
      unmoved_.push_back(static_cast<uint32_t>(i));
    }
    if (result.code() != StatusCode::kCanceled) {  // (kCanceled: dropped, see Admit)
      if (Clock::now() >= deadline_) {
        Stop(StopReason::kTimeout, {});  // the transport gave up at the request's deadline
      } else {
        Fail(std::move(result));
      }
    }
  }
  if (outstanding_.fetch_sub(1, std::memory_order_acq_rel) == 1) Finish();
}

void Request::Finish() {
  RequestStatus st;
  {
    std::lock_guard lock(mu_);
    // A cancel or deadline that came after every batch had started, and all moved their
    // bytes, changed nothing: the transfer is complete. (A request that checks its bytes and
    // still waits for its peer's checksums then ends canceled or timed out: RequestCheck::Cancel.)
    const bool all_moved = succeeded_.load(std::memory_order_relaxed) == plan_.batches.size();
    switch (all_moved ? StopReason::kNone : stop_.load()) {
      case StopReason::kNone:
        st.state = RequestState::kCompleted;
        break;
      case StopReason::kFailed:
        st = {RequestState::kFailed, error_, {}};
        break;
      case StopReason::kCanceled:
        st = {RequestState::kCanceled, {StatusCode::kCanceled, "request canceled"}, {}};
        break;
      case StopReason::kTimeout:
        st = {RequestState::kTimeout, {StatusCode::kTimeout, "request deadline passed"}, {}};
        break;
    }
    if (st.state != RequestState::kCompleted) st.landed = Landed();
  }
  if (st.state != RequestState::kCompleted && checks_) checks_->Abandon();  // (a READ's ask under way)
  if (st.state == RequestState::kCompleted && checks_) {
    awaiting_answer_.store(true, std::memory_order_release);  // (the peer's checksums)
    return checks_->Finish(
        deadline_,
        [self = shared_from_this()](Status why, std::vector<uint32_t> corrupt) {
          self->Checked(why, corrupt);
        },
        shared_from_this());
  }
  End(std::move(st));
}

void Request::Checked(const Status& why, const std::vector<uint32_t>& corrupt) {
  RequestStatus st;
  if (!corrupt.empty()) {
    std::string what = "descriptor " + std::to_string(corrupt[0]) +
                       ": its bytes where they landed differ from where they came from";
    if (corrupt.size() > 1) what += ", and " + std::to_string(corrupt.size() - 1) + " more descriptors";
    st = {RequestState::kFailed, {StatusCode::kDataCorrupted, what}, {}};
  } else if (!why.ok()) {  // (unchecked: the bytes moved, but nobody knows whether intact)
    const RequestState state = why.code() == StatusCode::kTimeout    ? RequestState::kTimeout
                               : why.code() == StatusCode::kCanceled ? RequestState::kCanceled
                                                                     : RequestState::kFailed;
    st = {state, {why.code(), "checksum: " + why.message()}, {}};
  } else {
    return End({RequestState::kCompleted, {}, {}});
  }
  const std::string what =
      std::string(OpName(op_)) + " to " + peer_->info.name + " failed: " + st.status.ToString();
  if (st.state == RequestState::kCanceled) {
    XLOG(INFO) << what;  // (asked for)
  } else {
    XLOG(WARN) << what;
  }
  {
    std::lock_guard lock(mu_);
    st.landed = Landed();
  }
  End(std::move(st));
}

void Request::End(RequestStatus st) {
  if (st.state != RequestState::kCompleted || !deliver_) {
    if (deliver_) TellTheEnd(st);  // (queued before the request ends: ahead of later ones)
    return Conclude(std::move(st));
  }
  // The data landed; the request ends when the target has queued the notification (a stop
  // asked for now changes nothing: the notification is on its way).
  awaiting_answer_.store(true, std::memory_order_release);
  deliver_(NotifyOutcome::kCompleted, {}, [self = shared_from_this()](Status queued) {
    if (EngineMetrics* m = self->peer_->metrics.get()) m->events().Sent(queued);
    if (queued.ok()) return self->Conclude({RequestState::kCompleted, {}, {}});
    RequestStatus failed{RequestState::kFailed, std::move(queued), {}};
    {
      std::lock_guard lock(self->mu_);
      failed.landed = self->Landed();  // all of them
    }
    self->Conclude(std::move(failed));
  });
}

void Request::TellTheEnd(const RequestStatus& st) const {
  if (!peer_->notify_outcomes) return;
  const NotifyOutcome outcome = st.state == RequestState::kTimeout    ? NotifyOutcome::kTimedOut
                                : st.state == RequestState::kCanceled ? NotifyOutcome::kCanceled
                                                                      : NotifyOutcome::kFailed;
  deliver_(outcome, st.landed, [metrics = peer_->metrics](const Status& queued) {
    if (metrics) metrics->events().Sent(queued);
  });
}

void Request::CountEnd(StatusCode code) const {
  EngineMetrics* m = peer_ ? peer_->metrics.get() : nullptr;
  if (m == nullptr || plan_.batches.empty()) return;
  m->Ended(peer_->metrics_slot, op_, BackendOf(0), plan_.bytes, std::max<uint64_t>(plan_.desc_ends.size(), 1),
           start_, code);
}

void Request::Conclude(RequestStatus st) {
  CountEnd(st.status.code());
  {
    std::lock_guard lock(mu_);
    final_ = std::move(st);
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

std::vector<uint64_t> Request::Landed() const {
  std::vector<uint64_t> landed = LandedDescriptors(plan_, unmoved_);
  if (!checks_) return landed;
  const std::vector<uint32_t> corrupt = checks_->Corrupt();
  std::erase_if(landed, [&](uint64_t k) { return std::binary_search(corrupt.begin(), corrupt.end(), k); });
  return landed;
}

RequestStatus Request::Poll() {
  if (done_.load(std::memory_order_acquire)) {
    std::lock_guard lock(mu_);
    return final_;
  }
  Stopping();  // turns a passed deadline into a stop request
  return {};
}

RequestStatus Request::WaitUntil(Clock::time_point until, std::chrono::microseconds spin,
                                 const std::function<bool()>& cores_busy) {
  if (!done_.load(std::memory_order_acquire)) {  // (a request over already reads no clock)
    auto spin_until = std::min(until, Clock::now() + spin);
    Backoff backoff;
    for (unsigned step = 1; !done_.load(std::memory_order_acquire) && Clock::now() < spin_until; ++step) {
      if (step % 16 == 0 && cores_busy && awaiting_answer_.load(std::memory_order_acquire) && cores_busy())
        break;
      backoff.Pause();
    }
  }
  std::unique_lock lock(mu_);
  while (!done_.load()) {
    auto now = Clock::now();
    if (now >= deadline_) {
      // Past the deadline: stop the request, then wait (up to `until`) for the batches still
      // in flight to finish; queued ones are dropped as soon as a stream reaches them.
      lock.unlock();
      Stopping();
      lock.lock();
      cv_.wait_until(lock, until, [&] { return done_.load(); });
      break;
    }
    if (now >= until) break;
    cv_.wait_until(lock, std::min(until, deadline_));
  }
  return done_.load() ? final_ : RequestStatus{};
}

}  // namespace xfer
