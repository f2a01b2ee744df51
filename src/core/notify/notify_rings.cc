#include "core/notify/notify_rings.h"

#include <bit>
#include <cstdio>

#include "control/session.h"
#include "core/peers/peer_state.h"
#include "util/log.h"

namespace xfer {

std::string NotifyRingName(uint64_t incarnation, uint64_t key) {
  char b[64];
  std::snprintf(b, sizeof b, "xfer-notify.%016llx.%llu", static_cast<unsigned long long>(incarnation),
                static_cast<unsigned long long>(key));
  return b;
}

std::shared_ptr<NotifyOutbox> NotifyOutbox::Make(uint64_t incarnation, uint64_t key, uint64_t ring_bytes,
                                                 uint32_t max_message, bool typed) {
  // (A typed record of the largest message is a few bytes longer than the ring may carry: it
  // goes over the session, as any record that does not fit.)
  uint64_t capacity = std::bit_ceil(std::max<uint64_t>(ring_bytes, 2 * (uint64_t{max_message} + 8)));
  capacity = std::clamp(capacity, NotifyRing::kMinCapacity, NotifyRing::kMaxCapacity);
  std::shared_ptr<NotifyOutbox> box(new NotifyOutbox());
  box->key_ = key;
  box->bytes_ = NotifyRing::BytesFor(capacity);
  box->max_message_ = max_message;
  box->typed_ = typed;
  // Writable by the peer: it publishes its read index in the ring.
  Status s = shared_memory::Segment::Create(box->bytes_, false, true, NotifyRingName(incarnation, key),
                                            &box->segment_);
  if (s.ok()) s = NotifyRing::Format(box->segment_->data(), box->bytes_);
  if (s.ok()) s = NotifyRing::Attach(box->segment_->data(), box->bytes_, &box->ring_);
  if (!s.ok()) {
    XLOG(WARN) << "no notification ring for a peer on this host (" << s.message()
               << "): its notifications go over the control session";
    return nullptr;
  }
  return box;
}

wire::NotifyRingOffer NotifyOutbox::Offer(uint64_t seq) const {
  return {seq, segment_->fd(), key_, bytes_, max_message_};
}

void NotifyOutbox::Answered(const Status& answer, const std::string& peer) {
  if (!answer.ok()) {
    XLOG(INFO) << "notifications to " << peer
               << " go over the control session, not a ring: " << answer.message();
    return;
  }
  std::lock_guard lock(mu_);
  open_ = true;
}

bool NotifyOutbox::TryWrite(const std::string* record, Status* result) {
  bool wake = false;
  {
    std::lock_guard lock(mu_);
    if (closed_) {
      *result = {StatusCode::kConnectionLost, "the session with the peer has ended"};
      return true;
    }
    const bool ring = record != nullptr && open_ && on_session_ == 0 &&
                      record->size() <= NotifyRing::MaxMessage(ring_.capacity());
    if (ring) *result = ring_.Write(*record, &wake);
    if (!ring || result->code() == StatusCode::kResourceExhausted) {
      // (Not for the ring, too large for it, not open yet, waiting for the session, or full.)
      ++on_session_;
      return false;
    }
  }
  if (wake) ring_.WakeReader();  // (a system call: not under the lock)
  return true;
}

bool NotifyOutbox::TryBegin(const std::string& record) {
  std::lock_guard lock(mu_);
  if (!typed_ || !open_ || closed_) return false;
  bool wake = false;  // (left unused: a reader waits for notifications, and this is none)
  return ring_.Write(record, &wake).ok();  // (not ok: full, too large, or the ring ended)
}

void NotifyOutbox::SessionAnswered() {
  std::lock_guard lock(mu_);
  if (on_session_ > 0) --on_session_;
}

bool NotifyOutbox::Inconsistent() {
  std::lock_guard lock(mu_);
  return ring_.broken();
}

void NotifyOutbox::Close() {
  std::lock_guard lock(mu_);
  closed_ = true;
}

Status NotifyInbox::Accept(const std::shared_ptr<control::Session>& session,
                           const std::shared_ptr<PeerState>& peer, const shared_memory::PeerMapper* mapper,
                           const wire::NotifyRingOffer& offer) {
  if (mapper == nullptr) {
    return {StatusCode::kUnsupported,
            "a notification ring is for a peer on this host, whose process this engine "
            "can take descriptors from"};
  }
  if (offer.max_message > max_message_) {
    return {StatusCode::kUnsupported, "notifications of up to " + std::to_string(offer.max_message) +
                                          " bytes; this engine takes up to " + std::to_string(max_message_) +
                                          " (EngineOptions::notify.max_message_bytes)"};
  }
  if (offer.bytes > max_ring_bytes_) {
    return {StatusCode::kUnsupported,
            "a notification ring of " + std::to_string(offer.bytes) + " bytes; this engine takes up to " +
                std::to_string(max_ring_bytes_) + " (EngineOptions::notify.queue_bytes)"};
  }
  {
    std::lock_guard lock(mu_);
    for (const auto& r : rings_) {
      if (r->session.lock() == session) {
        return {StatusCode::kInvalidArgument, "a second notification ring on one session"};
      }
    }
  }
  // (What a ring holds is queued past the bounds, once a ring at a time: a peer that filled one
  // and came back with a new session finds none while the queue is full.)
  if (queue_->Full(peer->info.incarnation)) {
    return {StatusCode::kResourceExhausted,
            "this engine's notification queue is full (the application is not taking them)"};
  }
  auto in = std::make_shared<Inbound>();
  in->sender = peer->info.name;
  in->incarnation = peer->info.incarnation;
  in->session = session;
  in->key = session.get();
  in->typed = begun_ != nullptr && peer->ring_ends;
  const std::string name = NotifyRingName(peer->info.incarnation, offer.key);
  if (Status s = mapper->MapExactly(offer.fd, name, offer.bytes, &in->mapping); !s.ok()) return s;
  if (Status s = NotifyRing::Attach(in->mapping->base(), offer.bytes, &in->ring); !s.ok()) return s;
  {
    std::lock_guard lock(mu_);  // (offers come on the session's control thread: one at a time)
    rings_.push_back(std::move(in));
  }
  queue_->Nudge();  // (a waiter looks again, and watches this ring too)
  return Status::Ok();
}

bool NotifyInbox::Read(Inbound& in, std::vector<Notification>* out, bool free) {
  std::vector<std::string> records;
  Status s = in.ring.ReadAll(RecordLimit(in), &records, free);
  const size_t before = out->size();
  for (std::string& record : records) {
    if (!in.typed) {
      out->push_back(
          Notification{in.sender, in.incarnation, std::move(record), NotifyOutcome::kCompleted, {}});
      continue;
    }
    RingRecord r;
    if (Status bad = DecodeRingRecord(std::move(record), max_message_, &r); !bad.ok()) {
      if (s.ok()) s = {StatusCode::kConnectionLost, bad.message()};  // (the others are taken)
      continue;
    }
    Take(in, std::move(r), out);
  }
  received_->fetch_add(out->size() - before, std::memory_order_relaxed);
  if (!s.ok()) XLOG(WARN) << "peer " << in.sender << ": " << s.message() << "; closing its session";
  return s.ok();
}

void NotifyInbox::Take(Inbound& in, RingRecord&& r, std::vector<Notification>* out) {
  using Kind = RingRecord::Kind;
  if (r.kind == Kind::kBegin) {
    // (Refused past the peer's share, or twice: its end still queues whole; only its loss
    // would go unreported.)
    if (Status begun = begun_->Begin(in.key, r.id, std::move(r.message), false); !begun.ok()) {
      refused_->fetch_add(1, std::memory_order_relaxed);
      if (uint64_t more = 0; refusal_log_.Due(&more)) {
        XLOG(WARN) << "peer " << in.sender << ": a notified request's beginning in its ring refused ("
                   << begun.message() << "): if the peer is lost, that request goes unreported"
                   << log::Limit::More(more);
      }
    }
    return;
  }
  Notification n{in.sender, in.incarnation, std::move(r.message), r.outcome, std::move(r.landed)};
  BegunRequests::Held held;
  if (r.kind == Kind::kEnded && begun_->End(in.key, r.id, &held).ok() && held.reserved) {
    // (Begun over the session, ended here: only a peer that breaks the rule does this.)
    received_->fetch_add(1, std::memory_order_relaxed);
    n.message = std::move(held.message);  // (the one its reservation counted)
    return begun_->Queue(std::move(n), true);
  }
  out->push_back(std::move(n));
}

void NotifyInbox::Drop(size_t i) {
  rings_[i]->ring.Close();
  rings_.erase(rings_.begin() + static_cast<std::ptrdiff_t>(i));
  queue_->Nudge();
}

bool NotifyInbox::TakeAll(std::vector<Notification>* out) {
  const size_t before = out->size();
  std::vector<std::shared_ptr<control::Session>> to_close;
  {
    std::lock_guard lock(mu_);
    queue_->TakeAll(out);
    for (size_t i = 0; i < rings_.size();) {
      if (Read(*rings_[i], out)) {
        ++i;
        continue;
      }
      if (auto session = rings_[i]->session.lock()) to_close.push_back(std::move(session));
      Drop(i);
    }
  }
  for (const auto& session : to_close) session->Shutdown("its notification ring is inconsistent");
  return out->size() > before;
}

Status NotifyInbox::QueueAfterRing(const std::shared_ptr<control::Session>& session,
                                   const std::function<Status()>& queue) {
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < rings_.size(); ++i) {
    if (rings_[i]->session.lock() != session) continue;
    std::vector<Notification> earlier;
    const bool consistent = Read(*rings_[i], &earlier, false);
    for (Notification& e : earlier) queue_->PushAccepted(std::move(e));
    if (!queue_->Full(rings_[i]->incarnation)) rings_[i]->ring.Free();  // (else TakeAll frees it)
    if (!consistent) {
      Drop(i);
      return {StatusCode::kConnectionLost, "its notification ring is inconsistent"};
    }
    break;
  }
  return queue();
}

