// Notifications: a message to a peer's queue, alone (SendNotify) or after a request's data
// (TransferOptions::notify, delivered by Request::Finish through Notify). Each goes over the
// peer's control session, whose frames the peer reads in order on one thread, or, to a peer on
// this host that took this engine's ring, into that ring (core/notify_rings.h): notifications
// from one engine to another are queued in the order they were sent.
#include <future>

#include "core/engine_impl.h"
#include "util/log.h"

namespace xfer {

Status EngineImpl::CheckNotifyMessage(const char* what, const std::string& message) const {
  if (message.size() <= opts_.notify.max_message_bytes) return Status::Ok();
  return {StatusCode::kInvalidArgument,
          std::string(what) + ": a notification of " + std::to_string(message.size()) +
              " bytes exceeds EngineOptions::notify.max_message_bytes (" +
              std::to_string(opts_.notify.max_message_bytes) + ")"};
}

void NotifySender::Send(const PeerTable::Peer& peer, std::string message, Request::Done done) const {
  if (!peer.session) return done(own->Push({name, incarnation, std::move(message)}));
  if (const std::shared_ptr<NotifyOutbox>& box = peer.state->outbox) {
    Status written;
    if (box->TryWrite(message, &written)) {
      if (written.code() == StatusCode::kConnectionLost && box->Inconsistent()) {
        XLOG(WARN) << "peer " << peer.session->peer_key << ": " << written.message() << "; closing its session";
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
  auto frame = [&](uint64_t n) { return wire::Notify{n, std::move(message)}; };
  (void)peer.session->SendNumbered(frame, &seq, std::move(done));  // done: the answer, or the loss
}

void EngineImpl::OnNotify(const std::shared_ptr<control::Session>& s, wire::Notify&& m) {
  const PeerState& peer = *s->peer;
  Status queued = CheckNotifyMessage("a peer's notification", m.message);
  if (!queued.ok()) {
    // (A peer whose own limit is higher: logged at most once a second.)
    if (uint64_t more = 0; notify_refusal_log_.Due(&more)) {
      XLOG(WARN) << "refused a notification from " << s->peer_key << ": " << queued.message()
                 << log::Limit::More(more);
    }
  } else {
    // Queued after what the peer's ring holds (sent before it). The answer is queued before
    // the application can take the notification: a goodbye (or anything else) it sends after
    // taking it then leaves after the answer, never before. (It leaves once the control loop
    // has read what came with it: one write for a burst.)
    Notification n{peer.info.name, peer.info.incarnation, std::move(m.message)};
    queued = inbox_->QueueAfterRing(s, std::move(n), [&] {
      ++metrics_->events().notifies_received;  // (counted before its sender hears of it)
      s->SendSoon(wire::NotifyAck{m.seq, StatusCode::kOk, ""});
    });
    if (queued.ok()) return;
    if (queued.code() == StatusCode::kConnectionLost) return s->Shutdown(queued.message());
  }
  ++metrics_->events().notifies_refused;
  s->SendSoon(wire::NotifyAck{m.seq, queued.code(), queued.message()});
}

void EngineImpl::OfferNotifyRing(const std::shared_ptr<control::Session>& s, const std::shared_ptr<PeerState>& peer) {
  if (!peer->outbox) return;
  uint64_t seq = 0;
  auto offer = [&](uint64_t n) { return peer->outbox->Offer(n); };
  (void)s->SendNumbered(offer, &seq, [box = peer->outbox, key = s->peer_key](Status answer) {
    box->Answered(answer, key);
  });
}

void EngineImpl::OnNotifyRingOffer(const std::shared_ptr<control::Session>& s, const wire::NotifyRingOffer& m) {
  const Status taken = inbox_->Accept(s, s->peer, s->peer->mapper.get(), m);
  if (!taken.ok()) {
    XLOG(INFO) << "peer " << s->peer_key << " offered a notification ring, not taken: " << taken.message();
  }
  s->SendSoon(wire::NotifyAck{m.seq, taken.code(), taken.message()});
}

Status EngineImpl::SendNotify(const std::string& remote, const std::string& message,
                              std::chrono::milliseconds timeout) {
  Status s = CheckRunning("SendNotify");
  if (s.ok()) s = CheckNotifyMessage("SendNotify", message);
  Peer peer;
  if (s.ok()) s = FindPeer(remote, &peer);
  if (s.ok() && !peer.state->alive.load()) {
    s = {StatusCode::kConnectionLost, "peer '" + remote + "' is gone"};
  }
  if (!s.ok()) {
    XLOG(WARN) << "SendNotify to '" << remote << "' refused: " << s.ToString();
    return s;
  }
  auto answer = std::make_shared<std::promise<Status>>();
  std::future<Status> queued = answer->get_future();
  notifier_->Send(peer, message, [answer, metrics = metrics_](Status st) {
    ++(st.ok() ? metrics->events().notifies_sent : metrics->events().notifies_unsent);
    answer->set_value(std::move(st));
  });
  if (queued.wait_until(DeadlineAfter(timeout)) != std::future_status::ready) {
    return {StatusCode::kTimeout, "SendNotify: '" + remote + "' did not confirm the notification "
                                  "in time (it may still be queued there)"};
  }
  return queued.get();
}

Status EngineImpl::GetNotifies(std::vector<Notification>* out) {
  if (!notifies_) return {StatusCode::kInvalidArgument, "GetNotifies: engine is not initialized"};
  if (out == nullptr) return {StatusCode::kInvalidArgument, "GetNotifies: null output"};
  TakeNotifies(out);
  return Status::Ok();
}

bool EngineImpl::TakeNotifies(std::vector<Notification>* out) { return inbox_->TakeAll(out); }

Status EngineImpl::WaitNotifies(std::vector<Notification>* out, std::chrono::milliseconds timeout) {
  if (!notifies_) return {StatusCode::kInvalidArgument, "WaitNotifies: engine is not initialized"};
  if (out == nullptr) return {StatusCode::kInvalidArgument, "WaitNotifies: null output"};
  const auto until = DeadlineAfter(timeout);
  // Asleep on the queue's word (bumped by every push, and when a ring comes or goes) and on
  // the rings' doorbells.
  std::vector<futex::Watch> watches;
  NotifyInbox::Marks marks;
  bool took = false;
  for (;;) {
    watches.clear();
    watches.push_back({notifies_->changes(), notifies_->BeginWait(), false});
    inbox_->BeginWait(&watches, &marks);
    took = TakeNotifies(out);
    const bool over = took || notifies_->closed() || Clock::now() >= until;
    if (!over) futex::WaitAny(watches, until);
    inbox_->EndWait(&marks);
    notifies_->EndWait();
    if (over) break;
  }
  if (took) return Status::Ok();
  if (!running_.load()) {
    return {StatusCode::kCanceled, "WaitNotifies: the engine was finalized (nothing is queued)"};
  }
  return {StatusCode::kTimeout, "WaitNotifies: no notification within the timeout"};
}

}  // namespace xfer
