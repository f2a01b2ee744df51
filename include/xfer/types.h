// Plain value types of the public API.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "xfer/status.h"

namespace xfer {

enum class MemType : uint8_t { kHost = 0, kCuda = 1 };
enum class Op : uint8_t { kRead = 0, kWrite = 1 };

// Handle of a registered local region. 0 is never a valid handle.
using MemHandle = uint64_t;
// Handle of an asynchronous request. 0 is never a valid handle.
using RequestHandle = uint64_t;
using ConnectHandle = uint64_t;  // Engine::ConnectAsync
// Handle of a prepared descriptor list (Engine::PrepareLocalList, PrepareRemoteList). 0 is
// never a valid handle.
using ListHandle = uint64_t;

// One contiguous piece of a transfer. WRITE copies [local_addr, +len) to the peer's
// [remote_addr, +len); READ copies the other way. A descriptor lies within one remote region.
struct TransferDesc {
  uint64_t local_addr = 0;
  uint64_t remote_addr = 0;
  uint64_t len = 0;
};

// An entry of a prepared list: [addr, addr+len) in this process (a local list) or in one of
// the peer's registered regions (a remote list).
struct MemRange {
  uint64_t addr = 0;
  uint64_t len = 0;
};

// A request over prepared lists: pair k moves the local list's entry local_index[k] to (WRITE)
// or from (READ) the remote list's entry remote_index[k]; the two entries must have the same
// length. The spans need to stay valid only for the call that takes them.
struct PreparedDescs {
  ListHandle local = 0;
  std::span<const uint32_t> local_index;
  ListHandle remote = 0;
  std::span<const uint32_t> remote_index;
};

// What a region's peers may do with it (Engine::RegisterMem, AllocOptions::access). Each
// registration grants its own access: where a read-only region and a read-write one overlap,
// peers may WRITE the bytes the read-write one covers.
enum class PeerAccess : uint8_t { kReadWrite = 0, kReadOnly = 1 };

// A region as a peer advertises it (see Engine::GetRemoteRegions).
struct RegionInfo {
  uint64_t addr = 0;
  uint64_t len = 0;
  MemType type = MemType::kHost;
  int32_t device = -1;  // device ordinal for kCuda, -1 for host memory
  std::string tag;      // free-form label given at registration
  bool shared = false;  // allocated by Engine::AllocMem: same-host peers map it (path "shm")
  PeerAccess access = PeerAccess::kReadWrite;  // kReadOnly: peers' WRITEs are refused
};

enum class RequestState : uint8_t { kWaiting, kCompleted, kFailed, kTimeout, kCanceled };

struct RequestStatus {
  RequestState state = RequestState::kWaiting;
  Status status;  // ok for kWaiting / kCompleted; the reason otherwise
  // When the request ended other than kCompleted: the indices (ascending) of the descriptors
  // whose bytes all landed (WRITE: in the peer's memory; READ: in local memory). Empty for
  // kWaiting, and for kCompleted (then every descriptor landed).
  std::vector<uint64_t> landed;
};

// What a transfer may carry besides its descriptors (Engine::TransferSync/TransferAsync).
struct TransferOptions {
  // A message for the peer, delivered (Engine::GetNotifies there) after every byte of the
  // request has landed; the request completes once the peer has queued it. At most
  // EngineOptions::notify.max_message_bytes. docs/notifications.md has the guarantees.
  std::optional<std::string> notify;
  // End-to-end checksums for this request (unset: EngineOptions::checksum): once its bytes
  // moved, each descriptor's bytes where they landed are checked against a checksum of where
  // they came from; a mismatch fails it with kDataCorrupted naming the descriptor (and a
  // notification then goes out as kFailed, with the descriptors that landed intact). Over shm
  // and cuda (and to this engine itself) both sides are compared as each batch lands; elsewhere
  // it costs a pass over the bytes on each side and one round trip. GPU memory is summed
  // through page-locked host buffers (a copy of its bytes to the host).
  std::optional<bool> checksum;
};

// How the request behind a notification ended. A target receives other than kCompleted only
// with EngineOptions::notify.outcomes (docs/notifications.md has the table).
enum class NotifyOutcome : uint8_t {
  kCompleted,  // every byte landed (and SendNotify's notifications)
  kFailed,     // the request failed (RequestState::kFailed)
  kTimedOut,   // its deadline passed (RequestState::kTimeout)
  kCanceled,   // the initiator canceled it (RequestState::kCanceled)
  // The session with the initiator ended first (it died, disconnected or finalized): queued
  // by this engine itself, with the message the initiator announced when the request began.
  kInitiatorLost,
};

// A notification as its target receives it.
struct Notification {
  std::string sender;               // the sender's name (PeerInfo::name)
  uint64_t sender_incarnation = 0;  // tells a restarted sender apart
  std::string message;
  NotifyOutcome outcome = NotifyOutcome::kCompleted;
  // Other than kCompleted: the indices (ascending) of the request's descriptors whose bytes
  // all landed, as the initiator's RequestStatus::landed. Empty for kCompleted (all landed)
  // and kInitiatorLost (unknown: treat the request's bytes as unknown).
  std::vector<uint64_t> landed;
};

// What the engine knows about a connected peer.
struct PeerInfo {
  std::string name;          // the peer's listen name, as it advertised itself
  uint64_t incarnation = 0;  // random per Initialize(): a restarted peer has a new one
  std::string host_id;       // same host id => same-host transports may be used
  int32_t pid = 0;
  // The transport chosen for this peer: its best route that is a link ("local", "cma", "ucx",
  // "tcp"), or when it has none, its best route ("shm" or "cuda" when forced); "none".
  std::string transport;
  bool outbound = false;  // true when this engine called Connect()
  // The backends that reach the peer, best first: each descriptor takes the first that moves
  // its pair of memories. Beside `transport`, e.g. "shm" (same host: the peer's AllocMem
  // memory is mapped here and moved with memcpy) or "cuda" (same host, GPUs on both sides:
  // the peer's GPU memory is opened here and moved by the copy engines).
  std::vector<std::string> routes;
  // Bytes this engine moved to or from the peer: one entry per route, by backend name, and
  // "staged" for bytes that passed through the buffer pool (and then a route).
  struct Moved {
    std::string path;
    uint64_t bytes = 0;
  };
  std::vector<Moved> moved;
  // tcp over several NICs (EngineOptions::tcp.nics): the bytes of `moved`'s "tcp" by pair of
  // NICs, each named "eth1 (10.0.1.1) -> 10.0.1.2:4100" (our NIC, its address). Empty over one.
  std::vector<Moved> nic_pairs;
  // The bytes of `moved`'s "staged" by the route that carried them from or to the staging
  // buffers ("tcp", "ucx"), routes that carried some only.
  std::vector<Moved> staged_via;