void NotifyInbox::Retire(const std::shared_ptr<control::Session>& session) {
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < rings_.size(); ++i) {
    if (rings_[i]->session.lock() != session) continue;
    rings_[i]->ring.Close();  // (first: a write after the reading below reports itself lost)
    std::vector<Notification> last;
    (void)Read(*rings_[i], &last);
    for (Notification& n : last) queue_->PushAccepted(std::move(n));
    Drop(i);
    return;
  }
}

void NotifyInbox::Pending(uint64_t* messages, uint64_t* bytes) {
  *messages = *bytes = 0;
  std::lock_guard lock(mu_);
  for (const auto& in : rings_) {
    uint64_t m = 0, b = 0;
    in->ring.Count(RecordLimit(*in), &m, &b, in->typed ? QueuesANotification : nullptr);
    *messages += m;
    *bytes += b;
  }
}

void NotifyInbox::BeginWait(std::vector<futex::Watch>* watches, Marks* marks) {
  std::lock_guard lock(mu_);
  for (const auto& in : rings_) {
    const uint32_t seen = in->ring.BeginWait();  // (marks it; harmless when already marked)
    ++in->waiters;
    watches->push_back({in->ring.doorbell(), seen, true});
    marks->push_back(in);
  }
}

void NotifyInbox::EndWait(Marks* marks) {
  std::lock_guard lock(mu_);
  for (const auto& in : *marks) {
    if (--in->waiters == 0) in->ring.EndWait();
  }
  marks->clear();
}

}  // namespace xfer
