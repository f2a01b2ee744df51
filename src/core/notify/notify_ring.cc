#include "core/notify/notify_ring.h"

#include <algorithm>
#include <cstring>

#include "util/futex.h"

namespace xfer {
namespace {

constexpr uint64_t kMagic = 0x58464e52'494e4731ull;  // (a laid-out ring starts with it)
constexpr uint64_t kPad = ~0ull;                     // a record that fills the rest of the ring
// Offsets in the header: each side writes its own cache line only.
constexpr uint64_t kMagicAt = 0, kCapacityAt = 8;                     // line 0: written once, by Format
constexpr uint64_t kHeadAt = 64, kDoorbellAt = 72;                    // line 1: the writer's
constexpr uint64_t kTailAt = 128, kWaitingAt = 136, kClosedAt = 140;  // line 2: the reader's

static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "the ring's indices are shared between processes: they must be lock-free");

uint64_t Round8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }
bool PowerOfTwo(uint64_t n) { return n != 0 && (n & (n - 1)) == 0; }

// One read of a word the other process may be writing: loaded once, never re-read.
uint64_t LoadOnce(const uint8_t* at) {
  return __atomic_load_n(reinterpret_cast<const uint64_t*>(at), __ATOMIC_RELAXED);
}

Status CheckShape(void* memory, uint64_t bytes, uint64_t* capacity) {
  if (memory == nullptr || reinterpret_cast<uintptr_t>(memory) % 64 != 0) {
    return {StatusCode::kInvalidArgument, "notification ring: memory must be 64-byte aligned"};
  }
  *capacity = bytes > NotifyRing::kHeaderBytes ? bytes - NotifyRing::kHeaderBytes : 0;
  if (!PowerOfTwo(*capacity) || *capacity < NotifyRing::kMinCapacity ||
      *capacity > NotifyRing::kMaxCapacity) {
    return {StatusCode::kInvalidArgument,
            "notification ring: " + std::to_string(bytes) + " bytes is not a header of " +
                std::to_string(NotifyRing::kHeaderBytes) + " and a power of two from " +
                std::to_string(NotifyRing::kMinCapacity) + " to " + std::to_string(NotifyRing::kMaxCapacity)};
  }
  return Status::Ok();
}

}  // namespace

Status NotifyRing::Format(void* memory, uint64_t bytes) {
  uint64_t capacity = 0;
  if (Status s = CheckShape(memory, bytes, &capacity); !s.ok()) return s;
  auto* base = static_cast<uint8_t*>(memory);
  std::memset(base, 0, kHeaderBytes);
  std::memcpy(base + kCapacityAt, &capacity, sizeof capacity);
  // The magic last: a ring is laid out once its magic is there.
  __atomic_store_n(reinterpret_cast<uint64_t*>(base + kMagicAt), kMagic, __ATOMIC_RELEASE);
  return Status::Ok();
}

Status NotifyRing::Attach(void* memory, uint64_t bytes, NotifyRing* out) {
  uint64_t capacity = 0;
  if (Status s = CheckShape(memory, bytes, &capacity); !s.ok()) return s;
  auto* base = static_cast<uint8_t*>(memory);
  if (__atomic_load_n(reinterpret_cast<const uint64_t*>(base + kMagicAt), __ATOMIC_ACQUIRE) != kMagic ||
      LoadOnce(base + kCapacityAt) != capacity) {
    return {StatusCode::kInvalidArgument,
            "notification ring: the memory holds no ring of " + std::to_string(capacity) + " bytes"};
  }
  NotifyRing r;
  r.data_ = base + kHeaderBytes;
  r.capacity_ = capacity;
  r.head_ = reinterpret_cast<std::atomic<uint64_t>*>(base + kHeadAt);
  r.tail_ = reinterpret_cast<std::atomic<uint64_t>*>(base + kTailAt);
  r.doorbell_ = reinterpret_cast<std::atomic<uint32_t>*>(base + kDoorbellAt);
  r.waiting_ = reinterpret_cast<std::atomic<uint32_t>*>(base + kWaitingAt);
  r.closed_ = reinterpret_cast<std::atomic<uint32_t>*>(base + kClosedAt);
  r.my_head_ = r.head_->load(std::memory_order_acquire);
  r.my_tail_ = r.tail_->load(std::memory_order_acquire);
  if (r.my_head_ - r.my_tail_ > capacity || r.my_head_ % 8 != 0 || r.my_tail_ % 8 != 0) {
    return {StatusCode::kInvalidArgument, "notification ring: its indices are inconsistent"};
  }
  *out = std::move(r);
  return Status::Ok();
}

Status NotifyRing::Broken(std::string why) {
  broken_ = "notification ring given up: " + std::move(why);
  return {StatusCode::kConnectionLost, broken_};
}

