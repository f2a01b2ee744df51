// The backend interface: everything transport-specific lives behind it, one folder per backend
// under src/transport/, listed in priority order by src/transport/backends.cc (the only file
// that names them). The engine core talks to backends only through this header.
//
// A backend's life: CheckOptions, then Start (probe: usable here, or why not), then for the
// engine's lifetime: HelloBlob (what peers need to reach us), Allocate / PrepareRegion (what a
// registered region needs peers to know: an opaque per-region blob), Connect (a Route to one
// peer, built from the peer's blobs), Fence and DropPeer (target side); StopServing, then
// destruction, at Finalize. docs/backends.md has the full contract.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "transport/link.h"
#include "transport/remote_region.h"
#include "util/option_rows.h"
#include "xfer/options.h"
#include "xfer/status.h"
#include "xfer/types.h"

namespace xfer::transport {

// How a route cuts a request: descriptors longer than slice_bytes are cut, a batch carries at
// most batch_bytes in at most max_slices_per_batch slices.
struct PlanLimits {
  uint64_t slice_bytes = 1ull << 20;
  uint64_t batch_bytes = 4ull << 20;
  size_t max_slices_per_batch = 1024;
  // Runs (coalesced descriptors) at least this long go over the route's streaming link: copies
  // too large to stay in the caches (shm: non-temporal stores).
  uint64_t streaming_bytes = UINT64_MAX;
  size_t batches_in_flight = SIZE_MAX;  // worth running at once on this route
};

// The user's EngineOptions::slice_bytes and batch_bytes, where set, over a backend's defaults.
inline PlanLimits WithOverrides(PlanLimits defaults, const EngineOptions& o) {
  if (o.slice_bytes != 0) defaults.slice_bytes = o.slice_bytes;
  if (o.batch_bytes != 0) defaults.batch_bytes = o.batch_bytes;
  return defaults;
}

// The position of a backend's name in BackendNames() (below; 0 for a name not there).
int BackendIndex(std::string_view name);

// A backend's way to one peer. The planner asks each route of a peer, best first, whether it
// reaches a (local memory, remote region) pair; the batches of that pair then go over link().
class Route {
 public:
  Route(std::string_view backend, std::shared_ptr<Link> link, PlanLimits limits)
      : backend_(backend),
        index_(BackendIndex(backend)),
        link_(std::move(link)),
        streaming_(link_),
        limits_(limits) {}
  virtual ~Route() = default;
  Route(const Route&) = delete;
  Route& operator=(const Route&) = delete;

  // True when this route moves bytes between local memory of type `local` and region r. A
  // route that copies through a mapping of the region in this process (shm, cuda) sets *mapped
  // to where the region's first byte is addressable here (it maps it on first use); others
  // leave it null and batches carry the peer's own addresses. Cheap: asked per request.
  virtual bool Reach(MemType local, RemoteRegion& r, uint8_t** mapped) = 0;
  // Why Reach refused that pair, for a person ("cma: moves host memory only"); asked only
  // when no route reaches it.
  virtual std::string WhyNot(MemType local, const RemoteRegion& r) const = 0;
  // A single copy of len bytes into a mapping (Reach set *mapped) that the caller may run on
  // its own thread with memcpy, without planning a request: cheaper than a hand-off.
  virtual bool CopiesInline(uint64_t len) const { return false; }
  // Whether batches of local GPU memory may pass through a staging buffer to this route (and,
  // under staging = always, host memory): true for a link over a wire, false for copies
  // through a mapping, which reach GPU memory themselves or not at all.
  virtual bool Stageable() const { return true; }
  // Whether the peer's CPU takes no part in this route's batches (RDMA): memory of the peer's
  // that it cannot reach itself (GPU memory the peer's UCX does not register) is then reached
  // through the peer's staging slots, over this route (core/stage/bounce_route.h).
  virtual bool OneSided() const { return false; }

