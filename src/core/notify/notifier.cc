#include "core/notify/notifier.h"

#include <future>
#include <mutex>
#include <unordered_map>

#include "control/wire.h"
#include "core/notify/ring_record.h"
#include "util/log.h"

namespace xfer {

namespace {
// A notification of message as its request ended (its sender is filled in where it is sent
// or received).
Notification NotificationOf(std::string message, NotifyOutcome outcome = NotifyOutcome::kCompleted,
                            std::vector<uint64_t> landed = {}) {
  Notification n;
  n.message = std::move(message);
  n.outcome = outcome;
  n.landed = std::move(landed);
  return n;
}

// A notification from the peer of session s (which said hello).
Notification FromPeer(const control::Session& s, std::string message,
                      NotifyOutcome outcome = NotifyOutcome::kCompleted, std::vector<uint64_t> landed = {}) {
  Notification n = NotificationOf(std::move(message), outcome, std::move(landed));
  if (const PeerState* peer = PeerOf(s)) {
    n.sender = peer->info.name;
    n.sender_incarnation = peer->info.incarnation;
  }
  return n;
}
}  // namespace

// What every delivery holds: this engine's own queue, and the rings it offered its peers.
class Notifier::Sender {
 public:
  Sender(std::shared_ptr<NotifyQueue> own, std::string name, uint64_t incarnation)
      : own_(std::move(own)), name_(std::move(name)), incarnation_(incarnation) {}

  // A notification for this engine itself: queued here.
  void PushOwn(Notification n, Done done) const {
    n.sender = name_;
    n.sender_incarnation = incarnation_;
    done(own_->Push(std::move(n)));
  }

  // A completed request's (or SendNotify's) message: into the peer's ring where it takes it,
  // else over the session (ordered all the same: notify_rings.h).
  void Send(const Peer& peer, std::string message, Done done) const {
    if (!peer.session) return PushOwn(NotificationOf(std::move(message)), std::move(done));
    std::shared_ptr<NotifyOutbox> box = OutboxOf(peer.state.get());
    const std::string* record = &message;
    if (box && box->typed())
      record = &Record(RingRecord::Kind::kNotify, 0, NotifyOutcome::kCompleted, {}, message);
    Frame frame = [&](uint64_t k) -> wire::Message { return wire::Notify{k, std::move(message)}; };
    Post(peer, std::move(box), record, frame, std::move(done));
  }

  // A notified request toward a peer that asked for outcomes: its beginning now, into the
  // peer's typed ring or else as NotifyBegin over the session (not answered), and what sends
  // its end (the same way, where it fits: notify_rings.h) once the request ended; its done
  // hears how that went (over the session: the answer; kResourceExhausted when the target
  // could not hold the beginning).
  static Notifier::Deliver Begin(std::shared_ptr<const Sender> self, const Peer& peer, std::string message) {
    const uint64_t begin = self->next_begin_.fetch_add(1, std::memory_order_relaxed);
    std::shared_ptr<NotifyOutbox> box = self->OutboxOf(peer.state.get());
    if (box &&
        box->TryBegin(Record(RingRecord::Kind::kBegin, begin, NotifyOutcome::kCompleted, {}, message))) {
      return [self, peer, box, begin, message = std::move(message)](NotifyOutcome outcome,
                                                                    std::vector<uint64_t> landed, Done done) {
        const std::string& record = Record(RingRecord::Kind::kEnded, begin, outcome, landed, message);
        Frame frame = [&](uint64_t k) -> wire::Message {
          return wire::NotifyEnded{k, begin, outcome, std::move(landed)};
        };
        self->Post(peer, box, &record, frame, std::move(done));
      };
    }
    (void)peer.session->Send(wire::NotifyBegin{begin, std::move(message)});  // (lost: so is the end)
    return [self, peer, box, begin](NotifyOutcome outcome, std::vector<uint64_t> landed, Done done) {
      Frame frame = [&](uint64_t k) -> wire::Message {
        return wire::NotifyEnded{k, begin, outcome, std::move(landed)};
      };
      self->Post(peer, box, nullptr, frame, std::move(done));
    };
  }

