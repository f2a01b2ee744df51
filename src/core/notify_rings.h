// Notifications between engines on one host through shared memory (NotifyRing), with no round
// trip: each engine makes one ring per same-host peer, in a memfd segment of its own, and
// offers it over the control session (wire::NotifyRingOffer); the peer maps it and answers.
// From then on a notification to that peer is queued at the peer once it is in the ring.
//
// Order: a sender moves a peer's notifications to the ring only while none it sent over the
// session awaits its answer, so those were queued first; then all go through the ring.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "control/wire.h"
#include "core/notify_ring.h"
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
  // max_message bytes); null, with a log line, when this host cannot make one.
  static std::shared_ptr<NotifyOutbox> Make(uint64_t incarnation, uint64_t key, uint64_t ring_bytes,
                                            uint32_t max_message);

  // The offer to send the peer (before any Write).
  wire::NotifyRingOffer Offer(uint64_t seq) const;
  // The peer's answer to the offer: ok opens the ring.
  void Answered(const Status& answer, const std::string& peer);

  // Puts message into the ring when it is open and no notification sent over the session
  // waits for its answer: true, with the outcome in *result (ok: queued at the peer). False:
  // send it over the session, and call SessionAnswered once it is answered.
  bool TryWrite(const std::string& message, Status* result);
  void SessionAnswered();

 private:
  NotifyOutbox() = default;
  std::mutex mu_;
  std::unique_ptr<shared_memory::Segment> segment_;
  NotifyRing ring_;             // mu_ (the writer's side)
  uint64_t key_ = 0, bytes_ = 0;
  uint32_t max_message_ = 0;
  bool open_ = false;           // mu_: the peer took the ring
  uint64_t on_session_ = 0;     // mu_: sent over the session, not answered yet
  log::Limit full_log_;         // mu_
};

// The target's side: every ring same-host peers offered, read by GetNotifies and WaitNotifies.
class NotifyInbox {
 public:
  explicit NotifyInbox(uint32_t max_message) : max_message_(max_message) {}

  // A peer's offer (control thread): maps its ring through the peer's mapper, or says why not.
  Status Accept(const std::shared_ptr<control::Session>& session, const std::shared_ptr<PeerState>& peer,
                const shared_memory::PeerMapper* mapper, const wire::NotifyRingOffer& offer);
  // Moves every message in the rings onto *out. A ring found inconsistent is dropped and its
  // peer's session closed; a ring whose peer is gone is dropped once empty.
  void TakeAll(std::vector<Notification>* out);
  // The messages waiting in the rings and their bytes (for the metrics).
  void Pending(uint64_t* messages, uint64_t* bytes);

  // Waiting for messages: BeginWait marks every ring's reader asleep and adds a watch on its
  // doorbell to *watches, and the ring's memory to *hold (kept mapped while watched); EndWait
  // clears the marks.
  void BeginWait(std::vector<futex::Watch>* watches, std::vector<std::shared_ptr<shared_memory::Mapping>>* hold);
  void EndWait();
  // A word bumped when a ring is added or dropped (a waiter then looks again).
  std::atomic<uint32_t>* changes() { return &changes_; }

 private:
  struct Inbound {
    std::string sender;
    uint64_t incarnation = 0;
    std::weak_ptr<PeerState> peer;
    std::weak_ptr<control::Session> session;
    std::shared_ptr<shared_memory::Mapping> mapping;
    NotifyRing ring;
  };
  void Changed();
  const uint32_t max_message_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Inbound>> rings_;  // mu_
  std::atomic<uint32_t> changes_{0};
};

}  // namespace xfer
