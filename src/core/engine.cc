// The public facade, engine lifetime, memory registration and the data path.
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>

#include "core/engine_impl.h"
#include "util/host.h"
#include "util/log.h"
#include "util/text.h"

namespace xfer {

// ---------------------------------------------------------------- facade
Engine::Engine() : impl_(std::make_unique<EngineImpl>()) {}
Engine::~Engine() = default;
Status Engine::Initialize(const std::string& n, const EngineOptions& o) { return impl_->Initialize(n, o); }
void Engine::Finalize() { impl_->Finalize(); }
std::string Engine::LocalName() const { return impl_->LocalName(); }
Status Engine::RegisterMem(void* a, uint64_t l, MemType t, MemHandle* h, const std::string& tag) {
  return impl_->RegisterMem(a, l, t, h, tag);
}
Status Engine::DeregisterMem(MemHandle h) { return impl_->DeregisterMem(h); }
Status Engine::AllocMem(uint64_t l, MemType t, void** a, MemHandle* h, const std::string& tag,
                        const AllocOptions& o) {
  return impl_->AllocMem(l, t, a, h, tag, o);
}
Status Engine::FreeMem(MemHandle h) { return impl_->FreeMem(h); }
Status Engine::Connect(const std::string& r, std::chrono::milliseconds t) { return impl_->Connect(r, t); }
Status Engine::Disconnect(const std::string& r) { return impl_->Disconnect(r); }
Status Engine::GetPeerInfo(const std::string& r, PeerInfo* i) const { return impl_->GetPeerInfo(r, i); }
Status Engine::GetRemoteRegions(const std::string& r, std::vector<RegionInfo>* v) {
  return impl_->GetRemoteRegions(r, v);
}
Status Engine::TransferSync(const std::string& r, Op op, const std::vector<TransferDesc>& d,
                            std::chrono::milliseconds t) {
  return impl_->TransferSync(r, op, d, t);
}
Status Engine::TransferAsync(const std::string& r, Op op, const std::vector<TransferDesc>& d,
                             std::chrono::milliseconds t, RequestHandle* h) {
  return impl_->TransferAsync(r, op, d, t, h);
}
Status Engine::GetTransferStatus(RequestHandle h, RequestStatus* s) { return impl_->GetTransferStatus(h, s); }
Status Engine::Wait(RequestHandle h, std::chrono::milliseconds t, RequestStatus* s) { return impl_->Wait(h, t, s); }
Status Engine::Cancel(RequestHandle h) { return impl_->Cancel(h); }

// ---------------------------------------------------------------- lifetime
Status EngineImpl::CheckRunning(const char* what) const {
  if (running_.load()) return Status::Ok();
  return {StatusCode::kInvalidArgument, std::string(what) + ": engine is not initialized (or finalized)"};
}

Status EngineImpl::Initialize(const std::string& local_name, const EngineOptions& options) {
  if (running_.load()) return {StatusCode::kInvalidArgument, "Initialize: already initialized"};
  if (finalized_) {
    return {StatusCode::kInvalidArgument, "Initialize: this engine was finalized; create a new one"};
  }
  if (options.streams < 1 || options.streams > 256) {
    return {StatusCode::kInvalidArgument, "Initialize: streams must be 1..256"};
  }
  if (options.heartbeat_interval.count() <= 0 || options.heartbeat_timeout <= options.heartbeat_interval) {
    return {StatusCode::kInvalidArgument,
            "Initialize: heartbeat_interval must be > 0 and below heartbeat_timeout"};
  }
  if (options.spin.count() < 0) return {StatusCode::kInvalidArgument, "Initialize: spin must be >= 0"};
  if (options.ucx != "auto" && options.ucx != "on" && options.ucx != "off") {
    return {StatusCode::kInvalidArgument,
            "Initialize: ucx must be auto, on or off (not '" + options.ucx + "')"};
  }
  if (options.transport == "ucx" && options.ucx == "off") {
    return {StatusCode::kInvalidArgument, "Initialize: transport 'ucx' forced but ucx is off"};
  }
  if (!options.transport.empty() &&
      std::find(std::begin(kTransportNames), std::end(kTransportNames), options.transport) ==
          std::end(kTransportNames)) {
    return {StatusCode::kInvalidArgument, "Initialize: unknown transport '" + options.transport +
                                              "' (this build has: local, shm, cuda, cma, ucx, tcp)"};
  }
  if (options.staging != "auto" && options.staging != "always" && options.staging != "off") {
    return {StatusCode::kInvalidArgument,
            "Initialize: staging must be auto, always or off (not '" + options.staging + "')"};
  }
  if (options.staging_buffers < 1 || options.staging_buffers > 64) {
    return {StatusCode::kInvalidArgument, "Initialize: staging_buffers must be 1..64"};
  }
  if (options.staging_buffer_bytes < (64 << 10) || options.staging_buffer_bytes > (1ull << 30)) {
    return {StatusCode::kInvalidArgument, "Initialize: staging_buffer_bytes must be 64 KiB..1 GiB"};
  }
  if (options.links < 1 || options.links > 64) {
    return {StatusCode::kInvalidArgument, "Initialize: links must be 1..64"};
  }
  net::Address addr;
  Status s = net::ParseAddress(local_name, &addr);
  if (!s.ok()) {
    XLOG(WARN) << "Initialize: " << s.ToString();
    return s;
  }
  opts_ = options;
  net::Fd listener;
  if (addr.has_port) {
    net::Address bound;
    s = net::Listen(addr, &listener, &bound);
    if (!s.ok()) {
      XLOG(WARN) << "Initialize: cannot listen on " << local_name << ": " << s.message();
      return s;
    }
    addr = bound;
  }
  name_ = addr.ToString();
  incarnation_ = host::RandomU64();
  cma_cookie_ = incarnation_;
  host_id_ = options.host_id.empty() ? host::BootId() : options.host_id;

  std::string why;
  cma_ok_ = transport::CmaTransport::Available(&why);
  if (!cma_ok_) XLOG(WARN) << "cma transport not offered: " << why;
  shm_ok_ = transport::shm::Available(&why);
  shm_limits_ = ShmLimits();
  if (!shm_ok_) XLOG(WARN) << "shm not offered (peers' AllocMem memory goes through cma): " << why;
  cuda_ok_ = transport::cuda::Available(&cuda_off_);
  if (opts_.transport == "cuda" && !cuda_ok_) {
    return {StatusCode::kUnsupported, "Initialize: transport 'cuda' forced, but " + cuda_off_};
  }
  if (opts_.staging != "off") {
    staging_ = std::make_shared<BufferPool>(opts_.staging_buffers, opts_.staging_buffer_bytes);
  }
  // Under Yama ptrace_scope=1 a peer may attach to us only if we say so.
  ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);