Status NotifyRing::Write(std::string_view message, bool* wake) {
  if (!broken_.empty()) return {StatusCode::kConnectionLost, broken_};
  if (data_ == nullptr) return {StatusCode::kInvalidArgument, "notification ring: not attached"};
  if (message.size() > MaxMessage(capacity_)) {
    return {StatusCode::kInvalidArgument, "notification ring: a message of " +
                                              std::to_string(message.size()) + " bytes (at most " +
                                              std::to_string(MaxMessage(capacity_)) + ")"};
  }
  if (closed_->load(std::memory_order_seq_cst) != 0) {
    return {StatusCode::kConnectionLost, "the target closed its notification ring"};
  }
  const uint64_t tail = tail_->load(std::memory_order_acquire);
  const uint64_t used = my_head_ - tail;  // (a tail ahead of the head wraps to a huge value)
  if (used > capacity_) {
    return Broken("the reader's index " + std::to_string(tail) + " is not within " +
                  std::to_string(capacity_) + " bytes behind the writer's " + std::to_string(my_head_));
  }
  const uint64_t size = 8 + Round8(message.size());
  uint64_t pos = my_head_ & (capacity_ - 1);
  const uint64_t pad = pos + size > capacity_ ? capacity_ - pos : 0;
  if (pad + size > capacity_ - used) {
    return {StatusCode::kResourceExhausted, "the target's notification ring is full (" +
                                                std::to_string(used) + " of " + std::to_string(capacity_) +
                                                " bytes not taken yet)"};
  }
  if (pad != 0) {
    std::memcpy(data_ + pos, &kPad, sizeof kPad);
    pos = 0;
  }
  const uint64_t len = message.size();
  std::memcpy(data_ + pos, &len, sizeof len);
  std::memcpy(data_ + pos + 8, message.data(), message.size());
  my_head_ += pad + size;
  head_->store(my_head_, std::memory_order_seq_cst);  // (seq_cst: see Close)
  // (Sequentially consistent with BeginWait's store and load: either the reader's look finds
  // this message, or this sees it waiting.)
  doorbell_->fetch_add(1, std::memory_order_seq_cst);
  const bool asleep = waiting_->load(std::memory_order_seq_cst) != 0;
  if (wake != nullptr) {
    *wake = asleep;
  } else if (asleep) {
    WakeReader();
  }
  // (Sequentially consistent with Close: either the target's last ReadAll finds this message,
  // or this sees the ring closed.)
  if (closed_->load(std::memory_order_seq_cst) != 0) {
    return {StatusCode::kConnectionLost,
            "the target closed its notification ring (the notification may or may not have been queued)"};
  }
  return Status::Ok();
}

Status NotifyRing::ReadAll(uint64_t max_message, std::vector<std::string>* out, bool free) {
  if (!broken_.empty()) return {StatusCode::kConnectionLost, broken_};
  if (data_ == nullptr) return {StatusCode::kInvalidArgument, "notification ring: not attached"};
  const uint64_t head = head_->load(std::memory_order_seq_cst);  // (after Close's store)
  if (!HeadInRange(head)) {
    return Broken("the writer's index " + std::to_string(head) + " is not within " +
                  std::to_string(capacity_) + " bytes ahead of the reader's " + std::to_string(my_tail_));
  }
  std::string why;
  my_tail_ = Walk(head, max_message, &why, [&](const uint8_t* message, uint64_t len) {
    out->emplace_back(reinterpret_cast<const char*>(message), len);
  });
  if (free) Free();
  return why.empty() ? Status::Ok() : Broken(std::move(why));
}

void NotifyRing::Free() {
  // (Published after the copies: the writer reuses the bytes from then on.)
  if (data_ != nullptr) tail_->store(my_tail_, std::memory_order_release);
}

void NotifyRing::Count(uint64_t max_message, uint64_t* messages, uint64_t* bytes, Counts counts) const {
  *messages = *bytes = 0;
  if (data_ == nullptr || !broken_.empty()) return;
  const uint64_t head = head_->load(std::memory_order_acquire);
  if (!HeadInRange(head)) return;
  std::string why;
  (void)Walk(head, max_message, &why, [&](const uint8_t* message, uint64_t len) {
    if (counts != nullptr && !counts(message, len)) return;
    ++*messages;
    *bytes += len;
  });
}

bool NotifyRing::HeadInRange(uint64_t head) const { return head - my_tail_ <= capacity_ && head % 8 == 0; }

template <class OnMessage>
uint64_t NotifyRing::Walk(uint64_t head, uint64_t max_message, std::string* why, OnMessage on_message) const {
  const uint64_t limit = std::min(max_message, MaxMessage(capacity_));
  uint64_t at = my_tail_;
  while (at != head) {
    const uint64_t pos = at & (capacity_ - 1);
    const uint64_t left = head - at;  // >= 8: both indices are multiples of 8
    const uint64_t len = LoadOnce(data_ + pos);
    if (len == kPad) {
      if (capacity_ - pos > left) {
        *why = "a pad record at " + std::to_string(at) + " runs past the writer's index";
        break;
      }
      at += capacity_ - pos;
      continue;
    }
    if (len > limit) {
      *why = "a message of " + std::to_string(len) + " bytes (at most " + std::to_string(limit) + ")";
      break;
    }
    const uint64_t size = 8 + Round8(len);
    if (size > left || pos + size > capacity_) {
      *why = "a message of " + std::to_string(len) + " bytes at " + std::to_string(at) +
             " runs past the writer's index or the ring's end";
      break;
    }
    on_message(data_ + pos + 8, len);
    at += size;
  }
  return at;
}

bool NotifyRing::HasMessages() const {
  return data_ != nullptr && broken_.empty() && head_->load(std::memory_order_acquire) != my_tail_;
}

void NotifyRing::WakeReader() const { futex::Wake(doorbell_, true); }  // (the sleeper: another process)

uint32_t NotifyRing::BeginWait() {
  waiting_->store(1, std::memory_order_seq_cst);
  return doorbell_->load(std::memory_order_seq_cst);
}

void NotifyRing::EndWait() { waiting_->store(0, std::memory_order_relaxed); }

void NotifyRing::Close() {
  if (closed_ != nullptr) closed_->store(1, std::memory_order_seq_cst);
}

}  // namespace xfer
