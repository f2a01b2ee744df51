// The records of a notification ring whose target asked for outcomes (notify.outcomes) and
// whose two engines both carry requests' beginnings and ends in rings (wire::kFeatureRingEnds):
// a notification, a notified request's beginning, or its end. Such a request then costs a
// same-host peer two writes into shared memory and no control frame (notify_rings.h).
//
// Encoding (little-endian, unpadded), after a kind byte:
//   kNotify: the message
//   kBegin:  id (8), the message
//   kEnded:  id (8), outcome (1), n (4), n landed indices (8 each, ascending), the message
// An end carries its message again, so that an end whose beginning the target could not hold
// still queues whole.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "xfer/status.h"
#include "xfer/types.h"

namespace xfer {

struct RingRecord {
  enum class Kind : uint8_t { kNotify = 0, kBegin = 1, kEnded = 2 };
  Kind kind = Kind::kNotify;
  uint64_t id = 0;                                    // kBegin, kEnded: the request's (NotifyBegin's id)
  NotifyOutcome outcome = NotifyOutcome::kCompleted;  // kEnded
  std::vector<uint64_t> landed;                       // kEnded
  std::string message;
};

// The record of `kind` in *out (its capacity kept: a caller that keeps one string per thread
// allocates nothing in the steady state).
void EncodeRingRecord(RingRecord::Kind kind, uint64_t id, NotifyOutcome outcome,
                      std::span<const uint64_t> landed, std::string_view message, std::string* out);
std::string EncodeRingRecord(const RingRecord& r);
// Whether the bytes are a record that queues a notification (not a beginning), at a look.
bool QueuesANotification(const uint8_t* record, uint64_t len);
// kInvalidArgument, saying why, for bytes that are no record: a kind, outcome or length out
// of range, landed indices out of order, a landed list on a completed end, or a message over
// max_message bytes.
// (The message is the bytes' own string, its head cut off: no copy.)
Status DecodeRingRecord(std::string bytes, uint32_t max_message, RingRecord* out);

}  // namespace xfer
