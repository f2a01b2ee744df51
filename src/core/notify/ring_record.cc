#include "core/notify/ring_record.h"

#include <cstring>

namespace xfer {

namespace {

template <class T>
void Put(std::string* out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // (little-endian hosts only, as the rest of the ring)
  out->append(b, sizeof(T));
}

// Reads fixed-size fields off the front of the bytes left.
struct Cursor {
  std::string_view left;
  template <class T>
  bool Take(T* v) {
    if (left.size() < sizeof(T)) return false;
    std::memcpy(v, left.data(), sizeof(T));
    left.remove_prefix(sizeof(T));
    return true;
  }
};

Status Bad(const std::string& why) { return {StatusCode::kInvalidArgument, "a ring record " + why}; }

}  // namespace

void EncodeRingRecord(RingRecord::Kind kind, uint64_t id, NotifyOutcome outcome,
                      std::span<const uint64_t> landed, std::string_view message, std::string* out) {
  out->clear();
  out->reserve(1 + 8 + 1 + 4 + 8 * landed.size() + message.size());
  Put(out, static_cast<uint8_t>(kind));
  if (kind != RingRecord::Kind::kNotify) Put(out, id);
  if (kind == RingRecord::Kind::kEnded) {
    Put(out, static_cast<uint8_t>(outcome));
    Put(out, static_cast<uint32_t>(landed.size()));
    for (uint64_t k : landed) Put(out, k);
  }
  out->append(message);
}

std::string EncodeRingRecord(const RingRecord& r) {
  std::string out;
  EncodeRingRecord(r.kind, r.id, r.outcome, r.landed, r.message, &out);
  return out;
}

bool QueuesANotification(const uint8_t* record, uint64_t len) {
  return len > 0 && record[0] != static_cast<uint8_t>(RingRecord::Kind::kBegin);
}

Status DecodeRingRecord(std::string bytes, uint32_t max_message, RingRecord* out) {
  Cursor c{std::string_view(bytes)};
  uint8_t kind = 0;
  if (!c.Take(&kind) || kind > static_cast<uint8_t>(RingRecord::Kind::kEnded)) return Bad("of no known kind");
  *out = RingRecord{};
  out->kind = static_cast<RingRecord::Kind>(kind);
  if (out->kind != RingRecord::Kind::kNotify && !c.Take(&out->id)) return Bad("cut short");
  if (out->kind == RingRecord::Kind::kEnded) {
    uint8_t outcome = 0;
    uint32_t n = 0;
    if (!c.Take(&outcome) || !c.Take(&n)) return Bad("cut short");
    if (outcome > static_cast<uint8_t>(NotifyOutcome::kCanceled)) {
      return Bad("ends a request other than completed, failed, timed out or canceled");
    }
    out->outcome = static_cast<NotifyOutcome>(outcome);
    if (out->outcome == NotifyOutcome::kCompleted && n != 0)
      return Bad("ends a completed request with a landed list");
    if (c.left.size() / 8 < n) return Bad("cut short in its landed list");
    out->landed.resize(n);
    for (uint64_t& k : out->landed) {
      (void)c.Take(&k);
      if (&k != out->landed.data() && k <= (&k)[-1]) return Bad("lists landed descriptors out of order");
    }
  }
  if (c.left.size() > max_message) {
    return Bad("carries a message of " + std::to_string(c.left.size()) + " bytes, over " +
               std::to_string(max_message));
  }
  const size_t head = bytes.size() - c.left.size();
  out->message = std::move(bytes);
  out->message.erase(0, head);
  return Status::Ok();
}

}  // namespace xfer