  std::string_view backend() const { return backend_; }
  int backend_index() const { return index_; }  // in BackendNames()
  Link& link() const { return *link_; }
  const std::shared_ptr<Link>& shared_link() const { return link_; }
  Link& streaming_link() const { return *streaming_; }
  const std::shared_ptr<Link>& shared_streaming_link() const { return streaming_; }
  const PlanLimits& limits() const { return limits_; }
  std::atomic<uint64_t>& bytes() { return bytes_; }                // moved directly over this route
  std::atomic<uint64_t>& staged_bytes() { return staged_bytes_; }  // ...through the buffer pool, then it

 protected:
  void set_streaming_link(std::shared_ptr<Link> l) { streaming_ = std::move(l); }
  // One slice that the plain link would take (what a mapping route copies inline).
  bool OneSlice(uint64_t len) const { return len <= limits_.slice_bytes && len < limits_.streaming_bytes; }

 private:
  const std::string_view backend_;
  const int index_;
  const std::shared_ptr<Link> link_;
  std::shared_ptr<Link> streaming_;
  const PlanLimits limits_;
  std::atomic<uint64_t> bytes_{0};
  std::atomic<uint64_t> staged_bytes_{0};
};

// A route over a link that moves host memory on both sides (local, cma).
class HostRoute : public Route {
 public:
  using Route::Route;
  bool Reach(MemType local, RemoteRegion& r, uint8_t**) override {
    return local == MemType::kHost && r.info.type == MemType::kHost;
  }
  std::string WhyNot(MemType, const RemoteRegion&) const override {
    return std::string(backend()) + ": moves host memory only";
  }
};

// How a target-side backend (tcp: its threads touch our memory for a peer) may touch a range.
struct TargetAccess {
  bool allowed = false;   // inside one registered region of this engine
  bool writable = false;  // ...inside one that peers may WRITE (not PeerAccess::kReadOnly)
  bool staged = false;    // through a staging buffer (GPU memory; or all memory, staging=always)
  bool device = false;    // GPU memory: copied by the copy engines
};

// This engine, as every backend sees it when it starts.
struct EngineContext {
  uint64_t incarnation = 0;
  std::string listen_host;  // where the control plane listens; data listeners bind here too
  const EngineOptions* options = nullptr;
  std::string forced;  // EngineOptions::transport: empty, or the one backend allowed
  // What a peer may do with a range of our memory; asked for every slice a peer names.
  std::function<TargetAccess(uint64_t addr, uint64_t len, bool write)> region_access;
  // True while an engine of that incarnation has a control session with us.
  std::function<bool(uint64_t incarnation)> is_peer;
  // With a secret: data connections must prove they know their peer's session key: one of
  // those peer_auth_keys gives for the live sessions of an incarnation (none when there is
  // none; two where one engine holds two sessions with us, each with its key).
  bool authenticate = false;
  std::function<std::vector<std::string>(uint64_t incarnation)> peer_auth_keys;
  uint64_t staging_bytes = 0;  // a target stages through buffers of this size; 0: staging off
};

// A peer, as its hello describes it, for a backend deciding whether and how it reaches it.
struct PeerContext {
  std::string name;
  uint64_t incarnation = 0;
  int32_t pid = 0;
  std::string host;      // the peer's address as this engine reaches it (control connection)
  std::string auth_key;  // the authenticated control session's key; "" without a secret
  // Same host identity (EngineOptions::host_id or the boot id), and the peer's pid seen to
  // hold its control connection here.
  bool same_host = false;
  bool same_process = false;
  int pidfd = -1;         // same_host: the peer process (dup it to keep it); else -1
  std::string_view blob;  // this backend's entry in the peer's hello
  // The peer's region holding [addr, addr+len), as last heard of, or null.
  // (write: one that grants WRITE where there is one)
  std::function<std::shared_ptr<RemoteRegion>(uint64_t addr, uint64_t len, bool write)> find_region;
};

// Something a backend holds for one local region (a mapping, an export, pinned pages, or the
// memory itself when it allocated it); released when the region goes.
class RegionResource {
 public:
  virtual ~RegionResource() = default;
};

// A RegionResource that owns an object (a mapping, an export) until the region goes.
template <class T>
class Owned final : public RegionResource {
 public:
  explicit Owned(std::unique_ptr<T> v) : v_(std::move(v)) {}

