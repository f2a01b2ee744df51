// Notifier: notifications (docs/notifications.md). A message to a peer's queue, alone
// (Engine::SendNotify) or after a request's data (TransferOptions::notify: the data path asks
// for a Delivery). Each goes over the peer's control session, whose frames the peer reads in
// order on one thread, or, to a peer on this host that took this engine's ring, into that ring
// (notify_rings.h): notifications from one engine to another are queued in the order they were
// sent. And the receiving side: this engine's queue, the rings its peers offered, and the
// application's GetNotifies and WaitNotifies.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "control/session.h"
#include "core/local_engine.h"
#include "core/metrics/metrics.h"
#include "core/notify/begun_requests.h"
#include "core/notify/notify_queue.h"
#include "core/notify/notify_rings.h"
#include "core/peers/peer_service.h"
#include "util/log.h"

namespace xfer {

class Notifier {
 public:
  using Peer = PeerTable::Peer;
  // Called once with how a notification went: ok once the target queued it.
  using Done = std::function<void(Status)>;
  // A request's notification, sent when the request ended: how it ended and, other than
  // kCompleted, the descriptors that landed (Request::Deliver).
  using Deliver = std::function<void(NotifyOutcome outcome, std::vector<uint64_t> landed, Done done)>;

  Notifier(const LocalEngine& self, PeerService& peers) : self_(self), peers_(peers) {}

  // Initialize: the queue, the inbox of the rings same-host peers offer, the sender.
  void Start(std::shared_ptr<EngineMetrics> metrics);
  // Finalize: waiters wake for good; what is queued stays readable.
  void Close();

  // Engine API.
  Status SendNotify(const std::string& remote, const std::string& message, std::chrono::milliseconds timeout);
  Status GetNotifies(std::vector<Notification>* out);
  Status WaitNotifies(std::vector<Notification>* out, std::chrono::milliseconds timeout);

  // kInvalidArgument when message is longer than the options allow.
  Status CheckMessage(const char* what, const std::string& message) const;
  // Sends message to peer when called (over its ring or session, or into this engine's queue
  // for itself), then calls done with how that went. It holds what it needs, so it may run
  // after the engine is gone (a request ending late).
  Deliver Delivery(const Peer& peer, std::string message) const;

  // The peers' events: a peer's state made (a peer on this host gets a ring of this engine's),
  // its session up (the ring is offered), the peer gone (the ring closes: every later
  // notification to that state fails), a session ended (the ring its peer offered us goes).
  void PeerMade(const std::shared_ptr<PeerState>& peer);
  void PeerUp(const std::shared_ptr<control::Session>& s, const std::shared_ptr<PeerState>& peer);
  void PeerGone(const PeerState& peer);
  void SessionClosed(const std::shared_ptr<control::Session>& s);

  // Control thread: a peer's notification (queued, answered); a request it began toward us
  // (notify.outcomes: its message held, answered) and its end (queued, answered); the answer
  // to one of ours; a peer's ring offer (mapped, answered).
  void OnNotify(const std::shared_ptr<control::Session>& s, wire::Notify&& m);
  void OnNotifyBegin(const std::shared_ptr<control::Session>& s, wire::NotifyBegin&& m);
  void OnNotifyEnded(const std::shared_ptr<control::Session>& s, wire::NotifyEnded&& m);
  void OnAnswer(const std::shared_ptr<control::Session>& s, const wire::NotifyAck& m);
  void OnRingOffer(const std::shared_ptr<control::Session>& s, const wire::NotifyRingOffer& m);

  void AddGauges(MetricsSnapshot* out) const;

 private:
  class Sender;  // shared with the deliveries
  // Queues a notification that came as frame seq through push (NotifyQueue::Push, PushReserved
  // or PushAccepted, given what runs before it is visible), after what the peer's ring holds,
  // and answers the frame: ok, or push's refusal (counted as one when count_refusal).
  using Push = std::function<Status(const std::function<void()>& before_visible)>;
  void Queue(const std::shared_ptr<control::Session>& s, uint64_t seq, const Push& push,
             bool count_refusal = true);
  // Answers frame seq with a refusal.
  void Answer(const std::shared_ptr<control::Session>& s, uint64_t seq, const Status& refused);
  // Whether this engine asked for outcomes; a peer that sends a request's begin or end
  // otherwise breaks the protocol, and its session is closed.
  bool AskedForOutcomes(const std::shared_ptr<control::Session>& s);
  // Moves what the queue and the rings hold onto *out; false when there was nothing.
  bool TakeAll(std::vector<Notification>* out) { return inbox_->TakeAll(out); }

  const LocalEngine& self_;
  PeerService& peers_;
  std::shared_ptr<EngineMetrics> metrics_;
  std::shared_ptr<NotifyQueue> queue_;    // received, not yet taken; from Start on
  std::unique_ptr<NotifyInbox> inbox_;    // same-host peers' rings; from Start on
  std::unique_ptr<BegunRequests> begun_;  // requests peers began toward us; from Start on
  std::shared_ptr<Sender> sender_;
  bool rings_possible_ = false;  // this host lets us share notification rings
  std::atomic<uint64_t> next_ring_key_{1};
  log::Limit refusal_log_;  // control thread: peers' notifications refused
};

}  // namespace xfer