  self_ = std::make_shared<PeerState>();
  self_->info = PeerInfo{name_, incarnation_, host_id_, static_cast<int32_t>(::getpid()), "local", false};
  transport::PeerEndpoint me{static_cast<int32_t>(::getpid()), incarnation_, 0, "", 0};
  s = local_.Connect(me, &self_->link);
  if (!s.ok()) return s;
  self_->paths.link_limits = LimitsFor(local_);
  self_->same_process = true;
  self_->cuda = cuda_ok_;
  SetPaths(self_.get());

  transport::TcpTargetHooks hooks;
  hooks.incarnation = incarnation_;
  // (Asked once per slice of every batch a peer sends: the option's text is read here, once.)
  const bool stage_all = opts_.staging == "always";
  hooks.region_access = [this, stage_all](uint64_t a, uint64_t l) {
    transport::TcpTargetAccess access;
    if (auto t = registry_.TypeOf(a, l)) {
      access.allowed = true;
      access.device = *t == MemType::kCuda;
      access.staged = access.device || stage_all;
    }
    return access;
  };
  hooks.staging_bytes = staging_ ? opts_.staging_buffer_bytes : 0;
  hooks.is_peer = [this](uint64_t inc) { return IsPeer(inc); };
  tcp_ = std::make_unique<transport::TcpTransport>(
      transport::TcpOptions{opts_.links, opts_.least_loaded_links, opts_.heartbeat_timeout, opts_.spin},
      hooks);
  if (Status ts = tcp_->Start(addr.host); !ts.ok()) {
    XLOG(WARN) << "tcp transport not offered: cannot listen on " << addr.host << ": " << ts.message();
    tcp_.reset();
  }

  const bool want_ucx =
      opts_.transport == "ucx" ||
      (opts_.transport.empty() &&
       (opts_.ucx == "on" || (opts_.ucx == "auto" && !host::RdmaDevices().empty())));
  ucx_off_ = opts_.ucx == "off"   ? "ucx is off here (EngineOptions::ucx)"
             : !want_ucx          ? "ucx is off here (no RDMA device; EngineOptions::ucx = on offers it)"
                                  : "";
  if (want_ucx) {
    ucx_ = std::make_unique<transport::UcxTransport>(transport::UcxOptions{opts_.links});
    if (Status us = ucx_->Start(); !us.ok()) {
      ucx_off_ = "ucx could not start here: " + us.message();
      // Forced: the user asked for it. Otherwise tcp serves other hosts; say so quietly.
      if (opts_.transport == "ucx") {
        XLOG(WARN) << "ucx transport not offered: " << us.message();
      } else {
        XLOG(INFO) << "ucx transport not offered: " << us.message();
      }
      ucx_.reset();
    }
  }

