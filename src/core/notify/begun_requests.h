// The target's side of EngineOptions::notify.outcomes: the notified requests its peers
// announced (wire::NotifyBegin) and have not ended yet, per session, with their messages. Each
// is reserved in the queue when it begins (NotifyQueue::Reserve), so that its notification
// fits however the request ends; its end (wire::NotifyEnded) takes the message back to queue
// it with the outcome; a session that ends first leaves the rest to be queued as
// kInitiatorLost, in the order they began.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/notify/notify_queue.h"
#include "xfer/status.h"

namespace xfer {

class BegunRequests {
 public:
  using Key = const void*;  // the session's

  explicit BegunRequests(NotifyQueue* queue) : queue_(queue) {}

  // A request begun on a session as its frame number seq, with its notification's message:
  // reserved in the queue, or refused (kResourceExhausted: the queue is full; kInvalidArgument:
  // a number already begun).
  Status Begin(Key session, uint64_t seq, std::string message);
  // Its end: the message back in *message (still reserved: NotifyQueue::PushReserved of its
  // size); kInvalidArgument when no request began as `begin` on the session (or its Begin was
  // refused).
  Status End(Key session, uint64_t begin, std::string* message);
  // The session ended: the messages of the requests still begun, oldest first (each still
  // reserved), and the session forgotten.
  std::vector<std::string> Take(Key session);

 private:
  NotifyQueue* const queue_;
  std::mutex mu_;
  std::unordered_map<Key, std::map<uint64_t, std::string>> begun_;  // mu_
};

}  // namespace xfer
