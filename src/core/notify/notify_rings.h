// Notifications between engines on one host through shared memory (NotifyRing), with no round
// trip: each engine makes one ring per same-host peer, in a memfd segment of its own, and
// offers it over the control session (wire::NotifyRingOffer); the peer maps it and answers.
// From then on a notification to that peer is queued at the peer once it is in the ring. When
// the ring is full, it goes over the session instead (and waits for the answer), and the
// peer's queue bounds it as any other.
//
// A ring whose target asked for outcomes (and whose two engines carry them in rings:
// wire::kFeatureRingEnds) is typed (ring_record.h): besides notifications, it carries a
// notified request's beginning, written as the request starts (no wake-up: it is no
// notification), and its end, written as a notification is. A request begun in the ring ends
// there too, unless its end does not fit (or waits behind the session, below): then it goes
// over the session as wire::NotifyEnded, and the target reads the ring before it. One begun
// over the session (the ring closed, not open yet, or full) ends over the session. What the
// target read of a ring is its peer's once the session ends: requests begun and not ended are
// queued as lost (BegunRequests).
//
// Order, per sender and target:
// - the sender writes into the ring only while no notification it sent over the session
//   awaits its answer (those were queued at the target first);
// - the target, given a notification over the session, first moves what that sender's ring
//   holds into its queue (those were written first);
// - the target's readers take the queue, then the rings, under one lock with the above.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "control/wire.h"
#include "core/notify/begun_requests.h"
#include "core/notify/notify_queue.h"
#include "core/notify/notify_ring.h"
#include "core/notify/ring_record.h"
#include "util/futex.h"
#include "util/log.h"
#include "util/shared_memory.h"
#include "xfer/status.h"
#include "xfer/types.h"

namespace xfer {

struct PeerState;
namespace control {
class Session;
}

// The memfd name of an engine's ring number `key` (the peer checks the descriptor it takes).
std::string NotifyRingName(uint64_t incarnation, uint64_t key);

// The sender's side for one peer: its ring, and whether notifications may go into it.
class NotifyOutbox {
 public:
  // A ring for one peer (ring_bytes rounded up to a power of two that holds two messages of
  // max_message bytes), typed (ring_record.h) or not; null, with a log line, when this host
  // cannot make one.
  static std::shared_ptr<NotifyOutbox> Make(uint64_t incarnation, uint64_t key, uint64_t ring_bytes,
                                            uint32_t max_message, bool typed);
  bool typed() const { return typed_; }

  // The offer to send the peer (before any Write).
  wire::NotifyRingOffer Offer(uint64_t seq) const;
  // The peer's answer to the offer: ok opens the ring.
  void Answered(const Status& answer, const std::string& peer);

  // Puts a record (a message; in a typed ring, a kNotify or kEnded record) into the ring when
  // it is open, has room, and no notification sent over the session waits for its answer:
  // true, with the outcome in *result (ok: queued at the peer; kConnectionLost: the peer left
  // the ring inconsistent). False: send it over the session, and call SessionAnswered once it
  // is answered.
  // A null record is one the ring cannot carry: false (send it over the session) unless the
  // session ended.
  bool TryWrite(const std::string* record, Status* result);
  // A typed ring's kBegin record, written when the ring is open and has room (whatever waits
  // over the session: a beginning is not queued) and wakes no reader: whether it was.
  bool TryBegin(const std::string& record);
  void SessionAnswered();
  // The session with the peer ended: every later TryWrite answers kConnectionLost.
  void Close();
  // The peer left the ring inconsistent (TryWrite answered kConnectionLost for it).
  bool Inconsistent();

 private:
  NotifyOutbox() = default;
  std::mutex mu_;
  std::unique_ptr<shared_memory::Segment> segment_;
  NotifyRing ring_;  // mu_ (the writer's side)
  uint64_t key_ = 0, bytes_ = 0;
  uint32_t max_message_ = 0;
  bool typed_ = false;
  bool open_ = false;        // mu_: the peer took the ring
  bool closed_ = false;      // mu_: the session ended
  uint64_t on_session_ = 0;  // mu_: sent over the session, not answered yet
};

// The target's side: every ring same-host peers offered, read by GetNotifies and WaitNotifies.
class NotifyInbox {
  struct Inbound;