  pool_ = std::make_unique<StreamPool>(opts_.streams, opts_.spin);
  loop_ = std::make_unique<control::ControlLoop>(
      std::move(listener), this,
      control::LoopOptions{opts_.heartbeat_interval, opts_.heartbeat_timeout});
  s = loop_->Start();
  if (!s.ok()) return s;
  running_.store(true);
  XLOG(INFO) << "engine " << name_ << " up (incarnation " << std::hex << incarnation_ << std::dec
             << ", " << opts_.streams << " streams, cma " << (cma_ok_ ? "on" : "off") << ", tcp "
             << (tcp_ ? "port " + std::to_string(tcp_->port()) : std::string("off")) << ", ucx "
             << (ucx_ ? "on" : "off") << ", cuda " << (cuda_ok_ ? "on" : "off") << ", staging "
             << opts_.staging << ")";
  return Status::Ok();
}

void EngineImpl::Finalize() {
  if (!running_.exchange(false)) return;
  finalized_ = true;
  std::vector<std::shared_ptr<control::Session>> sessions;
  {
    std::lock_guard lock(subscribers_mu_);
    sessions.assign(subscribers_.begin(), subscribers_.end());
  }
  // Peers stop using our memory before Finalize returns (the application may free it next).
  SayGoodbye(sessions, "engine finalized");
  loop_->Stop();  // closes every session; OnClosed drops their state
  {
    std::lock_guard lock(requests_mu_);
    for (auto& [h, r] : requests_) r->Cancel();
  }
  pool_->Stop();  // runs what is queued: canceled batches end at once
  if (tcp_) tcp_->Stop();
  {
    std::lock_guard lock(requests_mu_);
    requests_.clear();
  }
  std::map<MemHandle, std::unique_ptr<RegionResources>> released;
  {
    std::lock_guard lock(subscribers_mu_);
    released.swap(resources_);
  }
  released.clear();  // peers were told goodbye: none uses the memory any more
  if (ucx_) ucx_->Stop();
}

// ---------------------------------------------------------------- memory
EngineImpl::RegionResources::~RegionResources() {
  ucx.reset();          // the mappings go before the memory they describe
  cuda_export.reset();
  if (device_memory != nullptr) transport::cuda::FreeDevice(device_memory);
  if (pinned != nullptr) transport::cuda::UnpinHost(pinned);
}

Status EngineImpl::RegisterMem(void* addr, uint64_t len, MemType type, MemHandle* handle,
                               const std::string& tag) {
  Status s = CheckRunning("RegisterMem");
  if (s.ok() && handle == nullptr) s = {StatusCode::kInvalidArgument, "RegisterMem: null handle pointer"};
  MemType actual = MemType::kHost;
  int32_t device = -1;
  if (s.ok()) transport::cuda::Classify(addr, &actual, &device);
  if (s.ok() && type == MemType::kCuda && !cuda_ok_) {
    s = {StatusCode::kUnsupported, "RegisterMem: GPU memory needs CUDA here: " + cuda_off_};
  } else if (s.ok() && type != actual) {
    s = {StatusCode::kInvalidArgument,
         "RegisterMem: " + text::Hex(reinterpret_cast<uint64_t>(addr)) + " is " +
             (actual == MemType::kCuda ? "GPU memory (device " + std::to_string(device) +
                                             "): register it as MemType::kCuda"
                                       : std::string("not GPU memory, but was registered as "
                                                     "MemType::kCuda"))};
  }
  if (!s.ok()) {
    XLOG(WARN) << s.ToString();
    return s;
  }
  wire::WireRegion r;
  r.info = RegionInfo{reinterpret_cast<uint64_t>(addr), len, type, device, tag, false};
  return AddRegion(std::move(r), false, std::make_unique<RegionResources>(), handle);
}

