#include "control/wire.h"

#include <cstring>
#include <type_traits>

namespace xfer::wire {
namespace {

// Region flags.
constexpr uint8_t kShared = 1;    // memory from AllocMem (RegionInfo::shared)
constexpr uint8_t kReadOnly = 2;  // peers may not WRITE it (PeerAccess::kReadOnly)

class Writer {
 public:
  void U8(uint8_t v) { buf_.push_back(v); }
  void U16(uint16_t v) { Raw(v); }
  void U32(uint32_t v) { Raw(v); }
  void U64(uint64_t v) { Raw(v); }
  void I32(int32_t v) { Raw(v); }
  void Str(const std::string& s) {
    U32(static_cast<uint32_t>(s.size()));
    buf_.insert(buf_.end(), s.begin(), s.end());
  }
  void Blobs(const transport::Blobs& blobs) {
    U32(static_cast<uint32_t>(blobs.size()));
    for (const auto& b : blobs) {
      Str(b.backend);
      Str(b.bytes);
    }
  }
  void Ranges(const std::vector<DigestRange>& ranges) {
    U32(static_cast<uint32_t>(ranges.size()));
    for (const DigestRange& r : ranges) {
      U64(r.addr);
      U64(r.len);
    }
  }
  void Region(const WireRegion& r) {
    U64(r.id);
    U64(r.info.addr);
    U64(r.info.len);
    U8(static_cast<uint8_t>(r.info.type));
    I32(r.info.device);
    Str(r.info.tag);
    U8((r.info.shared ? kShared : 0) | (r.info.access == PeerAccess::kReadOnly ? kReadOnly : 0));
    Blobs(r.blobs);
  }
  std::vector<uint8_t>& bytes() { return buf_; }

