#include "core/notify/notify_queue.h"

#include "util/futex.h"
#include "util/log.h"

namespace xfer {

namespace {
// What a notification counts against the queue's bytes: its message, and its landed list.
uint64_t QueuedBytes(const Notification& n) { return n.message.size() + sizeof(uint64_t) * n.landed.size(); }
}  // namespace

NotifyQueue::Space NotifyQueue::SpaceFor(uint64_t bytes, uint64_t sender) const {
  Space s;
  s.bounds = queue_.size() + reserved_ < max_messages_ && bytes_ + reserved_bytes_ + bytes <= max_bytes_;
  const auto it = held_.find(sender);
  s.own = sender != 0 && it != held_.end() ? it->second : Held{};
  s.part = s.own.messages < max_messages_ - max_messages_ / 8 &&
           s.own.bytes + bytes <= max_bytes_ - max_bytes_ / 8;
  return s;
}

bool NotifyQueue::Fits(uint64_t bytes, uint64_t sender, std::string* why) {
  const Space space = SpaceFor(bytes, sender);
  if (space.Fits()) return true;
  ++refused_;
  if (!space.bounds) {
    *why = "the target's notification queue is full (" + std::to_string(queue_.size()) + " messages, " +
           std::to_string(bytes_) + " bytes queued, " + std::to_string(reserved_) +
           " more promised; EngineOptions::notify bounds " + std::to_string(max_messages_) + " / " +
           std::to_string(max_bytes_) + "): the application is not taking them";
  } else {
    *why = "this sender holds " + std::to_string(space.own.messages) + " messages and " +
           std::to_string(space.own.bytes) +
           " bytes of the target's notification queue, the most one sender may (seven eighths of "
           "EngineOptions::notify bounds " +
           std::to_string(max_messages_) + " / " + std::to_string(max_bytes_) +
           "; the rest is kept for other senders): the application is not taking them";
  }
  return false;
}

void NotifyQueue::Queue(std::unique_lock<std::mutex>& lock, Notification n, uint64_t bytes,
                        const std::function<void()>& before_visible) {
  bytes_ += bytes;
  Held& own = held_[n.sender_incarnation];
  ++own.messages;
  own.bytes += bytes;
  queue_.push_back(std::move(n));
  if (before_visible) before_visible();  // (under the lock: no TakeAll sees it before)
  lock.unlock();
  Nudge();
}

Status NotifyQueue::Refuse(std::unique_lock<std::mutex>& lock, std::string why, const std::string& what) {
  const bool first = refused_ == 1;
  lock.unlock();
  if (first) XLOG(WARN) << "refused " << what << ": " << why;
  return {StatusCode::kResourceExhausted, std::move(why)};
}

Status NotifyQueue::Push(Notification n, const std::function<void()>& before_visible) {
  std::unique_lock lock(mu_);
  const uint64_t size = QueuedBytes(n);
  if (std::string why; !Fits(size, n.sender_incarnation, &why))
    return Refuse(lock, std::move(why), "a notification from " + n.sender);
  Queue(lock, std::move(n), size, before_visible);
  return Status::Ok();
}

Status NotifyQueue::Reserve(uint64_t bytes) {
  std::unique_lock lock(mu_);
  if (std::string why; !Fits(bytes, 0, &why)) return Refuse(lock, std::move(why), "a request's notification");
  ++reserved_;
  reserved_bytes_ += bytes;
  return Status::Ok();
}

void NotifyQueue::PushReserved(Notification n, uint64_t reserved,
                               const std::function<void()>& before_visible) {
  std::unique_lock lock(mu_);
  --reserved_;
  reserved_bytes_ -= reserved;
  QueueFitted(lock, std::move(n), reserved, before_visible);  // (the message was reserved: it fits)
}

void NotifyQueue::PushAccepted(Notification n, const std::function<void()>& before_visible) {
  std::unique_lock lock(mu_);
  QueueFitted(lock, std::move(n), 0, before_visible);
}

void NotifyQueue::QueueFitted(std::unique_lock<std::mutex>& lock, Notification n, uint64_t allowed,
                              const std::function<void()>& before_visible) {
  uint64_t size = QueuedBytes(n);
  const bool dropped = !n.landed.empty() && size > allowed && bytes_ + reserved_bytes_ + size > max_bytes_;
  if (dropped) {
    n.landed.clear();
    size = QueuedBytes(n);
  }
  const std::string sender = dropped ? n.sender : "";
  Queue(lock, std::move(n), size, before_visible);
  if (dropped) {
    XLOG(WARN) << "dropped the landed list of a notification from " << sender
               << ": it would pass notify.queue_bytes (" << max_bytes_ << ")";
  }
}

bool NotifyQueue::TakeAll(std::vector<Notification>* out) {
  uint64_t refused = 0;
  {
    std::lock_guard lock(mu_);
    refused = refused_;
    refused_ = 0;  // (a new stretch of refusals starts: its first is logged)
    if (queue_.empty()) return false;
    for (auto& n : queue_) out->push_back(std::move(n));
    queue_.clear();
    held_.clear();
    bytes_ = 0;
  }
  if (refused > 1) XLOG(WARN) << "the notification queue had refused " << refused << " notifications";
  return true;
}

bool NotifyQueue::WaitTakeAll(std::vector<Notification>* out, Clock::time_point until) {
  for (;;) {
    const futex::Watch watch{&changes_, BeginWait(), false};
    const bool took = TakeAll(out);
    const bool over = took || closed() || Clock::now() >= until;
    if (!over) futex::WaitAny({&watch, 1}, until);
    EndWait();
    if (over) return took;
  }
}

void NotifyQueue::Close() {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  Nudge();
}

bool NotifyQueue::closed() {
  std::lock_guard lock(mu_);
  return closed_;
}

void NotifyQueue::Nudge() {
  // (Sequentially consistent with BeginWait: either the waiter's look finds the change, or
  // this sees the waiter.)
  changes_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) != 0) futex::Wake(&changes_, false);
}

uint32_t NotifyQueue::BeginWait() {
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  return changes_.load(std::memory_order_seq_cst);
}

void NotifyQueue::EndWait() { sleepers_.fetch_sub(1, std::memory_order_relaxed); }

bool NotifyQueue::Full(uint64_t sender) {
  std::lock_guard lock(mu_);
  return !SpaceFor(1, sender).Fits();
}

void NotifyQueue::Queued(uint64_t* messages, uint64_t* bytes) {
  std::lock_guard lock(mu_);
  *messages = queue_.size();
  *bytes = bytes_;
}

}  // namespace xfer