Status EngineImpl::AddRegion(wire::WireRegion region, bool allocated,
                             std::unique_ptr<RegionResources> res, MemHandle* handle) {
  const uint64_t addr = region.info.addr, len = region.info.len;
  // What peers need to reach the memory, prepared before the lock (pinning pages is slow
  // for large regions) and dropped again if the range was registered already.
  // Peers put/get over ucx only through a UCX mapping and its remote key. (GPU memory is not
  // offered to UCX: Debian's UCX has no CUDA support, and tcp serves it to other hosts.)
  if (ucx_ && region.info.type == MemType::kHost) {
    if (Status us = ucx_->MapMemory(addr, len, &res->ucx); !us.ok()) {
      XLOG(WARN) << "memory at " << addr << " (" << len << " bytes) is not reachable through ucx: "
                 << us.ToString();
    }
  }
  if (region.info.type == MemType::kCuda) {  // same-host peers open it with CUDA IPC
    Status cs = transport::cuda::Export::Create(addr, len, &res->cuda_export);
    if (cs.ok()) {
      region.cuda_handle = res->cuda_export->blob();
    } else if (cs.code() == StatusCode::kInvalidArgument) {  // e.g. past the allocation's end
      XLOG(WARN) << "RegisterMem: " << cs.ToString();
      return {cs.code(), "RegisterMem: " + cs.message()};
    } else {
      XLOG(WARN) << "GPU memory at " << text::Hex(addr)
                 << " cannot be opened by peers on this host (only peers that reach it over "
                    "tcp can use it): " << cs.ToString();
    }
  } else if (cuda_ok_ && opts_.pin_host_memory) {  // H2D and D2H copies at the link's speed
    if (Status ps = transport::cuda::PinHost(reinterpret_cast<void*>(addr), len); ps.ok()) {
      res->pinned = reinterpret_cast<void*>(addr);
    } else {
      XLOG(INFO) << "host memory at " << text::Hex(addr) << " stays pageable: " << ps.ToString();
    }
  }
  std::lock_guard lock(subscribers_mu_);
  bool added = false;
  Status s = registry_.Add(region, allocated, handle, &added);
  if (!s.ok()) {
    XLOG(WARN) << s.ToString();
    return s;
  }
  if (added) {
    if (res->ucx) registry_.SetUcxKey(*handle, res->ucx->packed_key());
    resources_[*handle] = std::move(res);
    wire::WireRegion r;
    registry_.Lookup(*handle, &r);
    self_->regions.Add(r);
    for (auto& sub : subscribers_) {
      Status st = sub->Send(wire::RegionAdd{r}, opts_.heartbeat_timeout);
      if (!st.ok()) sub->Shutdown("cannot send region update: " + st.ToString());
    }
  }
  return Status::Ok();
}

Status EngineImpl::AllocMem(uint64_t len, MemType type, void** addr, MemHandle* handle,
                            const std::string& tag, const AllocOptions& options) {
  Status s = CheckRunning("AllocMem");
  if (s.ok() && (addr == nullptr || handle == nullptr)) {
    s = {StatusCode::kInvalidArgument, "AllocMem: null address or handle pointer"};
  }
  if (s.ok() && len == 0) s = {StatusCode::kInvalidArgument, "AllocMem: zero length"};
  if (s.ok() && type == MemType::kCuda && !cuda_ok_) {
    s = {StatusCode::kUnsupported, "AllocMem: GPU memory needs CUDA here: " + cuda_off_};
  }
  auto res = std::make_unique<RegionResources>();
  wire::WireRegion r;
  r.info = RegionInfo{0, len, type, -1, tag, false};
  if (s.ok() && type == MemType::kCuda) {
    s = transport::cuda::AllocDevice(len, options.device, &res->device_memory);
    if (s.ok()) {
      r.info.addr = reinterpret_cast<uint64_t>(res->device_memory);
      MemType t;
      transport::cuda::Classify(res->device_memory, &t, &r.info.device);
    }
  } else if (s.ok()) {
    r.shm_key = next_segment_key_.fetch_add(1);
    s = transport::shm::Segment::Create(len, options.huge_pages,
                                        transport::shm::SegmentName(incarnation_, r.shm_key),
                                        &res->segment);
    if (s.ok()) {
      r.info.addr = reinterpret_cast<uint64_t>(res->segment->data());
      r.info.shared = true;
      r.shm_fd = res->segment->fd();
    }
  }
  if (s.ok()) {
    const uint64_t at = r.info.addr;
    s = AddRegion(std::move(r), true, std::move(res), handle);
    if (s.ok()) *addr = reinterpret_cast<void*>(at);
  }
  if (!s.ok()) XLOG(WARN) << s.ToString();
  return s;
}

Status EngineImpl::FreeMem(MemHandle handle) { return DeregisterMem(handle, true); }

