// The control-plane wire format: length-prefixed binary frames, little-endian.
//
//   header (12 bytes): magic u32 'XFR1' | version u16 | type u16 | payload length u32
//   payload: the message fields in order; strings and lists carry a u32 count first.
//
// Decoding never trusts a length or a count: each is checked against the bytes left (and
// against fixed caps) before anything is read or allocated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "transport/remote_region.h"
#include "xfer/types.h"

namespace xfer::wire {

inline constexpr uint32_t kMagic = 0x31524658;  // "XFR1" as little-endian bytes
inline constexpr uint16_t kVersion = 10;        // 10: Hello's features, NotifyBegin, NotifyEnded
inline constexpr size_t kHeaderSize = 12;
inline constexpr uint32_t kMaxPayload = 64u << 20;
inline constexpr uint32_t kMaxString = 64 << 10;  // UCX worker addresses can run to kilobytes
inline constexpr uint32_t kMaxTag = 4096;
inline constexpr uint32_t kMaxBlobs = 16;  // backends per hello or region record
// A decoded message takes at most this many bytes of memory per payload byte (plus the slack):
// a 64 MiB frame of tiny items cannot make the decoder allocate gigabytes.
inline constexpr uint64_t kDecodedBytesPerByte = 4;
inline constexpr uint64_t kDecodedBytesSlack = 64 << 10;
inline constexpr uint32_t kMaxNotify = 1u << 20;  // a notification's message

enum class MsgType : uint16_t {
  kHello = 1,            // first frame each way; the reply is the acceptor's own Hello
  kRegionAdd = 2,        // a region registered after the hello
  kRegionRemove = 3,     // the owner deregistered a region; the peer must stop using it
  kRegionRemoveAck = 4,  // the peer has stopped using it
  kSync = 5,             // asks the peer to answer SyncAck once it has read what came before
  kSyncAck = 6,
  kHeartbeat = 7,
  kGoodbye = 8,
  kNotify = 9,            // a notification for the peer's queue
  kNotifyAck = 10,        // the peer queued it (code ok) or why not
  kAuthChallenge = 11,    // authentication (a secret set): each side's nonce and identity
  kAuthProof = 12,        // the HMAC that proves the sender knows the secret
  kNotifyRingOffer = 13,  // same host: a ring for the sender's notifications (NotifyAck answers)
  kNotifyBegin = 14,      // a notified request begins toward the peer (not answered)
  kNotifyEnded = 15,      // ...and how it ended (NotifyAck answers)
  // (Only to a peer whose hello says kFeatureDigests: no version change.)
  kDigest = 16,  // the checksums of ranges of the peer's memory (DigestAnswer answers)
  kDigestAnswer = 17,
  // (Only to a peer whose hello says kFeatureDigestCancel: no version change.)
  kDigestCancel = 18,  // the answer to a Digest is no longer wanted (its request ended)
  // (Only to a peer whose hello says kFeatureTargetStaging: no version change.)
  kStageOpen = 19,    // asks the peer for staging slots of its own (StageOpened answers)
  kStageOpened = 20,  // ...its slots, as a region of its memory, or why not
  kStageMove = 21,    // copy between one of those slots and ranges of the peer's memory
  kStageMoved = 22,   // ...done, or why not
};
inline constexpr MsgType kLastMsgType = MsgType::kStageMoved;
inline constexpr uint32_t kMaxDigestRanges = 1u << 16;  // per Digest
inline constexpr uint32_t kMaxStageRanges = 1u << 12;   // per StageMove

// A registered region as its owner advertises it: what it is, and per backend what peers need
// to reach it (a UCX remote key, a CUDA IPC handle, a memfd's identity).
struct WireRegion {
  uint64_t id = 0;
  RegionInfo info;
  transport::Blobs blobs;
  bool operator==(const WireRegion& o) const {
    return id == o.id && info.addr == o.info.addr && info.len == o.info.len && info.type == o.info.type &&
           info.device == o.info.device && info.tag == o.info.tag && info.shared == o.info.shared &&
           info.access == o.info.access && blobs == o.blobs;
  }
};

// Hello::features: what the sender asks of its peers (bits it does not know are ignored).
inline constexpr uint32_t kFeatureNotifyOutcomes = 1;  // NotifyBegin and NotifyEnded (notify.outcomes)
inline constexpr uint32_t kFeatureDigests = 2;         // it answers Digest (its build has xxHash)
// It carries requests' beginnings and ends in notification rings (core/notify/ring_record.h).
inline constexpr uint32_t kFeatureRingEnds = 4;
inline constexpr uint32_t kFeatureDigestCancel = 8;  // it takes DigestCancel
// It stages its memory for a peer's one-sided route (StageOpen, StageMove: core/stage/).
inline constexpr uint32_t kFeatureTargetStaging = 16;
// It stages all its memory (its staging = always), standing in for GPU memory: one-sided routes
// reach it through its staging slots.
inline constexpr uint32_t kFeatureStagesAll = 32;
// It answers Digest for ranges of its GPU memory too (older builds refuse them).
inline constexpr uint32_t kFeatureGpuDigests = 64;

struct Hello {
  std::string name;  // the sender's listen name ("host" alone for a client-only engine)
  uint64_t incarnation = 0;
  std::string host_id;
  int32_t pid = 0;
  uint32_t features = 0;
  transport::Blobs backends;  // the backends the sender offers, best first, with their blobs
  std::vector<WireRegion> regions;
  bool operator==(const Hello&) const = default;
};
struct RegionAdd {
  WireRegion region;
  bool operator==(const RegionAdd&) const = default;
};
struct RegionRemove {
  uint64_t id = 0;
  uint64_t seq = 0;
  bool operator==(const RegionRemove&) const = default;
};
struct RegionRemoveAck {
  uint64_t id = 0;
  uint64_t seq = 0;
  bool operator==(const RegionRemoveAck&) const = default;
};
struct Sync {
  uint64_t seq = 0;
  bool operator==(const Sync&) const = default;
};
struct SyncAck {
  uint64_t seq = 0;
  bool operator==(const SyncAck&) const = default;
};
struct Heartbeat {
  bool operator==(const Heartbeat&) const = default;
};
// seq != 0 asks the peer to stop using our regions and answer SyncAck{seq} before it closes.
struct Goodbye {
  std::string reason;
  uint64_t seq = 0;
  bool operator==(const Goodbye&) const = default;
};

struct Notify {
  uint64_t seq = 0;
  std::string message;
  bool operator==(const Notify&) const = default;
};
// To a peer whose Hello asked for outcomes (kFeatureNotifyOutcomes), a notified request's
// notification comes in two parts: NotifyBegin with its message before the request's first
// byte moves (not answered: the request does not wait), and NotifyEnded{begin: the Begin's id}
// once it ended: outcome kCompleted, kFailed, kTimedOut or kCanceled; landed (not for
// kCompleted), strictly ascending, the descriptors that landed whole. The peer holds the
// message meanwhile, and queues it with kInitiatorLost itself when the session ends first. A
// Begin it refused (its queue full, a message too long) makes it answer the End with why.
struct NotifyBegin {
  uint64_t id = 0;  // the sender's, unique per session
  std::string message;
  bool operator==(const NotifyBegin&) const = default;
};
struct NotifyEnded {
  uint64_t seq = 0;
  uint64_t begin = 0;
  NotifyOutcome outcome = NotifyOutcome::kCompleted;
  std::vector<uint64_t> landed;
  bool operator==(const NotifyEnded&) const = default;
};
struct NotifyAck {
  uint64_t seq = 0;
  StatusCode code = StatusCode::kOk;
  std::string why;  // empty when ok
  bool operator==(const NotifyAck&) const = default;
};

// End-to-end checksums (TransferOptions::checksum): asks for the XXH3-64 checksum of each
// range of the receiver's registered memory. landed: the ranges are where a WRITE's bytes
// landed (else where a READ's came from). DigestAnswer{id} answers: ok with one checksum per
// range, or why not (a range not inside a region the sender may read, GPU memory, too many).
struct DigestRange {
  uint64_t addr = 0, len = 0;
  bool operator==(const DigestRange&) const = default;
};
struct Digest {
  uint64_t id = 0;  // the sender's, unique per session
  bool landed = false;
  std::vector<DigestRange> ranges;
  bool operator==(const Digest&) const = default;
};
struct DigestAnswer {
  uint64_t id = 0;
  StatusCode code = StatusCode::kOk;
  std::string why;                // empty when ok
  std::vector<uint64_t> digests;  // ok: one per range, in order; else empty
  bool operator==(const DigestAnswer&) const = default;
};
struct DigestCancel {
  uint64_t id = 0;  // the Digest's
  bool operator==(const DigestCancel&) const = default;
};

// Staging on the target's side over a one-sided route (docs/gpu.md, "Staging at the
// target"): StageOpen{id} asks the receiver for slots of its own memory, which it answers with
// StageOpened{id}: ok with `slots` slots of `slot_bytes` bytes one after the other in
// `region` (a region of its memory that only this session is told of, with its backends'
// blobs), or why not. StageMove{id} then asks it to copy between slot `slot` and `ranges` of
// its registered memory, in order and packed from the slot's start (write: out of the slot into
// the ranges, which the sender filled over its route first; else into the slot, which the sender
// reads over its route after StageMoved{id} said ok).
struct StageOpen {
  uint64_t id = 0;  // the sender's, unique per session
  bool operator==(const StageOpen&) const = default;
};
struct StageOpened {
  uint64_t id = 0;
  StatusCode code = StatusCode::kOk;
  std::string why;  // empty when ok
  WireRegion region;
  uint64_t slot_bytes = 0;
  uint32_t slots = 0;
  bool operator==(const StageOpened&) const = default;
};
struct StageMove {
  uint64_t id = 0;  // the sender's, unique per session
  bool write = false;
  uint32_t slot = 0;
  std::vector<DigestRange> ranges;
  bool operator==(const StageMove&) const = default;
};
struct StageMoved {
  uint64_t id = 0;
  StatusCode code = StatusCode::kOk;
  std::string why;  // empty when ok
  bool operator==(const StageMoved&) const = default;
};

// Same host: the sender's notifications to this peer can go into shared memory (a NotifyRing
// in the memfd that descriptor `fd` of the sender's process holds, named after the sender's
// incarnation and key; `bytes` long), none larger than max_message. NotifyAck{seq} answers.
struct NotifyRingOffer {
  uint64_t seq = 0;
  int32_t fd = -1;
  uint64_t key = 0;
  uint64_t bytes = 0;
  uint32_t max_message = 0;
  bool operator==(const NotifyRingOffer&) const = default;
};

// Authentication (control/auth.h has the exchange): each side's fresh nonce, then each side's
// identity with the HMAC that proves it knows the secret.
struct AuthChallenge {
  std::string nonce;  // kAuthNonceBytes fresh random bytes
  bool operator==(const AuthChallenge&) const = default;
};
struct AuthProof {
  std::string name;
  uint64_t incarnation = 0;
  // The initiator's: the address its connection reached ("ip:port", getpeername); the
  // acceptor checks it against its own end of the connection. Empty in the acceptor's.
  std::string dialled;
  std::string mac;  // kAuthMacBytes
  bool operator==(const AuthProof&) const = default;
};
inline constexpr uint32_t kAuthNonceBytes = 32;
inline constexpr uint32_t kAuthMacBytes = 32;
inline constexpr uint32_t kMaxAuthName = 1024;
// What an unauthenticated session may send in one frame (the auth frames are far smaller).
inline constexpr uint32_t kMaxPayloadBeforeAuth = 4096;

using Message =
    std::variant<Hello, RegionAdd, RegionRemove, RegionRemoveAck, Sync, SyncAck, Heartbeat, Goodbye, Notify,
                 NotifyAck, AuthChallenge, AuthProof, NotifyRingOffer, NotifyBegin, NotifyEnded, Digest,
                 DigestAnswer, DigestCancel, StageOpen, StageOpened, StageMove, StageMoved>;

struct Header {
  MsgType type{};
  uint32_t length = 0;
};

// A whole frame (header + payload) for one message.
std::vector<uint8_t> Encode(const Message& msg);
// Checks magic, version and length cap. On failure *error says why.
bool DecodeHeader(std::span<const uint8_t> bytes, Header* out, std::string* error);
// Decodes one payload of the given type; rejects trailing bytes.
bool DecodePayload(MsgType type, std::span<const uint8_t> payload, Message* out, std::string* error);

const char* MsgTypeName(MsgType type);

}  // namespace xfer::wire
