// Transport "ucx": one-sided put/get through UCX's UCP layer: RDMA on InfiniBand/RoCE
// clusters, and whatever UCX_TLS allows elsewhere (tcp, shared memory) for testing.
//
// Target side: one UCP worker with a progress thread (transports that emulate RMA, like tcp,
// need the target to progress); every registered region is mapped with ucp_mem_map and its
// packed remote key travels in the region table. Initiator side: per peer, a pipelined link
// (ucx_link.h) of `links` endpoints, each on a worker of its own (a queue pair / rail each): a
// batch is posted as non-blocking puts (then a flush) or gets, and ends once all of them
// completed: the data is in place at the target (WRITE) or here (READ). Many batches are in
// flight at once, driven by whichever thread waits for them.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "transport/backend.h"
#include "transport/link.h"

namespace xfer::transport {

struct UcxOptions {
  int links = 2;  // endpoints (each on its own worker) per peer
};

// The packed remote key of one peer region, as its region table advertises it.
struct UcxRemoteKey {
  uint64_t region_id = 0;      // unique per peer incarnation: a cache key
  std::string packed;          // ucp_rkey_pack output
  uint64_t addr = 0, len = 0;  // the region's extent (len 0: unknown; the key serves one range)
};

// How an initiator link reaches one peer.
struct UcxPeer {
  std::string worker_address;  // the peer's target worker (ucp_worker_get_address bytes)
  // The key of the peer region that holds [addr, addr+len); false when none does.
  // (write: the key of a region that grants WRITE, where one holds the range)
  std::function<bool(uint64_t addr, uint64_t len, bool write, UcxRemoteKey* key)> find_key;
  std::string name;  // for messages
};

// Local memory mapped with UCX; unmapped when destroyed.
class UcxMemory {
 public:
  virtual ~UcxMemory() = default;
  virtual const std::string& packed_key() const = 0;
};

// ucx's engine-wide side: the UCP context, the target worker peers put to and get from, and
// the links to peers.
class UcxTransport final {
 public:
  explicit UcxTransport(UcxOptions opts);
  ~UcxTransport();  // Stop()

  // Creates the UCP context (honouring UCX_TLS, UCX_NET_DEVICES, ...) and the target worker
  // with its progress thread. Fails with the reason when UCX cannot start or offers no
  // transport that can put/get, and with kUnsupported, what was tried and how to get UCX, when
  // no UCX loads at run time (ucx_library.h).
  Status Start();
  void Stop();
  // The target worker's address, advertised in the hello.
  const std::string& worker_address() const;
  // Whether the UCX this engine runs on registers GPU (CUDA) memory here (asked at Start).
  bool cuda_memory() const;

  // Maps [addr, addr+len) of this process for peers' get, and put unless remote_write is
  // false (the NIC then refuses puts where it enforces the key's access; UCX's tcp and
  // shared-memory transports do not). gpu: the range is GPU (CUDA) memory, which only a UCX
  // with cuda_memory() maps (refused otherwise, before UCX sees it).
  Status MapMemory(uint64_t addr, uint64_t len, std::unique_ptr<UcxMemory>* out, bool remote_write = true,
                   bool gpu = false);

  // Opens a link (endpoints are created on first use).
  Status Connect(const UcxPeer& peer, std::shared_ptr<Link>* link);

  // How requests are cut for ucx (the user's slice_bytes and batch_bytes over 1 MiB). One
  // thread drives the batches on an endpoint: more threads than endpoints only wait.
  PlanLimits Limits(const EngineOptions& o) const;

  // For xfer-info: UCX's version and library, and the transports and devices UCX would use
  // here, or why no UCX loads here; on a second line, what becomes of GPU memory to other hosts
  // (GpuVerdict). Both work whether UCX loads or not.
  static std::string Describe();
  // What becomes of GPU memory to other hosts with this UCX, for a person: direct through UCX,
  // or through the buffer pool and why ("UCX 1.13.1 has no CUDA memory support").
  static std::string GpuVerdict(bool cuda_memory);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace xfer::transport