  bool Reaches(std::string_view backend) const {
    for (const auto& r : routes) {
      if (r == backend) return true;
    }
    return false;
  }
  uint64_t BytesVia(std::string_view path) const {
    for (const auto& m : moved) {
      if (m.path == path) return m.bytes;
    }
    return 0;
  }
};

// How a ConnectAsync is going (Engine::GetConnectStatus).
struct ConnectStatus {
  bool done = false;  // false: still connecting (or waiting for a connect thread)
  Status status;      // once done: what Connect returned
};

// An engine as the cluster's metadata service lists it (Engine::ListPeers; docs/cluster.md).
struct ClusterPeer {
  std::string name;               // its EngineOptions::cluster_name
  std::string address;            // where it listens (its PeerInfo::name): Connect takes either
  uint64_t incarnation = 0;       // random per start: tells a restarted engine apart
  std::string host_id;            // engines with the same host id share a host
  std::vector<std::string> tags;  // the tags of its registered regions, each once, sorted
};

struct AllocOptions {
  // Back the memory with huge pages (fewer TLB misses on large copies). When the kernel has
  // none to give, AllocMem falls back to normal pages and logs why.
  bool huge_pages = false;
  // MemType::kCuda: the device to allocate on; -1 = the calling thread's current device.
  int32_t device = -1;
  // What peers may do with the memory (this engine itself reads and writes it as it likes).
  PeerAccess access = PeerAccess::kReadWrite;
};

inline std::string_view MemTypeName(MemType t) { return t == MemType::kHost ? "host" : "cuda"; }
inline std::string_view PeerAccessName(PeerAccess a) {
  return a == PeerAccess::kReadOnly ? "read-only" : "read-write";
}
std::string_view OpName(Op op);
std::string_view RequestStateName(RequestState s);
std::string_view NotifyOutcomeName(NotifyOutcome o);  // "COMPLETED", "FAILED", ..., "INITIATOR_LOST"

}  // namespace xfer