 public:
  // queue: the engine's; received, refused: the counts of notifications received (which
  // messages taken from the rings join) and refused (which refused beginnings join); begun: the requests
  // peers began toward this engine, when it asked for outcomes (peers whose builds can then send it typed
  // rings), else null (all outlive this); max_message, max_ring_bytes: the largest notification and ring this
  // engine takes.
  NotifyInbox(NotifyQueue* queue, std::atomic<uint64_t>* received, std::atomic<uint64_t>* refused,
              BegunRequests* begun, uint32_t max_message, uint64_t max_ring_bytes)
      : queue_(queue),
        received_(received),
        refused_(refused),
        begun_(begun),
        max_message_(max_message),
        max_ring_bytes_(max_ring_bytes) {}

  // A peer's offer (control thread): maps its ring through the peer's mapper, or says why not
  // (kResourceExhausted while the queue, or that peer's part of it, is full).
  Status Accept(const std::shared_ptr<control::Session>& session, const std::shared_ptr<PeerState>& peer,
                const shared_memory::PeerMapper* mapper, const wire::NotifyRingOffer& offer);
  // Moves everything in the queue, then every message in the rings, onto *out (false:
  // nothing). A ring found inconsistent is dropped and its peer's session closed.
  bool TakeAll(std::vector<Notification>* out);
  // A notification that came over `session` (control thread): first what that peer's ring
  // holds moves into the queue (sent before it, and queued already: past the bounds; while
  // the queue, or that peer's part of it, is full, their space in the ring is freed only once the application
  // takes notifications, so that the peer cannot pass the bounds by a ring again and again), then `queue`
  // queues it (NotifyQueue::Push or PushReserved), whose status this returns. kConnectionLost when the peer's
  // ring is inconsistent (it is dropped; the caller closes the session).
  Status QueueAfterRing(const std::shared_ptr<control::Session>& session,
                        const std::function<Status()>& queue);
  // The session ended (control thread): its ring is closed, what it holds moves into the
  // queue (readable as the queue's, and ahead of anything from the peer's next session), and
  // it is unmapped.
  void Retire(const std::shared_ptr<control::Session>& session);
  // The messages waiting in the rings and their bytes (for the metrics).
  void Pending(uint64_t* messages, uint64_t* bytes);

  // Waiting for messages: BeginWait marks each ring's reader asleep (one count per waiter) and
  // adds a watch on its doorbell to *watches; EndWait takes those marks back. The rings stay
  // mapped while marked.
  using Marks = std::vector<std::shared_ptr<Inbound>>;
  void BeginWait(std::vector<futex::Watch>* watches, Marks* marks);
  void EndWait(Marks* marks);

 private:
  struct Inbound {
    std::string sender;
    uint64_t incarnation = 0;
    std::weak_ptr<control::Session> session;
    BegunRequests::Key key = nullptr;  // the session's
    bool typed = false;                // its records: ring_record.h
    std::shared_ptr<shared_memory::Mapping> mapping;
    NotifyRing ring;
    uint32_t waiters = 0;  // mu_: WaitNotifies calls asleep on it
  };
  // Reads one ring onto *out (mu_ held): its notifications, and of a typed ring the ends of
  // requests it began (those whose beginnings came over the session go into the queue);
  // false when it is inconsistent. free: as NotifyRing::ReadAll's.
  bool Read(Inbound& in, std::vector<Notification>* out, bool free = true);
  // The longest record ring `in` may carry: a message, or in a typed ring a message and what
  // the record adds to it (its message checked by DecodeRingRecord).
  uint64_t RecordLimit(const Inbound& in) const {
    return in.typed ? NotifyRing::MaxMessage(in.ring.capacity()) : max_message_;
  }
  // A typed ring's record (mu_ held): onto *out, or held, or into the queue.
  void Take(Inbound& in, RingRecord&& r, std::vector<Notification>* out);
  // Drops rings_[i] (mu_ held); a waiter asleep on it is woken to look again.
  void Drop(size_t i);
  NotifyQueue* const queue_;
  std::atomic<uint64_t>* const received_;
  std::atomic<uint64_t>* const refused_;
  BegunRequests* const begun_;
  const uint32_t max_message_;
  const uint64_t max_ring_bytes_;
  std::mutex mu_;
  std::vector<std::shared_ptr<Inbound>> rings_;  // mu_
  log::Limit refusal_log_;                       // mu_: beginnings refused
};

}  // namespace xfer