Status EngineImpl::DeregisterMem(MemHandle handle, bool free) {
  Status s = CheckRunning(free ? "FreeMem" : "DeregisterMem");
  if (!s.ok()) return s;
  std::vector<std::pair<std::shared_ptr<control::Session>, uint64_t>> pending;
  {
    std::lock_guard lock(subscribers_mu_);
    bool removed = false;
    s = registry_.Remove(handle, &removed, free);
    if (!s.ok()) {
      XLOG(WARN) << s.ToString();
      return s;
    }
    if (!removed) return Status::Ok();  // still referenced by another RegisterMem
    self_->regions.Revoke(handle);
    for (auto& sub : subscribers_) {
      uint64_t seq = sub->NextSeq();
      if (sub->Send(wire::RegionRemove{handle, seq}, opts_.heartbeat_timeout).ok()) {
        pending.emplace_back(sub, seq);
      }
    }
  }
  FenceBatches(nullptr);      // our own transfers from or into the region have finished
  if (tcp_) tcp_->Fence();    // and so have peers' tcp batches that our threads execute
  // Each peer acknowledges once its batches touching the region have finished. A peer that
  // cannot say so in time is cut off: it must not keep writing into memory we give back.
  auto deadline = DeadlineAfter(opts_.heartbeat_timeout);
  for (auto& [sub, seq] : pending) {
    if (!sub->WaitAcked(seq, deadline) && !sub->closed()) {
      XLOG(WARN) << "peer " << sub->peer_key << " did not confirm deregistration of region "
                 << handle << " in time; closing its session";
      sub->Shutdown("did not confirm a deregistration in time");
    }
  }
  std::unique_ptr<RegionResources> released;  // released after the lock: no peer uses them now
  std::lock_guard lock(subscribers_mu_);
  if (auto it = resources_.find(handle); it != resources_.end()) {
    released = std::move(it->second);
    resources_.erase(it);
  }
  return Status::Ok();
}

// ---------------------------------------------------------------- data path
bool EngineImpl::LookupPeer(const std::string& remote, Peer* peer) {
  if (remote == name_) {
    *peer = Peer{nullptr, self_};
    return true;
  }
  std::lock_guard lock(peers_mu_);
  auto it = peers_.find(remote);
  if (it == peers_.end()) return false;
  *peer = it->second;
  return true;
}

Status EngineImpl::FindPeer(const std::string& remote, Peer* peer) {
  if (LookupPeer(remote, peer)) return Status::Ok();
  if (!opts_.auto_connect) {
    return {StatusCode::kNotConnected, "not connected to '" + remote +
                                           "' (call Connect first, or set auto_connect)"};
  }
  Status s = Connect(remote, opts_.auto_connect_timeout);
  if (!s.ok() && s.code() != StatusCode::kAlreadyConnected) {
    return {StatusCode::kNotConnected, "auto-connect to '" + remote + "' failed: " + s.ToString()};
  }
  if (!LookupPeer(remote, peer)) return {StatusCode::kConnectionLost, "peer '" + remote + "' went away"};
  return Status::Ok();
}

uint8_t* EngineImpl::MapRegion(PeerState& peer, RemoteRegion& region) {
  std::lock_guard lock(region.map_mu);
  if (!region.map_tried) {
    region.map_tried = true;
    Status s = peer.mapper->Map(region.shm_fd,
                                transport::shm::SegmentName(peer.info.incarnation, region.shm_key),
                                region.info.len, &region.map);
    if (!s.ok()) {
      XLOG(WARN) << "cannot map region " << region.id << " of peer " << peer.info.name
                 << " (its transfers take the peer's transport): " << s.ToString();
    }
  }
  return region.map ? region.map->base() : nullptr;
}

uint8_t* EngineImpl::OpenForCuda(PeerState& peer, RemoteRegion& region) {
  if (peer.same_process) return reinterpret_cast<uint8_t*>(region.info.addr);
  if (region.info.type == MemType::kHost) {
    return peer.mapper && region.shm_key != 0 ? MapRegion(peer, region) : nullptr;
  }
  std::lock_guard lock(region.map_mu);
  if (!region.cuda_tried && !region.revoked.load()) {
    region.cuda_tried = true;
    Status s = region.cuda_handle.empty()
                   ? Status{StatusCode::kUnsupported, "the peer could not export it"}
                   : transport::cuda::Open(
                         region.cuda_handle, region.info.len,
                         [&peer](int32_t remote_fd, int* fd) {
                           return peer.mapper ? peer.mapper->TakeFd(remote_fd, fd)
                                              : Status{StatusCode::kUnsupported,
                                                       "cannot take descriptors from the peer"};
                         },
                         &region.cuda_map);
    if (!s.ok()) {
      XLOG(WARN) << "cannot open GPU region " << region.id << " of peer " << peer.info.name
                 << " (its transfers take the peer's transport, when it reaches GPU memory): "
                 << s.ToString();
    }
  }
  return region.cuda_map ? region.cuda_map->base() : nullptr;
}

