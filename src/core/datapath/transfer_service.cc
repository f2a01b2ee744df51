#include "core/datapath/transfer_service.h"

#include <algorithm>

#include "util/checksum.h"
#include "util/log.h"

namespace xfer {

void TransferService::Start(std::shared_ptr<EngineMetrics> metrics,
                            std::shared_ptr<transport::BufferPool> staging, Notifications notifications,
                            Checksums checksums) {
  const EngineOptions& o = self_.options;
  metrics_ = std::move(metrics);
  staging_ = std::move(staging);
  notifications_ = std::move(notifications);
  checksums_ = std::move(checksums);
  pool_ = std::make_unique<StreamPool>(o.streams, o.spin);
  inline_ = std::make_unique<InlineCopies>(*pool_, peers_, regions_.registry(), self_.running);
}

void TransferService::Stop() {
  requests_.CancelAll();
  if (!pool_) return;
  pool_->Stop();                                  // runs what is queued: canceled batches end at once
  inline_->ForgetAll(self_.HeartbeatDeadline());  // (a caller's copy may hold a slot)
}

void TransferService::Clear() {
  requests_.Clear();
  lists_.Clear();  // (their sessions, closed by now, go with them)
}

void TransferService::AddGauges(MetricsSnapshot* out) const {
  AddValue(out, "xfer_staging_waits_total", MetricType::kCounter,
           "Times a batch waited for a staging buffer (all of them were in use).",
           static_cast<double>(staging_ ? staging_->waits() : 0));
  AddValue(out, "xfer_staging_buffers_in_use", MetricType::kGauge,
           "Staging buffers lent to batches now (of EngineOptions::staging_buffers).",
           static_cast<double>(staging_ ? staging_->in_use() : 0));
}

Status TransferService::Submit(const std::string& remote, Op op, const std::vector<TransferDesc>& descs,
                               std::chrono::milliseconds timeout, const TransferOptions& options, bool track,
                               bool try_inline, std::shared_ptr<Request>* out) {
  // The peer is looked up once, for an inline copy and for the request.
  Peer peer;
  bool found = false;
  if (try_inline) {
    const uint64_t version = peers_.version();  // (before the lookup: a later change looks again)
    bool by_name = false;
    found = peers_.Lookup(remote, &peer, &by_name);
    if (found && inline_->TryCopy(remote, version, peer, by_name, op, descs[0])) return Status::Ok();
  }
  // The request's deadline runs from here (auto-connecting included), and so does its
  // duration in the metrics.
  const auto start = Clock::now();
  Status s = self_.CheckRunning("Transfer");
  if (s.ok() && options.notify) s = notifications_.check("Transfer", *options.notify);
  if (s.ok() && descs.empty()) s = {StatusCode::kInvalidArgument, "no descriptors"};
  if (s.ok() && op != Op::kRead && op != Op::kWrite) s = {StatusCode::kInvalidArgument, "unknown op"};
  if (s.ok() && !found) s = try_inline ? peers_.FindAfterMiss(remote, &peer) : peers_.Find(remote, &peer);
  if (s.ok() && !peer.state->alive.load()) {
    s = {StatusCode::kConnectionLost, "peer '" + remote + "' is gone"};
  }
  if (s.ok() && !peer.state->Reachable()) {
    s = {StatusCode::kUnsupported, "no transport of this engine reaches peer '" + remote + "'"};
  }
  Plan plan;
  if (s.ok()) {
    LocalMemoryCheck local(regions_.registry());
    s = MakePlan(op, descs, peer.state->regions, local, peer.state->routes, &plan);
    if (s.code() == StatusCode::kRemoteAccessDenied && peers_.CaughtUp(peer, remote, timeout, &s)) {
      s = MakePlan(op, descs, peer.state->regions, local, peer.state->routes, &plan);
    }
  }
  if (!s.ok()) return Refused(op, remote, s);
  return NewRequest(op, start, timeout, peer, std::make_shared<const Plan>(std::move(plan)), options, track,
                    out);
}

Status TransferService::Refused(Op op, const std::string& remote, const Status& s) {
  XLOG(WARN) << OpName(op) << (remote.empty() ? " over prepared lists" : " to '" + remote + "'")
             << " refused: " << s.ToString();
  if (metrics_ && (op == Op::kRead || op == Op::kWrite)) metrics_->Refused(op, s.code());
  return s;
}

Status TransferService::CanCheck(const Peer& peer, const Plan& plan) const {
  if (!checksum::Available()) {
    return {StatusCode::kUnsupported, "checksum needs a build with libxxhash (libxxhash-dev)"};
  }
  const bool asks_peer =
      peer.session != nullptr &&
      std::any_of(plan.batches.begin(), plan.batches.end(), [](const Plan::Batch& b) { return !b.mapped; });
  if (asks_peer && !peer.state->answers_digests) {
    return {StatusCode::kUnsupported, "checksum: peer " + peer.state->info.name +
                                          " cannot check checksums (its build has no libxxhash)"};
  }
  const bool peer_gpu = std::any_of(plan.regions.begin(), plan.regions.end(),
                                    [](const auto& r) { return r->info.type == MemType::kCuda; });
  if (asks_peer && peer_gpu && !peer.state->sums_gpu_digests) {
    return {StatusCode::kUnsupported, "checksum: peer " + peer.state->info.name +
                                          " cannot check checksums of its GPU memory (an older build)"};
  }
  return Status::Ok();
}

Status TransferService::NewRequest(Op op, Clock::time_point start, std::chrono::milliseconds timeout,
                                   const Peer& peer, std::shared_ptr<const Plan> plan,
                                   const TransferOptions& options, bool track,
                                   std::shared_ptr<Request>* out) {
  RequestChecks checks;
  if (Checksummed(options)) {
    if (Status s = CanCheck(peer, *plan); !s.ok()) return Refused(op, peer.state->info.name, s);
    checks = {checksums_(peer), peer.session == nullptr, self_.corrupt_landed};
  }
  Request::Deliver deliver;
  if (options.notify) deliver = notifications_.delivery(peer, *options.notify);
  RequestHandle id = requests_.NextHandle();
  *out = std::make_shared<Request>(id, op, start, DeadlineAfter(start, timeout), peer.state, std::move(plan),
                                   std::move(deliver), std::move(checks));
  if (track) requests_.Track(*out);
  return Status::Ok();
}

void TransferService::Dispatch(const std::shared_ptr<Request>& req, bool caller_helps) {
  // Streams and (for sync transfers) the caller pull batches from the request. A one-batch
  // sync transfer thus runs on the caller's thread: a hand-off would cost more than it saves.
  // At most the batches worth running at once (tcp: two per link), a sync caller's included
  // (a caller in Wait() on an async request may run one more).
  const size_t n = req->batch_count() - (caller_helps ? 1 : 0);
  const size_t helpers = std::min({n, static_cast<size_t>(pool_->size()),
                                   std::max<size_t>(req->batches_in_flight(), 1) - (caller_helps ? 1 : 0)});
  for (size_t k = 0; k < helpers; ++k) {
    pool_->Submit(pool_->Pick(), [this, req] { HelpWith(*req, Clock::time_point::max()); });
  }
  if (caller_helps) HelpWith(*req, Clock::time_point::max());
}

void TransferService::HelpWith(Request& req, Clock::time_point until) {
  const bool forever = until == Clock::time_point::max();
  while (forever || Clock::now() < until) {
    // A slot per batch: a fence (a peer's deregistration, handled on the control thread)
    // then waits for one batch, not for the rest of a long request.
    auto slot = pool_->Slot();
    if (!req.RunNext()) break;
  }
}

void TransferService::StartAll(const std::shared_ptr<Request>& req) {
  for (;;) {
    auto slot = pool_->Slot();  // a fence waits for a batch being started, as for one running
    if (!req->StartNext()) break;
  }
  // The batches of a long request spread over the link's endpoints (rails): streams drive the
  // endpoints the caller does not, one each.
  const size_t drivers =
      std::min({req->batch_count(), static_cast<size_t>(pool_->size()), req->batches_in_flight()});
  for (size_t k = 1; k < drivers; ++k) {
    pool_->Submit(pool_->Pick(), [req] { req->Drive(Clock::time_point::max()); });
  }
}

void TransferService::FenceStreams(Clock::time_point deadline, bool control_thread) {
  // Late, a link is asked about the last stretch as long as the fence's wait: a peer that
  // moved one frame after the fence began and then stalled is caught too.
  const auto wait = deadline - Clock::now();
  pool_->Fence(
      deadline,
      [&] {
        const auto since = Clock::now() - wait;
        for (const auto& p : peers_.Every()) {
          for (const auto& r : p->routes.routes) r->link().Interrupt(since, control_thread);
        }
      },
      control_thread);
}

void TransferService::FenceBatches(PeerState* peer, Clock::time_point deadline, bool control_thread) {
  // Every pipelined link's batches in flight now, before any wait uses up the deadline.
  std::vector<std::pair<transport::Link*, uint64_t>> marks;
  std::vector<std::shared_ptr<PeerState>> peers;  // (kept alive while their links are fenced)
  if (peer == nullptr) peers = peers_.Every();
  auto mark = [&marks](const PeerState& p) {
    for (const auto& r : p.routes.routes) {
      if (r->link().pipelined()) marks.emplace_back(&r->link(), r->link().QuiesceMark());
    }
  };
  if (peer != nullptr) mark(*peer);
  for (const auto& p : peers) mark(*p);
  FenceStreams(deadline, control_thread);
  for (auto [link, upto] : marks) link->Quiesce(upto, deadline);
}

Status TransferService::TransferSync(const std::string& remote, Op op, const std::vector<TransferDesc>& descs,
                                     std::chrono::milliseconds timeout, const TransferOptions& options,
                                     RequestStatus* result) {
  bool eligible = false;
  if (TryInline(remote, op, descs, timeout, options, UINT64_MAX, &eligible)) {
    if (result != nullptr) *result = {RequestState::kCompleted, {}, {}};
    return Status::Ok();
  }
  std::shared_ptr<Request> req;
  Status s = Submit(remote, op, descs, timeout, options, false, eligible, &req);
  if (s.ok() && !req) {  // copied inline, once the peer was looked up
    if (result != nullptr) *result = {RequestState::kCompleted, {}, {}};
    return s;
  }
  return RunSync(s, req, timeout, result);
}

Status TransferService::RunSync(const Status& submitted, const std::shared_ptr<Request>& req,
                                std::chrono::milliseconds timeout, RequestStatus* result) {
  if (!submitted.ok()) {
    if (result != nullptr) *result = {RequestState::kFailed, submitted, {}};
    return submitted;
  }
  // The request's own deadline ends it; the extra second only bounds the drain of batches
  // already in flight when the deadline passed.
  const auto until = DeadlineAfter(timeout + std::chrono::seconds(1));
  if (req->pipelined()) {
    StartAll(req);
    req->Drive(until);
  } else {
    Dispatch(req, true);
  }
  RequestStatus st = req->WaitUntil(until, self_.options.spin, [this] { return pool_->Busy(); });
  if (st.state == RequestState::kWaiting) {
    // A batch still running, or a notification the peer has not answered yet (the session's
    // heartbeat bounds that wait).
    req->Cancel();
    const auto drain =
        std::max<std::chrono::milliseconds>(std::chrono::seconds(60), 2 * self_.options.heartbeat_timeout);
    st = req->WaitUntil(DeadlineAfter(drain), self_.options.spin);
    if (st.state == RequestState::kWaiting) {
      st = {RequestState::kTimeout, {StatusCode::kTimeout, "transfer timed out: a batch did not end"}, {}};
    }
  }
  if (result != nullptr) *result = st;
  return st.status;
}

Status TransferService::TransferAsync(const std::string& remote, Op op,
                                      const std::vector<TransferDesc>& descs,
                                      std::chrono::milliseconds timeout, const TransferOptions& options,
                                      RequestHandle* request) {
  if (request == nullptr) return {StatusCode::kInvalidArgument, "TransferAsync: null request pointer"};
  // One small descriptor into a same-host peer's AllocMem memory (or this process's memory):
  // copied here, as a sync one is, and the request is over when its handle comes back (a
  // hand-off to a stream would cost more than the copy). Larger copies go to the streams: the
  // caller is not held.
  bool eligible = false;
  if (TryInline(remote, op, descs, timeout, options, kAsyncInlineBytes, &eligible)) {
    *request = requests_.TrackCompleted();
    return Status::Ok();
  }
  std::shared_ptr<Request> req;
  Status s = Submit(remote, op, descs, timeout, options, true, eligible, &req);
  if (!s.ok()) return s;
  if (!req) {  // copied inline, once the peer was looked up
    *request = requests_.TrackCompleted();
    return s;
  }
  *request = req->id();
  Start(req);
  return Status::Ok();
}

void TransferService::Start(const std::shared_ptr<Request>& req) {
  // Likewise a planned request that is one small memcpy (several descriptors, say): the copy
  // costs less than handing it to a stream.
  if (req->IsSmallCopy(kAsyncInlineBytes)) {
    HelpWith(*req, Clock::time_point::max());
  } else if (req->pipelined()) {
    StartAll(req);
  } else {
    Dispatch(req, false);
  }
}

namespace {
Status UnknownRequest(const char* what, RequestHandle h) {
  return {StatusCode::kInvalidArgument, std::string(what) + ": unknown request " + std::to_string(h) +
                                            " (never issued, or its end was already reported)"};
}
}  // namespace

Status TransferService::GetTransferStatus(RequestHandle h, RequestStatus* status) {
  Status s = self_.CheckRunning("GetTransferStatus");
  if (!s.ok()) return s;
  if (status == nullptr) return {StatusCode::kInvalidArgument, "GetTransferStatus: null status"};
  std::shared_ptr<Request> req;
  if (!requests_.Find(h, true, &req)) return UnknownRequest("GetTransferStatus", h);
  if (!req) {  // over at submission
    *status = {RequestState::kCompleted, {}, {}};
    return Status::Ok();
  }
  if (!req->done() && req->pipelined()) req->Drive(Clock::now());  // one round of progress
  RequestStatus st = req->Poll();
  if (st.state != RequestState::kWaiting && !requests_.TakeIfDone(h, st)) {
    return UnknownRequest("GetTransferStatus", h);  // another thread was told first
  }
  *status = st;
  return Status::Ok();
}

Status TransferService::Wait(RequestHandle h, std::chrono::milliseconds timeout, RequestStatus* status) {
  Status s = self_.CheckRunning("Wait");
  if (!s.ok()) return s;
  std::shared_ptr<Request> req;
  if (!requests_.Find(h, true, &req)) return UnknownRequest("Wait", h);
  if (!req) {  // over at submission
    if (status != nullptr) *status = {RequestState::kCompleted, {}, {}};
    return Status::Ok();
  }
  // Batches no stream has started yet run here rather than wait in a queue. (A request that is
  // over already reads no clock: a clock read costs a fair part of a small copy.)
  RequestStatus st;
  if (req->done()) {
    st = req->Poll();
  } else {
    const auto until = DeadlineAfter(timeout);
    if (req->pipelined()) {
      req->Drive(until);
    } else {
      HelpWith(*req, until);
    }
    st = req->WaitUntil(until, self_.options.spin, [this] { return pool_->Busy(); });
  }
  if (st.state == RequestState::kWaiting) {
    if (status != nullptr) *status = st;
    return {StatusCode::kTimeout, "Wait: request " + std::to_string(h) + " still running"};
  }
  if (!requests_.TakeIfDone(h, st)) return UnknownRequest("Wait", h);  // another thread was told first
  if (status != nullptr) *status = st;
  return st.status;
}

Status TransferService::Cancel(RequestHandle h) {
  Status s = self_.CheckRunning("Cancel");
  if (!s.ok()) return s;
  std::shared_ptr<Request> req;
  if (!requests_.Find(h, false, &req)) return UnknownRequest("Cancel", h);
  if (req) req->Cancel();  // (null: over already)
  return Status::Ok();
}

}  // namespace xfer
