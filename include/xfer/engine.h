// xfer::Engine — the one public facade. Thread-safe: any thread may call any method
// concurrently, except Finalize() (and the destructor), which must not race other calls.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "xfer/metrics.h"
#include "xfer/options.h"
#include "xfer/status.h"
#include "xfer/types.h"
#include "xfer/version.h"

namespace xfer {

// A backend as an engine with these options would start it here: available, or not and why;
// and what it says of itself (what it moves, what it found: e.g. ucx's UCX and GPU support).
struct TransportState {
  std::string name;  // "shm", "cma", "tcp", "ucx", "cuda", "local"
  bool available = false;
  std::string why_not;  // when not available
  std::string about;    // may hold several lines
};
// Every backend of this build, best first. Starts them on loopback and stops them at once. Not
// ok when Initialize with these options would fail for want of a backend (e.g. a forced
// transport that is unavailable); `out` is filled either way.
Status DescribeTransports(const EngineOptions& options, std::vector<TransportState>* out);

class EngineImpl;

class Engine {
 public:
  Engine();
  ~Engine();  // calls Finalize()
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // local_name: "host:port" or "[v6]:port" to listen (port 0 picks a free port), or a host
  // alone for a client-only engine that cannot be connected to.
  Status Initialize(const std::string& local_name, const EngineOptions& options = {});
  // Stops threads, says goodbye to peers and fails outstanding requests with kCanceled.
  void Finalize();
  // The bound name, e.g. "127.0.0.1:41234" after Initialize("127.0.0.1:0").
  std::string LocalName() const;

  // Registers [addr, addr+len) so peers may READ it, and WRITE it unless access is
  // kReadOnly (their WRITEs then fail with kRemoteAccessDenied, nothing written). The same
  // range with the same access again returns the same handle (and needs one more
  // DeregisterMem). Peers see new regions without reconnecting.
  Status RegisterMem(void* addr, uint64_t len, MemType type, MemHandle* handle, const std::string& tag = "",
                     PeerAccess access = PeerAccess::kReadWrite);
  // Waits until connected peers have stopped using the region, then forgets it.
  Status DeregisterMem(MemHandle handle);
  // Allocates len bytes, zeroed, and registers them (as RegisterMem). kHost: a memfd that
  // peers on this host map into their own address space once, then READ and WRITE with memcpy:
  // no system call per transfer ("shm"); peers elsewhere see an ordinary region. kCuda: GPU
  // memory on options.device (-1: the calling thread's current device). Release it with
  // FreeMem (DeregisterMem refuses it).
  Status AllocMem(uint64_t len, MemType type, void** addr, MemHandle* handle, const std::string& tag = "",
                  const AllocOptions& options = {});
  // Deregisters the memory (waiting for peers, as DeregisterMem does), then unmaps it here.
  // Peers that still hold a mapping find the region gone: their transfers fail with
  // kRemoteAccessDenied.
  Status FreeMem(MemHandle handle);

  // remote (here and in every call that names a peer): its address ("host:port"), or, with
  // EngineOptions::metadata, its cluster name (looked up when it is not connected).
  Status Connect(const std::string& remote, std::chrono::milliseconds timeout);
  // Connect without waiting for it: it runs on the engine's connect threads (16 at most;
  // more connects wait their turn, their timeout running from this call) and *handle tells
  // how it went. One thread can so connect to many peers at once.
  Status ConnectAsync(const std::string& remote, std::chrono::milliseconds timeout, ConnectHandle* handle);
  // status->done once the connect ended, with what Connect returned; the handle is then
  // released. Connects still waiting for a thread at Finalize end with kCanceled.
  Status GetConnectStatus(ConnectHandle handle, ConnectStatus* status);
  Status Disconnect(const std::string& remote);
  Status GetPeerInfo(const std::string& remote, PeerInfo* info) const;
  // The peer's registered regions, current as of this call (one control round trip).
  Status GetRemoteRegions(const std::string& remote, std::vector<RegionInfo>* regions);
  // The engines that cluster metadata lists (EngineOptions::metadata), this one included:
  // those alive, or dead for less than their heartbeat timeout. From the first call on, a
  // watch keeps the list current, and calls answer from it without asking etcd (docs/
  // cluster.md). kInvalidArgument without metadata; kNotConnected when etcd cannot be reached;
  // kUnsupported with an HTTP metadata server (its protocol cannot list).
  Status ListPeers(std::vector<ClusterPeer>* peers);