void EngineImpl::SetPaths(PeerState* st) const {
  PeerPaths& p = st->paths;
  p.link = st->link != nullptr;
  if (st->mapper && opts_.transport != "cuda") {
    p.shm_base = [st](RemoteRegion& r) { return MapRegion(*st, r); };
    p.shm_limits = shm_limits_;
  }
  if (st->cuda) {
    p.cuda_base = [st](RemoteRegion& r) { return OpenForCuda(*st, r); };
    // One stream's copies run one after another, so pieces only need to be large enough to
    // hide a hand-off between streams (an H2D copy of 4 MiB takes ~80 us), and batches of
    // small ones amortize the wait for their completion.
    p.cuda_limits = {opts_.slice_bytes ? opts_.slice_bytes : 4ull << 20,
                     opts_.batch_bytes ? opts_.batch_bytes : 16ull << 20, 4096};
  }
  if (st->gpu_link) {
    p.gpu_link = true;
    p.gpu_link_limits = LimitsFor(*tcp_);
  }
  st->staging = st->link ? staging_ : nullptr;
  p.staging = st->staging != nullptr;
  p.stage_all = opts_.staging == "always";
  p.staging_bytes = opts_.staging_buffer_bytes;
}

Status EngineImpl::Submit(const std::string& remote, Op op, const std::vector<TransferDesc>& descs,
                          std::chrono::milliseconds timeout, bool track,
                          std::shared_ptr<Request>* out) {
  Status s = CheckRunning("Transfer");
  Peer peer;
  if (s.ok() && descs.empty()) s = {StatusCode::kInvalidArgument, "no descriptors"};
  if (s.ok() && op != Op::kRead && op != Op::kWrite) s = {StatusCode::kInvalidArgument, "unknown op"};
  if (s.ok()) s = FindPeer(remote, &peer);
  if (s.ok() && !peer.state->alive.load()) {
    s = {StatusCode::kConnectionLost, "peer '" + remote + "' is gone"};
  }
  if (s.ok() && !peer.state->Reachable()) {
    s = {StatusCode::kUnsupported, "no transport of this engine reaches peer '" + remote + "'"};
  }
  Plan plan;
  if (s.ok()) {
    LocalMemoryCheck local(registry_);
    s = MakePlan(op, descs, peer.state->regions, local, peer.state->paths, &plan);
    // The peer may have registered the region a moment ago: catch up with its updates once.
    if (s.code() == StatusCode::kRemoteAccessDenied && peer.session) {
      const auto sync_deadline = DeadlineAfter(std::min(timeout, opts_.heartbeat_timeout));
      if (SyncWith(peer.session, sync_deadline)) {
        s = MakePlan(op, descs, peer.state->regions, local, peer.state->paths, &plan);
      } else if (!peer.state->alive.load() || peer.session->closed()) {
        s = {StatusCode::kConnectionLost, "peer '" + remote + "' went away"};
      } else if (timeout < opts_.heartbeat_timeout && Clock::now() >= sync_deadline) {
        s = {StatusCode::kTimeout, "the deadline passed while catching up with the peer's region "
                                   "updates (as last known: " + s.message() + ")"};
      }
    }
  }
  if (!s.ok()) {
    XLOG(WARN) << OpName(op) << " to '" << remote << "' refused: " << s.ToString();
    return s;
  }
  RequestHandle id = next_request_.fetch_add(1);
  *out = std::make_shared<Request>(id, op, DeadlineAfter(timeout), peer.state, std::move(plan));
  if (track) Track(*out);
  return Status::Ok();
}

void EngineImpl::Track(const std::shared_ptr<Request>& req) {
  std::lock_guard lock(requests_mu_);
  requests_.emplace(req->id(), req);
}

void EngineImpl::Dispatch(const std::shared_ptr<Request>& req, bool caller_helps) {
  // Streams and (for sync transfers) the caller pull batches from the request. A one-batch
  // sync transfer thus runs on the caller's thread: a hand-off would cost more than it saves.
  // At most the batches worth running at once (tcp: two per link), a sync caller's included
  // (a caller in Wait() on an async request may run one more).
  const size_t n = req->batch_count() - (caller_helps ? 1 : 0);
  const size_t helpers =
      std::min({n, static_cast<size_t>(pool_->size()),
                std::max<size_t>(req->batches_in_flight(), 1) - (caller_helps ? 1 : 0)});
  for (size_t k = 0; k < helpers; ++k) {
    pool_->Submit(pool_->Pick(), [this, req] { HelpWith(*req, Clock::time_point::max()); });
  }
  if (caller_helps) HelpWith(*req, Clock::time_point::max());
}