 private:
  const std::unique_ptr<T> v_;
};

// A RegionResource that calls release() when the region goes (unpin pages, free memory).
class OnRelease final : public RegionResource {
 public:
  explicit OnRelease(std::function<void()> release) : release_(std::move(release)) {}
  ~OnRelease() override { release_(); }

 private:
  const std::function<void()> release_;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  // This backend's options (the EngineOptions fields of its group), one row each: Initialize
  // checks their ranges, and every tool lists and sets them by name (util/option_rows.h).
  virtual std::vector<options::Row> Options() const { return {}; }
  // Refuses values of this backend's options beyond their rows' ranges (what this build or
  // the other options allow), with a reason, before anything starts.
  virtual Status CheckOptions(const EngineOptions&) const { return Status::Ok(); }
  // Probes and starts: ok when the backend can be offered to peers here, else why not (the
  // engine logs it; a forced backend that cannot start fails Initialize).
  virtual Status Start(const EngineContext& ctx) = 0;
  // For a person (xfer-info), started or not: what this backend moves here, and what it found
  // (versions, devices), one line each; asked of a backend that did not start too (below the
  // reason), so it must not depend on Start.
  virtual std::string About() const { return ""; }
  // What peers need to reach us (our entry in the hello), or nullopt when this backend serves
  // this engine alone (shm without pidfd_getfd still allocates memory); called after Start.
  virtual std::optional<std::string> HelloBlob() const { return std::string(); }

  // Whether memory of this type is this backend's to classify and allocate (GPU memory: cuda).
  virtual bool HandlesDeviceMemory() const { return false; }
  // True when p is memory this backend handles (device memory), with its type and device.
  virtual bool Classify(const void* p, MemType* type, int32_t* device) const { return false; }
  // Whether Allocate serves memory of this type (Engine::AllocMem asks the first that does).
  virtual bool Allocates(MemType type) const { return false; }
  // Allocates len zeroed bytes of a type it Allocates; *addr and *device describe the memory,
  // *res owns it.
  virtual Status Allocate(uint64_t len, MemType type, const AllocOptions& options, uint64_t* addr,
                          int32_t* device, std::unique_ptr<RegionResource>* res) {
    return {StatusCode::kUnsupported, std::string(name()) + " allocates no memory"};
  }
  // Prepares a region being registered: *blob (when set) travels to peers in the region's
  // record, *res is kept until the region goes. allocation: what Allocate returned, if the
  // memory came from AllocMem (of any backend), else null. An error refuses the registration;
  // a backend that merely cannot offer the region logs why and returns ok without a blob.
  virtual Status PrepareRegion(const RegionInfo& info, const RegionResource* allocation,
                               std::optional<std::string>* blob, std::unique_ptr<RegionResource>* res) {
    return Status::Ok();
  }

  // A route to a peer that offered this backend (its hello blob is in peer.blob), or why not.
  virtual Status Connect(const PeerContext& peer, std::shared_ptr<Route>* route) = 0;
  // Target side: waits until work that peers started through this backend before the call has
  // finished; checks made after it see the registry as it is now. Work still running at the
  // deadline is cut short (its peer's connection closed) and waited for.
  virtual void Fence(Clock::time_point deadline) {}
  // The peer of that incarnation is gone: drop what serves it (its data connections).
  virtual void DropPeer(uint64_t incarnation) {}
  // Finalize: stop serving peers (threads that touch our memory), before the regions'
  // resources are released. The backend is destroyed after them.
  virtual void StopServing() {}
};

using BackendFactory = std::unique_ptr<Backend> (*)();

// The backends compiled into this build, best first (src/transport/backends.cc).
std::vector<std::unique_ptr<Backend>> MakeBackends();
// Their names, in the same order.
const std::vector<std::string>& BackendNames();

}  // namespace xfer::transport
