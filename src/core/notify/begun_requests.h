// The target's side of EngineOptions::notify.outcomes: the notified requests its peers
// announced (wire::NotifyBegin) and have not ended yet, per session, with their messages. Each
// is reserved in the queue when it begins (NotifyQueue::Reserve), so that its notification
// fits however the request ends; its end (wire::NotifyEnded) takes the message back to queue
// it with the outcome; a session that ends first leaves the rest to be queued as
// kInitiatorLost, in the order they began.
#pragma once

#include <algorithm>
#include <cstdint>
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

  // One session holds at most a quarter of the queue's bounds (messages, bytes; at least one
  // of the largest messages): one peer cannot take the whole queue with requests it begins
  // and never ends.
  BegunRequests(NotifyQueue* queue, const EngineOptions::Notify& o)
      : queue_(queue),
        most_(std::max<uint64_t>(o.queue_messages / 4, 1)),
        most_bytes_(std::max<uint64_t>(o.queue_bytes / 4, o.max_message_bytes)) {}

  // A request begun on a session as its frame number seq, with its notification's message:
  // reserved in the queue, or refused (kResourceExhausted: the queue is full, or the session
  // holds its share; kInvalidArgument: a number already begun).
  Status Begin(Key session, uint64_t seq, std::string message);
  // Its end: the message back in *message (still reserved: NotifyQueue::PushReserved of its
  // size); kInvalidArgument when no request began as `begin` on the session (or its Begin was
  // refused).
  Status End(Key session, uint64_t begin, std::string* message);
  // The session ended: the messages of the requests still begun, oldest first (each still
  // reserved), and the session forgotten.
  std::vector<std::string> Take(Key session);

 private:
  struct Session {
    std::map<uint64_t, std::string> begun;  // by the Begin's number
    uint64_t bytes = 0;                     // their messages'
  };
  NotifyQueue* const queue_;
  const uint64_t most_, most_bytes_;
  std::mutex mu_;
  std::unordered_map<Key, Session> sessions_;  // mu_
};

}  // namespace xfer