void EngineImpl::HelpWith(Request& req, Clock::time_point until) {
  const bool forever = until == Clock::time_point::max();
  while (forever || Clock::now() < until) {
    // A slot per batch: a fence (a peer's deregistration, handled on the control thread)
    // then waits for one batch, not for the rest of a long request.
    auto slot = pool_->Slot();
    if (!req.RunNext()) break;
  }
}

void EngineImpl::StartAll(const std::shared_ptr<Request>& req) {
  for (;;) {
    auto slot = pool_->Slot();  // a fence waits for a batch being started, as for one running
    if (!req->StartNext()) break;
  }
  // The batches of a long request spread over the link's endpoints (rails): streams drive the
  // endpoints the caller does not, one each.
  const size_t drivers = std::min({req->batch_count(), static_cast<size_t>(pool_->size()),
                                   req->batches_in_flight()});
  for (size_t k = 1; k < drivers; ++k) {
    pool_->Submit(pool_->Pick(), [req] { req->Drive(Clock::time_point::max()); });
  }
}

void EngineImpl::FenceBatches(PeerState* peer) {
  pool_->Fence();
  std::vector<std::shared_ptr<transport::Link>> links;
  if (peer) {
    links.push_back(peer->link);
  } else {
    std::lock_guard lock(peers_mu_);
    for (const auto& [name, p] : peers_) links.push_back(p.state->link);
    if (self_) links.push_back(self_->link);
  }
  for (const auto& link : links) {
    if (link && link->pipelined()) link->Quiesce();
  }
}

bool EngineImpl::TryInlineShm(const std::string& remote, Op op, const TransferDesc& d,
                              std::chrono::milliseconds timeout) {
  Peer peer;
  // Anything unusual (including a peer to connect to first) takes the planned path.
  if ((op != Op::kRead && op != Op::kWrite) || timeout.count() <= 0 || d.len == 0 ||
      d.local_addr == 0 || d.remote_addr == 0 || d.local_addr + d.len < d.local_addr ||
      d.remote_addr + d.len < d.remote_addr || !running_.load(std::memory_order_relaxed) ||
      !LookupPeer(remote, &peer) ||
      !peer.state->paths.shm_base || d.len > peer.state->paths.shm_limits.slice_bytes ||
      d.len >= peer.state->paths.shm_limits.streaming_bytes || peer.state->paths.stage_all) {
    return false;
  }
  std::shared_ptr<RemoteRegion> region = peer.state->regions.Find(d.remote_addr, d.len);
  if (!region || region->shm_key == 0 || registry_.TypeOf(d.local_addr, d.len) != MemType::kHost) {
    return false;
  }
  uint8_t* base = MapRegion(*peer.state, *region);
  if (base == nullptr) return false;
  transport::Slice s{d.local_addr, reinterpret_cast<uint64_t>(base) + (d.remote_addr - region->info.addr),
                     d.len};
  // The same order of checks as a planned batch, under an execution slot (the fence of a
  // deregistration waits for it).
  auto slot = pool_->Slot();
  if (!peer.state->alive.load(std::memory_order_acquire) ||
      region->revoked.load(std::memory_order_acquire)) {
    return false;  // the planned path says why
  }
  const uint64_t dst = op == Op::kWrite ? s.remote : s.local;
  const uint64_t src = op == Op::kWrite ? s.local : s.remote;
  pool_->SharedCopy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), s.len);
  peer.state->shm_bytes.fetch_add(d.len, std::memory_order_relaxed);
  return true;
}

Status EngineImpl::TransferSync(const std::string& remote, Op op,
                                const std::vector<TransferDesc>& descs,
                                std::chrono::milliseconds timeout) {
  // One small descriptor into a same-host peer's AllocMem memory: a memcpy on this thread,
  // without a request object (the 8-byte WRITE costs ~0.3 us instead of ~0.5).
  if (descs.size() == 1 && TryInlineShm(remote, op, descs[0], timeout)) return Status::Ok();
  std::shared_ptr<Request> req;
  Status s = Submit(remote, op, descs, timeout, false, &req);
  if (!s.ok()) return s;
  // The request's own deadline ends it; the extra second only bounds the drain of batches
  // already in flight when the deadline passed.
  const auto until = DeadlineAfter(timeout + std::chrono::seconds(1));
  if (req->pipelined()) {
    StartAll(req);
    req->Drive(until);
  } else {
    Dispatch(req, true);
  }
  RequestStatus st = req->WaitUntil(until, opts_.spin);
  if (st.state == RequestState::kWaiting) {
    req->Cancel();
    st = req->WaitUntil(DeadlineAfter(std::chrono::seconds(60)), opts_.spin);
    if (st.state == RequestState::kWaiting) st.status = {StatusCode::kTimeout, "transfer timed out"};
  }
  return st.status;
}

