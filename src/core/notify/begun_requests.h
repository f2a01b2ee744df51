// The target's side of EngineOptions::notify.outcomes: the notified requests its peers
// announced (wire::NotifyBegin, or a ring's beginning) and have not ended yet, per session,
// with their messages. One begun over the session is reserved in the queue (NotifyQueue::
// Reserve), so that its notification fits however the request ends; one begun in a ring is
// past the bounds, as everything a ring carries. Its end takes the message back to queue it
// with the outcome; a session that ends first leaves the rest to be queued as kInitiatorLost,
// in the order they began (their ids': a sender numbers its requests as they begin, whichever
// way, ring or session, each beginning then travels).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/notify/notify_queue.h"
#include "xfer/options.h"
#include "xfer/status.h"

namespace xfer {

class BegunRequests {
 public:
  using Key = const void*;  // the session's

  // One session holds at most a quarter of the queue's bounds (messages, bytes), and at least
  // one message of the largest size: with a queue of four or more of those, one peer cannot
  // take the whole queue with requests it begins and never ends.
  BegunRequests(NotifyQueue* queue, const EngineOptions::Notify& o)
      : queue_(queue),
        most_(std::max<uint64_t>(o.queue_messages / 4, 1)),
        most_bytes_(std::max<uint64_t>(o.queue_bytes / 4, o.max_message_bytes)) {}

  // A request begun on a session under the id its sender gave it, with its notification's
  // message: held (and, when `reserve`, reserved in the queue), or refused
  // (kResourceExhausted: the queue is full, or the session holds its share; kInvalidArgument:
  // an id begun already).
  Status Begin(Key session, uint64_t id, std::string message, bool reserve = true);
  // A beginning refused before it got here (e.g. a message too long): remembered as Begin
  // remembers its own refusals (the last `share` of them per session), for the request's end.
  void Refuse(Key session, uint64_t id, const Status& why);
  // A request's message, and whether the queue holds a reservation for it (then queue its
  // notification with NotifyQueue::PushReserved of the message's size).
  struct Held {
    std::string message;
    bool reserved = true;
  };
  // Its end: what was held, in *held; else why not: the refusal of its beginning, or
  // kResourceExhausted when none is known (never begun, ended already, or refused long before).
  Status End(Key session, uint64_t id, Held* held);
  // The session ended: the requests still begun, in the order of their ids, and the session
  // forgotten.
  std::vector<Held> Take(Key session);
  // Queues n, the notification of a request held with its message (Held::reserved: through
  // NotifyQueue::PushReserved in place of its reservation, else PushAccepted: begun in a ring,
  // past the bounds).
  void Queue(Notification n, bool reserved, const std::function<void()>& before_visible = nullptr);

 private:
  struct Session {
    std::map<uint64_t, Held> begun;      // by id
    std::map<uint64_t, Status> refused;  // by id: the last most_ refusals
    uint64_t bytes = 0;                  // the begun messages'
  };
  void RefuseLocked(Session& in, uint64_t id, const Status& why);  // (mu_ held)

  NotifyQueue* const queue_;
  const uint64_t most_, most_bytes_;
  std::mutex mu_;
  std::unordered_map<Key, Session> sessions_;  // mu_
};

}  // namespace xfer