  // The local buffers of a request must stay valid until it ends (sync: returns): the engine
  // reads or writes them until then (DeregisterMem waits only for the batches running at
  // that moment, not for whole requests).
  //
  // Moves every descriptor, or none is reported done: returns ok only when all data landed.
  // options.notify: a notification for the peer, delivered after the data
  // (docs/notifications.md). result, when given: how the request ended, with the descriptors
  // that landed when it failed (RequestStatus::landed).
  Status TransferSync(const std::string& remote, Op op, const std::vector<TransferDesc>& descs,
                      std::chrono::milliseconds timeout, const TransferOptions& options = {},
                      RequestStatus* result = nullptr);
  // Starts a request whose deadline is now + timeout. Validation errors return at once. A copy
  // of up to 64 KiB into or out of a same-host peer's AllocMem memory runs before it returns
  // (cheaper than handing it off): that request is already complete.
  Status TransferAsync(const std::string& remote, Op op, const std::vector<TransferDesc>& descs,
                       std::chrono::milliseconds timeout, RequestHandle* request);
  Status TransferAsync(const std::string& remote, Op op, const std::vector<TransferDesc>& descs,
                       std::chrono::milliseconds timeout, const TransferOptions& options,
                       RequestHandle* request);

  // Prepared lists (docs/prepared_lists.md): ranges checked once, then moved by index, with
  // no per-descriptor check or lookup in each request. A local list holds ranges of this
  // process (registered, or readable memory of it); a remote list holds ranges of one peer's
  // registered regions (remote: as in TransferSync) and is tied to that peer's session. A
  // refusal names the first bad entry: kInvalidArgument (malformed, or local memory this
  // process cannot read), kRemoteAccessDenied (outside the peer's regions). Local ranges must
  // stay mapped while the list is used, as a request's local buffers must.
  Status PrepareLocalList(const std::vector<MemRange>& ranges, ListHandle* list);
  Status PrepareRemoteList(const std::string& remote, const std::vector<MemRange>& ranges, ListHandle* list);
  // Forgets the list; requests already submitted over it run on.
  Status ReleaseList(ListHandle list);
  // TransferSync and TransferAsync over prepared lists: the same semantics, the descriptors
  // being the pairs of descs (RequestStatus::landed: indices of pairs).
  Status TransferSync(Op op, const PreparedDescs& descs, std::chrono::milliseconds timeout,
                      const TransferOptions& options = {}, RequestStatus* result = nullptr);
  Status TransferAsync(Op op, const PreparedDescs& descs, std::chrono::milliseconds timeout,
                       const TransferOptions& options, RequestHandle* request);

  // A terminal status (anything but kWaiting) is reported once; the handle is then released.
  Status GetTransferStatus(RequestHandle request, RequestStatus* status);
  // Waits up to timeout for the request to end. When it ended, returns its final status (ok
  // when completed) and releases the handle; when it is still running, returns kTimeout with
  // *status (if given) left at kWaiting, so a deadline expiry and a short wait differ.
  Status Wait(RequestHandle request, std::chrono::milliseconds timeout, RequestStatus* status = nullptr);
  // Stops a request: batches not yet started are dropped; its status becomes kCanceled once
  // those in flight finish (kCompleted if none was dropped and all of them succeeded: every
  // byte moved; but a checked request whose check still needs the peer's answer ends
  // kCanceled, kTimeout past its deadline, its bytes unchecked). Canceling a request that
  // already ended is ok and changes nothing.
  Status Cancel(RequestHandle request);

  // Notifications (docs/notifications.md). SendNotify returns ok once the peer has queued the
  // message; kTimeout when it did not confirm in time (the message may still arrive).
  Status SendNotify(const std::string& remote, const std::string& message, std::chrono::milliseconds timeout);
  // Moves every queued notification to the end of *out, oldest first (none: ok, nothing added).
  Status GetNotifies(std::vector<Notification>* out);
  // GetNotifies, once at least one is queued; kTimeout when none came within timeout.
  Status WaitNotifies(std::vector<Notification>* out, std::chrono::milliseconds timeout);

  // Metrics (docs/metrics.md): bytes, requests, durations, sessions, notifications, as of
  // now; after Finalize, as they were at the end. kInvalidArgument before Initialize.
  Status GetMetrics(MetricsSnapshot* out) const;
  // Where EngineOptions::metrics_listen serves them ("host:port" as bound), or "" when it
  // does not.
  std::string MetricsAddress() const;

 private:
  std::unique_ptr<EngineImpl> impl_;
};

}  // namespace xfer