  // The ring of a peer's state, from its making to the state's end.
  void Keep(const std::shared_ptr<PeerState>& peer, std::shared_ptr<NotifyOutbox> box) {
    std::lock_guard lock(mu_);
    std::erase_if(outboxes_, [](const auto& e) { return e.second.peer.expired(); });
    outboxes_[peer.get()] = Kept{peer, std::move(box)};
  }
  // The peer's ring closes: every later write answers kConnectionLost.
  void Close(const PeerState* peer) {
    if (std::shared_ptr<NotifyOutbox> box = OutboxOf(peer)) box->Close();
  }
  std::shared_ptr<NotifyOutbox> OutboxOf(const PeerState* peer) const {
    std::lock_guard lock(mu_);
    auto it = outboxes_.find(peer);
    return it == outboxes_.end() || it->second.peer.expired() ? nullptr : it->second.box;
  }

 private:
  using Frame = std::function<wire::Message(uint64_t seq)>;
  // A typed ring's record, in this thread's own string: valid until its next call here (the
  // callers write it into the ring before they call anything else).
  static const std::string& Record(RingRecord::Kind kind, uint64_t id, NotifyOutcome outcome,
                                   std::span<const uint64_t> landed, std::string_view message) {
    thread_local std::string record;
    EncodeRingRecord(kind, id, outcome, landed, message, &record);
    return record;
  }
  // Into the peer's ring, box (when ring_record is given, the ring is open and nothing sent
  // over the session awaits its answer), else over the session as frame; done hears the
  // outcome.
  void Post(const Peer& peer, std::shared_ptr<NotifyOutbox> box, const std::string* ring_record,
            const Frame& frame, Done done) const {
    if (box) {
      Status written;
      if (box->TryWrite(ring_record, &written)) {
        if (written.code() == StatusCode::kConnectionLost && box->Inconsistent()) {
          XLOG(WARN) << "peer " << peer.session->peer_key << ": " << written.message()
                     << "; closing its session";
          peer.session->Shutdown("its notification ring is inconsistent");
        }
        return done(std::move(written));
      }
      done = [box, done = std::move(done)](Status answer) {
        box->SessionAnswered();
        done(std::move(answer));
      };
    }
    uint64_t seq = 0;
    (void)peer.session->SendNumbered(frame, &seq, std::move(done));  // done: the answer, or the loss
  }

