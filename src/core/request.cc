#include "core/request.h"

#include "transport/cuda/cuda_api.h"
#include "transport/local/local_transport.h"
#include "util/spin.h"

namespace xfer {

Request::Request(RequestHandle id, Op op, Clock::time_point deadline,
                 std::shared_ptr<PeerState> peer, Plan plan)
    : id_(id),
      op_(op),
      deadline_(deadline),
      peer_(std::move(peer)),
      plan_(std::move(plan)),
      pipelined_(Pipelined(peer_, plan_)),
      outstanding_(plan_.batches.size()) {}

std::shared_ptr<Request> Request::Completed(RequestHandle id, Op op) {
  auto r = std::make_shared<Request>(id, op, Clock::time_point::max(), nullptr, Plan{});
  r->final_.state = RequestState::kCompleted;
  r->done_.store(true, std::memory_order_release);
  return r;
}

void Request::Stop(StopReason reason, Status why) {
  std::lock_guard lock(mu_);  // rare: keeps the first reason and its error together
  if (stop_.load() != StopReason::kNone) return;
  if (reason == StopReason::kFailed) error_ = std::move(why);
  stop_.store(reason, std::memory_order_release);
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
  std::atomic<uint64_t>* counter = &peer_->link_bytes;
  if (s.ok()) {
    const Plan::Batch& b = plan_.batches[i];
    const auto slices = std::span(plan_.slices).subspan(b.begin, b.end - b.begin);
    // (The plan holds the regions, and a region its mapping, for shm and cuda.)
    switch (b.path) {
      case Path::kShm:
        transport::CopyInProcess(op_, slices, b.streaming);
        counter = &peer_->shm_bytes;
        break;
      case Path::kCuda:
        s = transport::cuda::Copy(op_, slices, deadline_);
        counter = &peer_->cuda_bytes;
        break;
      case Path::kStaged:
        s = peer_->staging->Run(op_, slices, b.device, b.gpu_link ? *peer_->gpu_link : *peer_->link,
                                deadline_);
        counter = &peer_->staged_bytes;
        break;
      case Path::kLink:
        s = (b.gpu_link ? peer_->gpu_link : peer_->link)->Execute(op_, slices, deadline_);
        break;
    }
  }
  EndBatch(i, std::move(s), counter);
}

bool Request::Pipelined(const std::shared_ptr<PeerState>& peer, const Plan& plan) {
  if (!peer || !peer->link || !peer->link->pipelined()) return false;
  for (const auto& b : plan.batches) {
    if (b.path != Path::kLink || b.gpu_link) return false;
  }
  return true;
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
  peer_->link->Start(op_, std::span(plan_.slices).subspan(b.begin, b.end - b.begin), deadline_,
                     [self = shared_from_this(), i](Status st) {
                       self->EndBatch(i, std::move(st), &self->peer_->link_bytes);
                     },
                     [self = shared_from_this()] { return self->Admit(); });
  return true;
}

void Request::Drive(Clock::time_point until) {
  peer_->link->Drive(until, [this] { return done(); });
}

void Request::EndBatch(size_t i, Status result, std::atomic<uint64_t>* counter) {
  if (result.ok()) {
    counter->fetch_add(plan_.batches[i].bytes, std::memory_order_relaxed);
    succeeded_.fetch_add(1, std::memory_order_relaxed);
  } else if (result.code() != StatusCode::kCanceled) {  // (kCanceled: dropped, see Admit)
    if (Clock::now() >= deadline_) {
      Stop(StopReason::kTimeout, {});  // the transport gave up at the request's deadline
    } else {
      Fail(std::move(result));
    }
  }
  if (outstanding_.fetch_sub(1, std::memory_order_acq_rel) == 1) Finish();
}

void Request::Finish() {
  RequestStatus st;
  {
    std::lock_guard lock(mu_);
    // A cancel or deadline that came after every batch had started, and all moved their
    // bytes, changed nothing: the transfer is complete.
    const bool all_moved = succeeded_.load(std::memory_order_relaxed) == plan_.batches.size();
    switch (all_moved ? StopReason::kNone : stop_.load()) {
      case StopReason::kNone: st.state = RequestState::kCompleted; break;
      case StopReason::kFailed: st = {RequestState::kFailed, error_}; break;
      case StopReason::kCanceled:
        st = {RequestState::kCanceled, {StatusCode::kCanceled, "request canceled"}};
        break;
      case StopReason::kTimeout:
        st = {RequestState::kTimeout, {StatusCode::kTimeout, "request deadline passed"}};
        break;
    }
    final_ = st;
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

RequestStatus Request::Poll() {
  if (done_.load(std::memory_order_acquire)) {
    std::lock_guard lock(mu_);
    return final_;
  }
  Stopping();  // turns a passed deadline into a stop request
  return {};
}

RequestStatus Request::WaitUntil(Clock::time_point until, std::chrono::microseconds spin) {
  if (!done_.load(std::memory_order_acquire)) {  // (a clock read costs ~30 ns on this VM)
    auto spin_until = std::min(until, Clock::now() + spin);
    Backoff backoff;
    while (!done_.load(std::memory_order_acquire) && Clock::now() < spin_until) {
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
