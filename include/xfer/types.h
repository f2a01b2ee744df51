// Plain value types of the public API.
#pragma once

#include <cstdint>
#include <string>

#include "xfer/status.h"

namespace xfer {

enum class MemType : uint8_t { kHost = 0, kCuda = 1 };
enum class Op : uint8_t { kRead = 0, kWrite = 1 };

// Handle of a registered local region. 0 is never a valid handle.
using MemHandle = uint64_t;
// Handle of an asynchronous request. 0 is never a valid handle.
using RequestHandle = uint64_t;

// One contiguous piece of a transfer. WRITE copies [local_addr, +len) to the peer's
// [remote_addr, +len); READ copies the other way. A descriptor lies within one remote region.
struct TransferDesc {
  uint64_t local_addr = 0;
  uint64_t remote_addr = 0;
  uint64_t len = 0;
};

// A region as a peer advertises it (see Engine::GetRemoteRegions).
struct RegionInfo {
  uint64_t addr = 0;
  uint64_t len = 0;
  MemType type = MemType::kHost;
  int32_t device = -1;  // device ordinal for kCuda, -1 for host memory
  std::string tag;      // free-form label given at registration
  bool shared = false;  // allocated by Engine::AllocMem: same-host peers map it (path "shm")
};

enum class RequestState : uint8_t { kWaiting, kCompleted, kFailed, kTimeout, kCanceled };

struct RequestStatus {
  RequestState state = RequestState::kWaiting;
  Status status;  // ok for kWaiting / kCompleted; the reason otherwise
};

// What the engine knows about a connected peer.
struct PeerInfo {
  std::string name;          // the peer's listen name, as it advertised itself
  uint64_t incarnation = 0;  // random per Initialize(): a restarted peer has a new one
  std::string host_id;       // same host id => same-host transports may be used
  int32_t pid = 0;
  std::string transport;     // transport chosen for this peer: "local", "cma", ...
  bool outbound = false;     // true when this engine called Connect()
  // Same host: the peer's AllocMem memory is mapped here and moved with memcpy ("shm"); its
  // other memory goes through `transport`.
  bool shm = false;
  // Same host, both sides with a GPU: the peer's GPU memory is opened here (CUDA IPC) and
  // moved by the copy engines ("cuda").
  bool cuda = false;
  uint64_t shm_bytes = 0;        // bytes this engine moved to or from the peer through shm
  uint64_t cuda_bytes = 0;       // ... through cuda
  uint64_t staged_bytes = 0;     // ... through the buffer pool (and then `transport`)
  uint64_t transport_bytes = 0;  // ... directly through `transport`
};

struct AllocOptions {
  // Back the memory with huge pages (fewer TLB misses on large copies). When the kernel has
  // none to give, AllocMem falls back to normal pages and logs why.
  bool huge_pages = false;
  // MemType::kCuda: the device to allocate on; -1 = the calling thread's current device.
  int32_t device = -1;
};

std::string_view MemTypeName(MemType t);
std::string_view OpName(Op op);
std::string_view RequestStateName(RequestState s);

}  // namespace xfer
