// A one-way ring of notifications in memory that two engines on one host share: the sender
// writes messages, the target reads them, and neither waits for the other. A message is queued
// at the target once Write returns: no round trip, and no thread woken but a target's reader
// asleep on the ring.
//
// Neither side trusts the other. Each keeps its own index privately and only publishes it; the
// other's index and every record length are read from the shared memory once, checked, and
// used from the local copy, so memory the other process scribbles on can garble messages but
// never makes either side read or write outside the ring. A ring found inconsistent answers
// kConnectionLost from then on (the caller drops it, and the session with that peer).
//
// Layout: a header of three cache lines (magic and capacity; the writer's head and doorbell;
// the reader's tail, waiting flag and closed flag), then `capacity` bytes of records. A record is an 8-byte
// length, then the message, padded to 8 bytes; it never wraps: where it would not fit before
// the end, a pad record fills the rest and the record starts over at the beginning.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "xfer/status.h"

namespace xfer {

class NotifyRing {
 public:
  static constexpr uint64_t kHeaderBytes = 192;
  static constexpr uint64_t kMinCapacity = 4096;
  static constexpr uint64_t kMaxCapacity = 1ull << 30;

  // The bytes a ring of `capacity` record bytes takes (capacity: a power of two, kMinCapacity
  // to kMaxCapacity).
  static constexpr uint64_t BytesFor(uint64_t capacity) { return kHeaderBytes + capacity; }
  // The largest message a ring of `capacity` bytes carries.
  static constexpr uint64_t MaxMessage(uint64_t capacity) { return capacity / 2 - 8; }

  // The target: lays out an empty ring over `bytes` of zeroed shared memory, 64-byte aligned;
  // its capacity is bytes - kHeaderBytes, which must be a power of two in range.
  static Status Format(void* memory, uint64_t bytes);
  // Either side: a ring over memory that Format laid out, here or in the other process. The
  // capacity is read once, here, and must match `bytes`.
  static Status Attach(void* memory, uint64_t bytes, NotifyRing* out);

  NotifyRing() = default;
  NotifyRing(NotifyRing&&) = default;
  NotifyRing& operator=(NotifyRing&&) = default;
  NotifyRing(const NotifyRing&) = delete;  // (one writer, one reader: two copies would race)
  NotifyRing& operator=(const NotifyRing&) = delete;

  // The sender: appends `message` (0..MaxMessage bytes), and wakes the reader when it sleeps
  // on the ring; given `wake`, says in it instead whether to (WakeReader, once the caller has
  // let go of its locks). kResourceExhausted when it does not fit until the target reads more;
  // kInvalidArgument for a bad size; kConnectionLost once the target's tail was found
  // inconsistent, or the target closed the ring (then the message may or may not have been
  // taken).
  Status Write(std::string_view message, bool* wake = nullptr);
  void WakeReader() const;
  // The target: no more messages will be read. A Write either ends before the ReadAll that
  // follows this (which takes its message) or answers kConnectionLost.
  void Close();
  // The target: takes every whole message written so far, in order, onto the end of *out.
  // Messages over max_message bytes, or any inconsistent index or length, end the ring:
  // kConnectionLost with the reason (messages taken before it stay in *out). free: whether
  // the writer may reuse their space at once; else it stays taken until Free, or a later
  // ReadAll that frees.
  Status ReadAll(uint64_t max_message, std::vector<std::string>* out, bool free = true);
  // The target: the space of every message taken so far is the writer's again.
  void Free();
  // The target: whether a message is waiting (a quick look; ReadAll decides).
  bool HasMessages() const;
  // The target: the whole messages waiting and their bytes, taking none (stops at anything
  // ReadAll would refuse); given `counts`, only those it says count (it sees the bytes in the
  // shared memory, which the writer may change meanwhile).
  using Counts = bool (*)(const uint8_t* message, uint64_t len);
  void Count(uint64_t max_message, uint64_t* messages, uint64_t* bytes, Counts counts = nullptr) const;

  // The target, to sleep until a message comes: BeginWait says the reader is about to sleep
  // and returns the doorbell's value; then look for messages (HasMessages, ReadAll) and, if
  // there are none, sleep on doorbell() while it holds that value (futex::WaitAny, shared);
  // EndWait after waking. A Write after BeginWait either is seen by
  // that look or changes the doorbell and wakes the sleeper.
  uint32_t BeginWait();
  void EndWait();

  std::atomic<uint32_t>* doorbell() const { return doorbell_; }
  uint64_t capacity() const { return capacity_; }
  bool broken() const { return !broken_.empty(); }

 private:
  Status Broken(std::string why);
  // Whether the writer's index `head` is where a consistent ring can have it.
  bool HeadInRange(uint64_t head) const;
  // Walks the records from the reader's index to head (checked: HeadInRange), calling
  // on_message(bytes, len) for each message, and returns the index it reached: head, or the
  // record it refused, with the reason in *why.
  template <class OnMessage>
  uint64_t Walk(uint64_t head, uint64_t max_message, std::string* why, OnMessage on_message) const;

  uint8_t* data_ = nullptr;
  uint64_t capacity_ = 0;
  std::atomic<uint64_t>* head_ = nullptr;      // shared: the writer's, bytes written so far
  std::atomic<uint64_t>* tail_ = nullptr;      // shared: the reader's, bytes taken so far
  std::atomic<uint32_t>* doorbell_ = nullptr;  // shared: the writer's, bumped per message
  std::atomic<uint32_t>* waiting_ = nullptr;   // shared: the reader's, nonzero while it sleeps
  std::atomic<uint32_t>* closed_ = nullptr;    // shared: the reader's, nonzero once it stopped
  uint64_t my_head_ = 0;                       // the writer's own copy (authoritative on the writer's side)
  uint64_t my_tail_ = 0;                       // the reader's own copy (authoritative on the reader's side)
  std::string broken_;                         // why the ring was given up, or empty
};

}  // namespace xfer