  const std::shared_ptr<NotifyQueue> own_;
  const std::string name_;  // this engine's, as the sender of its own notifications
  const uint64_t incarnation_;
  mutable std::atomic<uint64_t> next_begin_{1};  // NotifyBegin's ids
  // The rings of this engine's peers on this host, by their state. An entry outlives its
  // state's end (closed, so that late notifications fail as they did in the state) until the
  // state is destroyed: its address may then be another state's, which the expired weak
  // reference tells apart.
  struct Kept {
    std::weak_ptr<const PeerState> peer;
    std::shared_ptr<NotifyOutbox> box;
  };
  mutable std::mutex mu_;
  std::unordered_map<const PeerState*, Kept> outboxes_;  // mu_
};

void Notifier::Start(std::shared_ptr<EngineMetrics> metrics) {
  const EngineOptions::Notify& o = self_.options.notify;
  metrics_ = std::move(metrics);
  queue_ = std::make_shared<NotifyQueue>(o.queue_messages, o.queue_bytes);
  begun_ = std::make_unique<BegunRequests>(queue_.get(), o);
  sender_ = std::make_shared<Sender>(queue_, self_.name, self_.incarnation);
  inbox_ = std::make_unique<NotifyInbox>(
      queue_.get(), &metrics_->events().notifies_received, &metrics_->events().notifies_refused,
      o.outcomes ? begun_.get() : nullptr, o.max_message_bytes, NotifyRing::kHeaderBytes + o.queue_bytes);
  if (std::string why; o.ring_bytes != 0 && !(rings_possible_ = shared_memory::Available(&why))) {
    XLOG(INFO) << "notifications to peers on this host go over the control session: no shared rings here ("
               << why << ")";
  }
}

void Notifier::Close() {
  if (queue_) queue_->Close();
}

Status Notifier::CheckMessage(const char* what, const std::string& message) const {
  const uint32_t most = self_.options.notify.max_message_bytes;
  if (message.size() <= most) return Status::Ok();
  return {StatusCode::kInvalidArgument,
          std::string(what) + ": a notification of " + std::to_string(message.size()) +
              " bytes exceeds EngineOptions::notify.max_message_bytes (" + std::to_string(most) + ")"};
}

Notifier::Deliver Notifier::Delivery(const Peer& peer, std::string message) const {
  std::shared_ptr<const Sender> sender = sender_;
  if (!peer.session) {  // (this engine itself: any outcome goes into its queue)
    return [sender, message = std::move(message)](NotifyOutcome outcome, std::vector<uint64_t> landed,
                                                  Done done) mutable {
      sender->PushOwn(NotificationOf(std::move(message), outcome, std::move(landed)), std::move(done));
    };
  }
  if (peer.state->notify_outcomes) return Sender::Begin(sender, peer, std::move(message));
  // (Only kCompleted: Request::TellTheEnd asks peers with outcomes alone.)
  return
      [sender, peer, message = std::move(message)](NotifyOutcome, std::vector<uint64_t>, Done done) mutable {
        sender->Send(peer, std::move(message), std::move(done));  // (called once)
      };
}

void Notifier::PeerMade(const std::shared_ptr<PeerState>& peer) {
  if (!rings_possible_ || !peer->on_this_host) return;
  const EngineOptions::Notify& o = self_.options.notify;
  auto box = NotifyOutbox::Make(self_.incarnation, next_ring_key_.fetch_add(1), o.ring_bytes,
                                o.max_message_bytes, peer->notify_outcomes && peer->ring_ends);
  if (box) sender_->Keep(peer, std::move(box));
}

void Notifier::PeerUp(const std::shared_ptr<control::Session>& s, const std::shared_ptr<PeerState>& peer) {
  std::shared_ptr<NotifyOutbox> box = sender_->OutboxOf(peer.get());
  if (!box) return;
  uint64_t seq = 0;
  auto offer = [&](uint64_t n) { return box->Offer(n); };
  (void)s->SendNumbered(offer, &seq, [box, key = s->peer_key](Status answer) { box->Answered(answer, key); });
}

void Notifier::PeerGone(const PeerState& peer) { sender_->Close(&peer); }

void Notifier::SessionClosed(const std::shared_ptr<control::Session>& s) {
  inbox_->Retire(s);
  // The requests its peer had begun and not ended: the target hears of each (reserved: it fits).
  for (BegunRequests::Held& held : begun_->Take(s.get())) {
    begun_->Queue(FromPeer(*s, std::move(held.message), NotifyOutcome::kInitiatorLost), held.reserved);
  }
}

void Notifier::OnNotify(const std::shared_ptr<control::Session>& s, wire::Notify&& m) {
  const uint64_t seq = m.seq;
  Status queued = CheckMessage("a peer's notification", m.message);
  if (!queued.ok()) {
    // (A peer whose own limit is higher: logged at most once a second.)
    if (uint64_t more = 0; refusal_log_.Due(&more)) {
      XLOG(WARN) << "refused a notification from " << s->peer_key << ": " << queued.message()
                 << log::Limit::More(more);
    }
    return Answer(s, seq, queued);
  }
  Notification n = FromPeer(*s, std::move(m.message));
  Queue(s, seq, [&](const std::function<void()>& before_visible) {
    return queue_->Push(std::move(n), before_visible);
  });
}

bool Notifier::AskedForOutcomes(const std::shared_ptr<control::Session>& s) {
  if (self_.options.notify.outcomes) return true;
  XLOG(WARN) << "peer " << s->peer_key
             << " sent a request's begin or end this engine did not ask for; closing";
  s->Shutdown("protocol error: a request's begin or end without notify.outcomes");
  return false;
}

void Notifier::OnNotifyBegin(const std::shared_ptr<control::Session>& s, wire::NotifyBegin&& m) {
  if (!AskedForOutcomes(s)) return;
  Status begun = CheckMessage("a peer's notification", m.message);
  const auto hold = [&] {
    if (begun.ok()) {
      begun = begun_->Begin(s.get(), m.id, std::move(m.message));
    } else {
      begun_->Refuse(s.get(), m.id, begun);
    }
    return Status::Ok();
  };
  // (After what the peer's ring holds: requests begun there before this one are held first.)
  const Status ring = inbox_->QueueAfterRing(s, hold);
  if (!ring.ok()) {  // (its ring is inconsistent: held all the same, then reported as lost)
    (void)hold();
    return s->Shutdown(ring.message());
  }
  if (begun.ok()) return;
  // (Not answered: its end is, with kResourceExhausted. Logged at most once a second.)
  ++metrics_->events().notifies_refused;
  if (uint64_t more = 0; refusal_log_.Due(&more)) {
    XLOG(WARN) << "refused a notified request's beginning from " << s->peer_key << ": " << begun.message()
               << log::Limit::More(more);
  }
}

void Notifier::OnNotifyEnded(const std::shared_ptr<control::Session>& s, wire::NotifyEnded&& m) {
  if (!AskedForOutcomes(s)) return;
  // Queues its message with how it ended, or says why not (no beginning held for it).
  auto queue = [&](const std::function<void()>& before_visible) {
    BegunRequests::Held held;
    Status known = begun_->End(s.get(), m.begin, &held);
    if (known.ok())
      begun_->Queue(FromPeer(*s, std::move(held.message), m.outcome, std::move(m.landed)), held.reserved,
                    before_visible);
    return known;
  };
  bool taken = false;
  // (After what the peer's ring holds: the request may have begun there.)
  Queue(
      s, m.seq,
      [&](const std::function<void()>& before_visible) {
        taken = true;
        return queue(before_visible);
      },
      /*count_refusal=*/false);      // (its beginning's refusal was counted)
  if (!taken) (void)queue(nullptr);  // (its ring was inconsistent: the session closes)
}

void Notifier::Queue(const std::shared_ptr<control::Session>& s, uint64_t seq, const Push& push,
                     bool count_refusal) {
  // Queued after what the peer's ring holds (sent before it). The answer is queued before
  // the application can take the notification: a goodbye (or anything else) it sends after
  // taking it then leaves after the answer, never before. (It leaves once the control loop
  // has read what came with it: one write for a burst.)
  Status queued = inbox_->QueueAfterRing(s, [&] {
    return push([&] {
      ++metrics_->events().notifies_received;  // (counted before its sender hears of it)
      s->SendSoon(wire::NotifyAck{seq, StatusCode::kOk, ""});
    });
  });
  if (queued.ok()) return;
  if (queued.code() == StatusCode::kConnectionLost) return s->Shutdown(queued.message());
  if (!count_refusal) return s->SendSoon(wire::NotifyAck{seq, queued.code(), queued.message()});
  Answer(s, seq, queued);
}

void Notifier::Answer(const std::shared_ptr<control::Session>& s, uint64_t seq, const Status& refused) {
  ++metrics_->events().notifies_refused;
  s->SendSoon(wire::NotifyAck{seq, refused.code(), refused.message()});
}

void Notifier::OnAnswer(const std::shared_ptr<control::Session>& s, const wire::NotifyAck& m) {
  s->Acked(m.seq);
  Status queued;
  if (m.code != StatusCode::kOk) queued = {m.code, "peer " + s->peer_key + ": " + m.why};
  if (!s->Answer(m.seq, std::move(queued))) {
    XLOG(WARN) << "peer " << s->peer_key << " answered a notification never sent; closing";
    s->Shutdown("protocol error: unexpected notification answer");
  }
}

void Notifier::OnRingOffer(const std::shared_ptr<control::Session>& s, const wire::NotifyRingOffer& m) {
  const std::shared_ptr<PeerState> peer = SharedPeerOf(*s);
  const Status taken = inbox_->Accept(s, peer, peer->mapper.get(), m);
  if (!taken.ok()) {
    XLOG(INFO) << "peer " << s->peer_key << " offered a notification ring, not taken: " << taken.message();
  }
  s->SendSoon(wire::NotifyAck{m.seq, taken.code(), taken.message()});
}

Status Notifier::SendNotify(const std::string& remote, const std::string& message,
                            std::chrono::milliseconds timeout) {
  Status s = self_.CheckRunning("SendNotify");
  if (s.ok()) s = CheckMessage("SendNotify", message);
  Peer peer;
  if (s.ok()) s = peers_.Find(remote, &peer);
  if (s.ok() && !peer.state->alive.load()) {
    s = {StatusCode::kConnectionLost, "peer '" + remote + "' is gone"};
  }
  if (!s.ok()) {
    XLOG(WARN) << "SendNotify to '" << remote << "' refused: " << s.ToString();
    return s;
  }
  auto answer = std::make_shared<std::promise<Status>>();
  std::future<Status> queued = answer->get_future();
  sender_->Send(peer, message, [answer, metrics = metrics_](Status st) {
    metrics->events().Sent(st);
    answer->set_value(std::move(st));
  });
  if (queued.wait_until(DeadlineAfter(timeout)) != std::future_status::ready) {
    return {StatusCode::kTimeout, "SendNotify: '" + remote +
                                      "' did not confirm the notification "
                                      "in time (it may still be queued there)"};
  }
  return queued.get();
}

Status Notifier::GetNotifies(std::vector<Notification>* out) {
  if (!queue_) return {StatusCode::kInvalidArgument, "GetNotifies: engine is not initialized"};
  if (out == nullptr) return {StatusCode::kInvalidArgument, "GetNotifies: null output"};
  TakeAll(out);
  return Status::Ok();
}

Status Notifier::WaitNotifies(std::vector<Notification>* out, std::chrono::milliseconds timeout) {
  if (!queue_) return {StatusCode::kInvalidArgument, "WaitNotifies: engine is not initialized"};
  if (out == nullptr) return {StatusCode::kInvalidArgument, "WaitNotifies: null output"};
  const auto until = DeadlineAfter(timeout);
  // Asleep on the queue's word (bumped by every push, and when a ring comes or goes) and on
  // the rings' doorbells.
  std::vector<futex::Watch> watches;
  NotifyInbox::Marks marks;
  bool took = false;
  for (;;) {
    watches.clear();
    watches.push_back({queue_->changes(), queue_->BeginWait(), false});
    inbox_->BeginWait(&watches, &marks);
    took = TakeAll(out);
    const bool over = took || queue_->closed() || LocalEngine::Clock::now() >= until;
    if (!over) futex::WaitAny(watches, until);
    inbox_->EndWait(&marks);
    queue_->EndWait();
    if (over) break;
  }
  if (took) return Status::Ok();
  if (!self_.running.load()) {
    return {StatusCode::kCanceled, "WaitNotifies: the engine was finalized (nothing is queued)"};
  }
  return {StatusCode::kTimeout, "WaitNotifies: no notification within the timeout"};
}

void Notifier::AddGauges(MetricsSnapshot* out) const {
  uint64_t queued = 0, queued_bytes = 0, in_rings = 0, in_rings_bytes = 0;
  queue_->Queued(&queued, &queued_bytes);
  inbox_->Pending(&in_rings, &in_rings_bytes);
  queued += in_rings;
  queued_bytes += in_rings_bytes;
  AddValue(out, "xfer_notifications_queued", MetricType::kGauge,
           "Notifications received and not yet taken (GetNotifies), rings included.",
           static_cast<double>(queued));
  AddValue(out, "xfer_notifications_queued_bytes", MetricType::kGauge, "The queued notifications' bytes.",
           static_cast<double>(queued_bytes));
}

}  // namespace xfer