Status EngineImpl::TransferAsync(const std::string& remote, Op op,
                                 const std::vector<TransferDesc>& descs,
                                 std::chrono::milliseconds timeout, RequestHandle* request) {
  if (request == nullptr) return {StatusCode::kInvalidArgument, "TransferAsync: null request pointer"};
  // One small descriptor into a same-host peer's AllocMem memory: copied here, as a sync one
  // is, and the request is over when its handle comes back (4 KiB, 8 in flight: ~2 M/s, from
  // 0.95 M/s through the streams). Larger copies go to the streams: the caller is not held.
  constexpr uint64_t kAsyncInlineBytes = 64 << 10;
  if (descs.size() == 1 && descs[0].len <= kAsyncInlineBytes &&
      TryInlineShm(remote, op, descs[0], timeout)) {
    auto done = Request::Completed(next_request_.fetch_add(1), op);
    *request = done->id();
    Track(done);
    return Status::Ok();
  }
  std::shared_ptr<Request> req;
  Status s = Submit(remote, op, descs, timeout, true, &req);
  if (!s.ok()) return s;
  *request = req->id();
  // Likewise a planned request that is one small memcpy (several descriptors, say): the copy
  // costs less than handing it to a stream.
  if (req->IsSmallCopy(kAsyncInlineBytes)) {
    HelpWith(*req, Clock::time_point::max());
  } else if (req->pipelined()) {
    StartAll(req);
  } else {
    Dispatch(req, false);
  }
  return Status::Ok();
}

namespace {
Status UnknownRequest(const char* what, RequestHandle h) {
  return {StatusCode::kInvalidArgument,
          std::string(what) + ": unknown request " + std::to_string(h) +
              " (never issued, or its end was already reported)"};
}
}  // namespace

std::shared_ptr<Request> EngineImpl::TakeIfDone(RequestHandle h, const RequestStatus& st) {
  if (st.state == RequestState::kWaiting) return nullptr;
  std::lock_guard lock(requests_mu_);
  auto it = requests_.find(h);
  if (it == requests_.end()) return nullptr;
  auto r = it->second;
  requests_.erase(it);
  return r;
}

Status EngineImpl::GetTransferStatus(RequestHandle h, RequestStatus* status) {
  Status s = CheckRunning("GetTransferStatus");
  if (!s.ok()) return s;
  if (status == nullptr) return {StatusCode::kInvalidArgument, "GetTransferStatus: null status"};
  std::shared_ptr<Request> req;
  {
    std::lock_guard lock(requests_mu_);
    auto it = requests_.find(h);
    if (it == requests_.end()) return UnknownRequest("GetTransferStatus", h);
    req = it->second;
  }
  if (!req->done() && req->pipelined()) req->Drive(Clock::now());  // one round of progress
  RequestStatus st = req->Poll();
  if (st.state != RequestState::kWaiting && !TakeIfDone(h, st)) {
    return UnknownRequest("GetTransferStatus", h);  // another thread was told first
  }
  *status = st;
  return Status::Ok();
}

Status EngineImpl::Wait(RequestHandle h, std::chrono::milliseconds timeout, RequestStatus* status) {
  Status s = CheckRunning("Wait");
  if (!s.ok()) return s;
  std::shared_ptr<Request> req;
  {
    std::lock_guard lock(requests_mu_);
    auto it = requests_.find(h);
    if (it == requests_.end()) return UnknownRequest("Wait", h);
    req = it->second;
  }
  // Batches no stream has started yet run here rather than wait in a queue. (A request that is
  // over already costs no clock read: ~30 ns each here, a 4 KiB copy ~70.)
  RequestStatus st;
  if (req->done()) {
    st = req->Poll();
  } else {
    const auto until = DeadlineAfter(timeout);
    if (req->pipelined()) {
      req->Drive(until);
    } else {
      HelpWith(*req, until);
    }
    st = req->WaitUntil(until, opts_.spin);
  }
  if (st.state == RequestState::kWaiting) {
    if (status != nullptr) *status = st;
    return {StatusCode::kTimeout, "Wait: request " + std::to_string(h) + " still running"};
  }
  if (!TakeIfDone(h, st)) return UnknownRequest("Wait", h);  // another thread was told first
  if (status != nullptr) *status = st;
  return st.status;
}

Status EngineImpl::Cancel(RequestHandle h) {
  Status s = CheckRunning("Cancel");
  if (!s.ok()) return s;
  std::lock_guard lock(requests_mu_);
  auto it = requests_.find(h);
  if (it == requests_.end()) return UnknownRequest("Cancel", h);
  it->second->Cancel();
  return Status::Ok();
}

}  // namespace xfer
