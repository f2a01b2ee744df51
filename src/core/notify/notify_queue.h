// The notifications this engine received and the application has not taken yet: bounded by
// count and bytes, in arrival order. A notification that does not fit is refused (its sender
// is told why), never dropped. One sender may hold at most seven eighths of each bound (of
// eight messages or more): the rest is kept for the others, so that one sender's flood does
// not shut them out.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "xfer/status.h"
#include "xfer/types.h"

namespace xfer {

class NotifyQueue {
 public:
  using Clock = std::chrono::steady_clock;

  NotifyQueue(uint32_t max_messages, uint64_t max_bytes)
      : max_messages_(max_messages), max_bytes_(max_bytes) {}

  // Queues n, or refuses it with kResourceExhausted when either bound would be passed, or its
  // sender's part of them (logged once per stretch of refusals: until the application next
  // takes what is queued).
  // before_visible, when given, runs once n is queued and before anyone can take it (it must
  // not call back into the queue): e.g. the answer to its sender, which must leave before
  // anything the application sends after taking it.
  Status Push(Notification n, const std::function<void()>& before_visible = nullptr);
  // Queues n past the bounds: one its sender was already told is queued (in a ring), or whose
  // beginning came in a ring. Its landed list is dropped where it would pass the bytes bound.
  void PushAccepted(Notification n, const std::function<void()>& before_visible = nullptr);
  // Counts a notification of `bytes` against the bounds before it comes (a request begun
  // toward this engine: its notification comes however the request ends), or refuses it with
  // kResourceExhausted as Push would.
  Status Reserve(uint64_t bytes);
  // Queues n in place of a reservation of `reserved` bytes (its message's). It always fits:
  // where its landed list would pass the bytes bound, the list is dropped (landed unknown).
  void PushReserved(Notification n, uint64_t reserved, const std::function<void()>& before_visible = nullptr);
  // Moves everything queued to the end of *out; false when there was nothing.
  bool TakeAll(std::vector<Notification>* out);
  // TakeAll once something is queued, or false when `until` passes (or Close is called) first.
  bool WaitTakeAll(std::vector<Notification>* out, Clock::time_point until);
  // Wakes every waiter for good (Finalize); what is queued stays readable.
  void Close();
  bool closed();
  // A word bumped by every Push and by Close, which WaitTakeAll sleeps on, and a waiter that
  // watches other words too (futex::WaitAny): BeginWait says it may sleep and returns the
  // word's value; EndWait after.
  std::atomic<uint32_t>* changes() { return &changes_; }
  uint32_t BeginWait();
  void EndWait();
  // Bumps the word and wakes its waiters (something else they watch for changed).
  void Nudge();
  // How many are queued, and their bytes.
  void Queued(uint64_t* messages, uint64_t* bytes);
  // Whether a notification of one byte from sender (its incarnation) would be refused: the
  // queue, or that sender's part of it, is full (reservations counted) until the application
  // takes what is queued.
  bool Full(uint64_t sender);

 private:
  const uint32_t max_messages_;
  const uint64_t max_bytes_;
  std::mutex mu_;
  std::deque<Notification> queue_;  // mu_
  uint64_t bytes_ = 0;              // mu_: the queued messages' bytes
  uint64_t reserved_ = 0;           // mu_: reservations (Reserve) not yet queued...
  uint64_t reserved_bytes_ = 0;     // mu_: ...and their bytes
  uint64_t refused_ = 0;            // mu_: refusals since the queue was last drained
  struct Held {
    uint64_t messages = 0, bytes = 0;
  };
  std::unordered_map<uint64_t, Held> held_;  // mu_: what each sender (by incarnation) has queued
  bool closed_ = false;                      // mu_
  std::atomic<uint32_t> changes_{0};
  std::atomic<uint32_t> sleepers_{0};

  // Whether one more notification of `bytes` fits (mu_ held); else counts the refusal, and
  // says why in *why. sender: its incarnation (0: a reservation, whose share is kept apart).
  bool Fits(uint64_t bytes, uint64_t sender, std::string* why);
  // Fits's test alone (mu_ held): whether one more of `bytes` from sender fits the queue's
  // bounds, and the sender's part of them.
  struct Space {
    bool bounds = false;  // the queue's bounds take it
    bool part = false;    // the sender's part takes it...
    Held own;             // ...which holds this now
    bool Fits() const { return bounds && part; }
  };
  Space SpaceFor(uint64_t bytes, uint64_t sender) const;
  // The refusal Fits found (mu_ held by lock, which this releases): logged once a stretch.
  Status Refuse(std::unique_lock<std::mutex>& lock, std::string why, const std::string& what);
  // Queues n past the bounds (mu_ held by lock, which this releases), less its landed list
  // where that would pass the bytes bound and n is larger than `allowed` (its reservation).
  void QueueFitted(std::unique_lock<std::mutex>& lock, Notification n, uint64_t allowed,
                   const std::function<void()>& before_visible);
  // Queues n (mu_ held by lock, which this releases).
  void Queue(std::unique_lock<std::mutex>& lock, Notification n, uint64_t bytes,
             const std::function<void()>& before_visible);
};

}  // namespace xfer