 private:
  template <class T>
  void Raw(T v) {  // x86-64 and aarch64 Linux are little-endian, as the format is
    uint8_t b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    buf_.insert(buf_.end(), b, b + sizeof(T));
  }
  std::vector<uint8_t> buf_;
};

// Every read checks the bytes left; after the first failure all reads fail. What the decoded
// message takes in memory (objects, heap strings) is charged against a budget proportional to
// the payload (kDecodedBytesPerByte), so no frame costs more memory than its size says.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> b)
      : b_(b), budget_(b.size() * kDecodedBytesPerByte + kDecodedBytesSlack) {}
  bool U8(uint8_t* v) { return Raw(v); }
  bool U16(uint16_t* v) { return Raw(v); }
  bool U32(uint32_t* v) { return Raw(v); }
  bool U64(uint64_t* v) { return Raw(v); }
  bool I32(int32_t* v) { return Raw(v); }
  bool Str(std::string* s, uint32_t cap = kMaxString) {
    uint32_t n = 0;
    if (!U32(&n)) return false;
    if (n > cap) return Fail("string of " + std::to_string(n) + " bytes exceeds the cap");
    if (n > left()) return Fail("string length " + std::to_string(n) + " past end of frame");
    if (n >= sizeof(std::string) && !Charge(n + 32)) return false;  // (shorter ones live inline)
    s->assign(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  // Reads a list count and checks that count * min_item_bytes fit in what is left, and that
  // count items of item_size bytes fit in the budget.
  bool Count(uint32_t* n, size_t min_item_bytes, size_t item_size) {
    if (!U32(n)) return false;
    if (static_cast<uint64_t>(*n) * min_item_bytes > left()) {
      return Fail("list of " + std::to_string(*n) + " items cannot fit in the frame");
    }
    return Charge(static_cast<uint64_t>(*n) * item_size);
  }
  bool Charge(uint64_t bytes) {
    if (bytes > budget_)
      return Fail("the decoded frame would take more than " + std::to_string(kDecodedBytesPerByte) +
                  " times its size in memory");
    budget_ -= bytes;
    return true;
  }
  bool Blobs(transport::Blobs* blobs) {
    uint32_t n = 0;
    if (!Count(&n, 8, sizeof(transport::Blob))) return false;
    if (n > kMaxBlobs) return Fail("list of " + std::to_string(n) + " backends exceeds the cap");
    blobs->resize(n);
    for (auto& b : *blobs) {
      if (!Str(&b.backend) || !Str(&b.bytes)) return false;
    }
    return true;
  }
  // A status code this build knows.
  bool Code(StatusCode* code) {
    uint32_t c = 0;
    if (!U32(&c)) return false;
    if (c > static_cast<uint32_t>(kLastStatusCode)) return Fail("unknown status code");
    *code = static_cast<StatusCode>(c);
    return true;
  }
  // A list of at most `most` ranges of the receiver's memory (`too_many` says why not).
  bool Ranges(std::vector<DigestRange>* ranges, uint32_t most, const char* too_many) {
    uint32_t n = 0;
    if (!Count(&n, 16, sizeof(DigestRange))) return false;
    if (n > most) return Fail(too_many);
    ranges->resize(n);
    for (DigestRange& r : *ranges) {
      if (!U64(&r.addr) || !U64(&r.len)) return false;
    }
    return true;
  }
  bool Region(WireRegion* r) {
    uint8_t type = 0, flags = 0;
    if (!U64(&r->id) || !U64(&r->info.addr) || !U64(&r->info.len) || !U8(&type) || !I32(&r->info.device) ||
        !Str(&r->info.tag) || !U8(&flags) || !Blobs(&r->blobs)) {
      return false;
    }
    if (type > static_cast<uint8_t>(MemType::kCuda)) return Fail("unknown memory type");
    if (flags & ~(kShared | kReadOnly)) return Fail("unknown region flags");
    r->info.type = static_cast<MemType>(type);
    r->info.shared = flags & kShared;
    r->info.access = flags & kReadOnly ? PeerAccess::kReadOnly : PeerAccess::kReadWrite;
    return true;
  }
  bool Done() {
    if (failed_) return false;
    if (left() != 0) return Fail(std::to_string(left()) + " trailing bytes");
    return true;
  }
  const std::string& error() const { return error_; }
  bool Fail(std::string why) {
    if (!failed_) error_ = std::move(why);
    failed_ = true;
    return false;
  }

 private:
  size_t left() const { return b_.size() - pos_; }
  template <class T>
  bool Raw(T* v) {
    if (failed_) return false;
    if (left() < sizeof(T)) return Fail("frame truncated");
    std::memcpy(v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  std::span<const uint8_t> b_;
  uint64_t budget_;  // bytes the decoded message may still take
  size_t pos_ = 0;
  bool failed_ = false;
  std::string error_;
};

constexpr size_t kMinRegionBytes = 8 + 8 + 8 + 1 + 4 + 4 + 1 + 4;

void EncodeBody(Writer& w, const Hello& m) {
  w.Str(m.name);
  w.U64(m.incarnation);
  w.Str(m.host_id);
  w.I32(m.pid);
  w.U32(m.features);
  w.Blobs(m.backends);
  w.U32(static_cast<uint32_t>(m.regions.size()));
  for (const auto& r : m.regions) w.Region(r);
}
void EncodeBody(Writer& w, const RegionAdd& m) { w.Region(m.region); }
void EncodeBody(Writer& w, const RegionRemove& m) {
  w.U64(m.id);
  w.U64(m.seq);
}
void EncodeBody(Writer& w, const RegionRemoveAck& m) {
  w.U64(m.id);
  w.U64(m.seq);
}
void EncodeBody(Writer& w, const Sync& m) { w.U64(m.seq); }
void EncodeBody(Writer& w, const SyncAck& m) { w.U64(m.seq); }
void EncodeBody(Writer&, const Heartbeat&) {}
void EncodeBody(Writer& w, const Goodbye& m) {
  w.Str(m.reason);
  w.U64(m.seq);
}
void EncodeBody(Writer& w, const Notify& m) {
  w.U64(m.seq);
  w.Str(m.message);
}
void EncodeBody(Writer& w, const NotifyBegin& m) {
  w.U64(m.id);
  w.Str(m.message);
}
void EncodeBody(Writer& w, const NotifyEnded& m) {
  w.U64(m.seq);
  w.U64(m.begin);
  w.U8(static_cast<uint8_t>(m.outcome));
  w.U32(static_cast<uint32_t>(m.landed.size()));
  for (uint64_t i : m.landed) w.U64(i);
}
void EncodeBody(Writer& w, const Digest& m) {
  w.U64(m.id);
  w.U8(m.landed ? 1 : 0);
  w.Ranges(m.ranges);
}
void EncodeBody(Writer& w, const DigestCancel& m) { w.U64(m.id); }
void EncodeBody(Writer& w, const DigestAnswer& m) {
  w.U64(m.id);
  w.U32(static_cast<uint32_t>(m.code));
  w.Str(m.why);
  w.U32(static_cast<uint32_t>(m.digests.size()));
  for (uint64_t d : m.digests) w.U64(d);
}
void EncodeBody(Writer& w, const StageOpen& m) { w.U64(m.id); }
void EncodeBody(Writer& w, const StageOpened& m) {
  w.U64(m.id);
  w.U32(static_cast<uint32_t>(m.code));
  w.Str(m.why);
  w.Region(m.region);
  w.U64(m.slot_bytes);
  w.U32(m.slots);
}
void EncodeBody(Writer& w, const StageMove& m) {
  w.U64(m.id);
  w.U8(m.write ? 1 : 0);
  w.U32(m.slot);
  w.Ranges(m.ranges);
}
void EncodeBody(Writer& w, const StageMoved& m) {
  w.U64(m.id);
  w.U32(static_cast<uint32_t>(m.code));
  w.Str(m.why);
}
void EncodeBody(Writer& w, const NotifyAck& m) {
  w.U64(m.seq);
  w.U32(static_cast<uint32_t>(m.code));
  w.Str(m.why);
}
void EncodeBody(Writer& w, const NotifyRingOffer& m) {
  w.U64(m.seq);
  w.I32(m.fd);
  w.U64(m.key);
  w.U64(m.bytes);
  w.U32(m.max_message);
}
void EncodeBody(Writer& w, const AuthChallenge& m) { w.Str(m.nonce); }
void EncodeBody(Writer& w, const AuthProof& m) {
  w.Str(m.name);
  w.U64(m.incarnation);
  w.Str(m.dialled);
  w.Str(m.mac);
}

bool DecodeBody(Reader& r, Hello* m) {
  uint32_t n = 0;
  // (A name and a host id are kept per peer and logged: no longer than an AuthProof's name.)
  if (!r.Str(&m->name, kMaxAuthName) || !r.U64(&m->incarnation) || !r.Str(&m->host_id, kMaxAuthName) ||
      !r.I32(&m->pid) || !r.U32(&m->features) || !r.Blobs(&m->backends) ||
      !r.Count(&n, kMinRegionBytes, sizeof(WireRegion))) {
    return false;
  }
  m->regions.resize(n);
  for (auto& reg : m->regions) {
    if (!r.Region(&reg)) return false;
  }
  return true;
}
bool DecodeBody(Reader& r, RegionAdd* m) { return r.Region(&m->region); }
bool DecodeBody(Reader& r, RegionRemove* m) { return r.U64(&m->id) && r.U64(&m->seq); }
bool DecodeBody(Reader& r, RegionRemoveAck* m) { return r.U64(&m->id) && r.U64(&m->seq); }
bool DecodeBody(Reader& r, Sync* m) { return r.U64(&m->seq); }
bool DecodeBody(Reader& r, SyncAck* m) { return r.U64(&m->seq); }
bool DecodeBody(Reader&, Heartbeat*) { return true; }
bool DecodeBody(Reader& r, Goodbye* m) { return r.Str(&m->reason) && r.U64(&m->seq); }
bool DecodeBody(Reader& r, Notify* m) { return r.U64(&m->seq) && r.Str(&m->message, kMaxNotify); }
bool DecodeBody(Reader& r, NotifyBegin* m) { return r.U64(&m->id) && r.Str(&m->message, kMaxNotify); }
bool DecodeBody(Reader& r, NotifyEnded* m) {
  uint8_t outcome = 0;
  uint32_t n = 0;
  if (!r.U64(&m->seq) || !r.U64(&m->begin) || !r.U8(&outcome) || !r.Count(&n, 8, sizeof(uint64_t))) {
    return false;
  }
  if (outcome > static_cast<uint8_t>(NotifyOutcome::kCanceled)) {
    return r.Fail("a request's end that is not completed, failed, timed out or canceled");
  }
  m->outcome = static_cast<NotifyOutcome>(outcome);
  if (m->outcome == NotifyOutcome::kCompleted && n != 0) {
    return r.Fail("a completed request with a landed list");
  }
  m->landed.resize(n);
  for (size_t k = 0; k < n; ++k) {
    if (!r.U64(&m->landed[k])) return false;
    if (k > 0 && m->landed[k] <= m->landed[k - 1]) return r.Fail("landed descriptors out of order");
  }
  return true;
}
bool DecodeBody(Reader& r, Digest* m) {
  uint8_t landed = 0;
  if (!r.U64(&m->id) || !r.U8(&landed)) return false;
  if (landed > 1) return r.Fail("a landed flag other than 0 or 1");
  m->landed = landed == 1;
  return r.Ranges(&m->ranges, kMaxDigestRanges, "more ranges than a Digest may ask for");
}
bool DecodeBody(Reader& r, DigestCancel* m) { return r.U64(&m->id); }
bool DecodeBody(Reader& r, DigestAnswer* m) {
  uint32_t n = 0;
  if (!r.U64(&m->id) || !r.Code(&m->code) || !r.Str(&m->why) || !r.Count(&n, 8, sizeof(uint64_t)))
    return false;
  if (m->code != StatusCode::kOk && n != 0) return r.Fail("checksums in a refusal");
  m->digests.resize(n);
  for (uint64_t& d : m->digests) {
    if (!r.U64(&d)) return false;
  }
  return true;
}
bool DecodeBody(Reader& r, StageOpen* m) { return r.U64(&m->id); }
bool DecodeBody(Reader& r, StageOpened* m) {
  return r.U64(&m->id) && r.Code(&m->code) && r.Str(&m->why) && r.Region(&m->region) &&
         r.U64(&m->slot_bytes) && r.U32(&m->slots);
}
bool DecodeBody(Reader& r, StageMove* m) {
  uint8_t write = 0;
  if (!r.U64(&m->id) || !r.U8(&write) || !r.U32(&m->slot)) return false;
  if (write > 1) return r.Fail("a write flag other than 0 or 1");
  m->write = write == 1;
  return r.Ranges(&m->ranges, kMaxStageRanges, "more ranges than a StageMove may name");
}
bool DecodeBody(Reader& r, StageMoved* m) { return r.U64(&m->id) && r.Code(&m->code) && r.Str(&m->why); }
bool DecodeBody(Reader& r, NotifyAck* m) { return r.U64(&m->seq) && r.Code(&m->code) && r.Str(&m->why); }
bool DecodeBody(Reader& r, NotifyRingOffer* m) {
  return r.U64(&m->seq) && r.I32(&m->fd) && r.U64(&m->key) && r.U64(&m->bytes) && r.U32(&m->max_message);
}

bool DecodeBody(Reader& r, AuthChallenge* m) {
  if (!r.Str(&m->nonce, kAuthNonceBytes)) return false;
  return m->nonce.size() == kAuthNonceBytes || r.Fail("nonce of the wrong length");
}
bool DecodeBody(Reader& r, AuthProof* m) {
  if (!r.Str(&m->name, kMaxAuthName) || !r.U64(&m->incarnation) || !r.Str(&m->dialled, kMaxAuthName) ||
      !r.Str(&m->mac, kAuthMacBytes))
    return false;
  return m->mac.size() == kAuthMacBytes || r.Fail("MAC of the wrong length");
}

template <class T>
MsgType TypeOf();
template <>
MsgType TypeOf<Hello>() {
  return MsgType::kHello;
}
template <>
MsgType TypeOf<RegionAdd>() {
  return MsgType::kRegionAdd;
}
template <>
MsgType TypeOf<RegionRemove>() {
  return MsgType::kRegionRemove;
}
template <>
MsgType TypeOf<RegionRemoveAck>() {
  return MsgType::kRegionRemoveAck;
}
template <>
MsgType TypeOf<Sync>() {
  return MsgType::kSync;
}
template <>
MsgType TypeOf<SyncAck>() {
  return MsgType::kSyncAck;
}
template <>
MsgType TypeOf<Heartbeat>() {
  return MsgType::kHeartbeat;
}
template <>
MsgType TypeOf<Goodbye>() {
  return MsgType::kGoodbye;
}
template <>
MsgType TypeOf<Notify>() {
  return MsgType::kNotify;
}
template <>
MsgType TypeOf<NotifyAck>() {
  return MsgType::kNotifyAck;
}
template <>
MsgType TypeOf<AuthChallenge>() {
  return MsgType::kAuthChallenge;
}
template <>
MsgType TypeOf<AuthProof>() {
  return MsgType::kAuthProof;
}
template <>
MsgType TypeOf<NotifyRingOffer>() {
  return MsgType::kNotifyRingOffer;
}
template <>
MsgType TypeOf<NotifyBegin>() {
  return MsgType::kNotifyBegin;
}
template <>
MsgType TypeOf<NotifyEnded>() {
  return MsgType::kNotifyEnded;
}

template <>
MsgType TypeOf<Digest>() {
  return MsgType::kDigest;
}
template <>
MsgType TypeOf<DigestAnswer>() {
  return MsgType::kDigestAnswer;
}
template <>
MsgType TypeOf<DigestCancel>() {
  return MsgType::kDigestCancel;
}
template <>
MsgType TypeOf<StageOpen>() {
  return MsgType::kStageOpen;
}
template <>
MsgType TypeOf<StageOpened>() {
  return MsgType::kStageOpened;
}
template <>
MsgType TypeOf<StageMove>() {
  return MsgType::kStageMove;
}
template <>
MsgType TypeOf<StageMoved>() {
  return MsgType::kStageMoved;
}

template <class T>
bool DecodeAs(std::span<const uint8_t> payload, Message* out, std::string* error) {
  Reader r(payload);
  T m;
  if (!DecodeBody(r, &m) || !r.Done()) {
    *error = std::string(MsgTypeName(TypeOf<T>())) + ": " + r.error();
    return false;
  }
  *out = std::move(m);
  return true;
}

}  // namespace

std::vector<uint8_t> Encode(const Message& msg) {
  Writer w;
  w.U32(kMagic);
  w.U16(kVersion);
  std::visit(
      [&](const auto& m) {
        w.U16(static_cast<uint16_t>(TypeOf<std::decay_t<decltype(m)>>()));
        w.U32(0);  // length, patched below
        EncodeBody(w, m);
      },
      msg);
  auto& b = w.bytes();
  uint32_t len = static_cast<uint32_t>(b.size() - kHeaderSize);
  std::memcpy(b.data() + 8, &len, sizeof len);
  return std::move(b);
}

bool DecodeHeader(std::span<const uint8_t> bytes, Header* out, std::string* error) {
  if (bytes.size() < kHeaderSize) {
    *error = "short header";
    return false;
  }
  uint32_t magic = 0, len = 0;
  uint16_t version = 0, type = 0;
  std::memcpy(&magic, bytes.data(), 4);
  std::memcpy(&version, bytes.data() + 4, 2);
  std::memcpy(&type, bytes.data() + 6, 2);
  std::memcpy(&len, bytes.data() + 8, 4);
  if (magic != kMagic) {
    *error = "bad magic (not an xfer control connection)";
    return false;
  }
  if (version != kVersion) {
    *error =
        "protocol version " + std::to_string(version) + ", this engine speaks " + std::to_string(kVersion);
    return false;
  }
  if (type < static_cast<uint16_t>(MsgType::kHello) || type > static_cast<uint16_t>(kLastMsgType)) {
    *error = "unknown message type " + std::to_string(type);
    return false;
  }
  if (len > kMaxPayload) {
    *error = "payload of " + std::to_string(len) + " bytes exceeds the cap";
    return false;
  }
  out->type = static_cast<MsgType>(type);
  out->length = len;
  return true;
}

bool DecodePayload(MsgType type, std::span<const uint8_t> payload, Message* out, std::string* error) {
  switch (type) {
    case MsgType::kHello:
      return DecodeAs<Hello>(payload, out, error);
    case MsgType::kRegionAdd:
      return DecodeAs<RegionAdd>(payload, out, error);
    case MsgType::kRegionRemove:
      return DecodeAs<RegionRemove>(payload, out, error);
    case MsgType::kRegionRemoveAck:
      return DecodeAs<RegionRemoveAck>(payload, out, error);
    case MsgType::kSync:
      return DecodeAs<Sync>(payload, out, error);
    case MsgType::kSyncAck:
      return DecodeAs<SyncAck>(payload, out, error);
    case MsgType::kHeartbeat:
      return DecodeAs<Heartbeat>(payload, out, error);
    case MsgType::kGoodbye:
      return DecodeAs<Goodbye>(payload, out, error);
    case MsgType::kNotify:
      return DecodeAs<Notify>(payload, out, error);
    case MsgType::kNotifyAck:
      return DecodeAs<NotifyAck>(payload, out, error);
    case MsgType::kNotifyRingOffer:
      return DecodeAs<NotifyRingOffer>(payload, out, error);
    case MsgType::kNotifyBegin:
      return DecodeAs<NotifyBegin>(payload, out, error);
    case MsgType::kNotifyEnded:
      return DecodeAs<NotifyEnded>(payload, out, error);
    case MsgType::kDigest:
      return DecodeAs<Digest>(payload, out, error);
    case MsgType::kDigestAnswer:
      return DecodeAs<DigestAnswer>(payload, out, error);
    case MsgType::kDigestCancel:
      return DecodeAs<DigestCancel>(payload, out, error);
    case MsgType::kStageOpen:
      return DecodeAs<StageOpen>(payload, out, error);
    case MsgType::kStageOpened:
      return DecodeAs<StageOpened>(payload, out, error);
    case MsgType::kStageMove:
      return DecodeAs<StageMove>(payload, out, error);
    case MsgType::kStageMoved:
      return DecodeAs<StageMoved>(payload, out, error);
    case MsgType::kAuthChallenge:
      return DecodeAs<AuthChallenge>(payload, out, error);
    case MsgType::kAuthProof:
      return DecodeAs<AuthProof>(payload, out, error);
  }
  *error = "unknown message type";
  return false;
}

const char* MsgTypeName(MsgType type) {
  switch (type) {
    case MsgType::kHello:
      return "Hello";
    case MsgType::kRegionAdd:
      return "RegionAdd";
    case MsgType::kRegionRemove:
      return "RegionRemove";
    case MsgType::kRegionRemoveAck:
      return "RegionRemoveAck";
    case MsgType::kSync:
      return "Sync";
    case MsgType::kSyncAck:
      return "SyncAck";
    case MsgType::kHeartbeat:
      return "Heartbeat";
    case MsgType::kGoodbye:
      return "Goodbye";
    case MsgType::kNotify:
      return "Notify";
    case MsgType::kNotifyAck:
      return "NotifyAck";
    case MsgType::kNotifyRingOffer:
      return "NotifyRingOffer";
    case MsgType::kNotifyBegin:
      return "NotifyBegin";
    case MsgType::kNotifyEnded:
      return "NotifyEnded";
    case MsgType::kDigest:
      return "Digest";
    case MsgType::kDigestAnswer:
      return "DigestAnswer";
    case MsgType::kDigestCancel:
      return "DigestCancel";
    case MsgType::kStageOpen:
      return "StageOpen";
    case MsgType::kStageOpened:
      return "StageOpened";
    case MsgType::kStageMove:
      return "StageMove";
    case MsgType::kStageMoved:
      return "StageMoved";
    case MsgType::kAuthChallenge:
      return "AuthChallenge";
    case MsgType::kAuthProof:
      return "AuthProof";
  }
  return "Unknown";
}

}  // namespace xfer::wire
