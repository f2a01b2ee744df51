#include "core/regions/region_service.h"

#include "util/log.h"
#include "util/text.h"

namespace xfer {

void RegionService::Start(BackendSet* backends, RemoteRegions* mirror, Hooks hooks) {
  backends_ = backends;
  mirror_ = mirror;
  hooks_ = std::move(hooks);
}

Status RegionService::Register(void* addr, uint64_t len, MemType type, MemHandle* handle,
                               const std::string& tag, PeerAccess access) {
  Status s = self_.CheckRunning("RegisterMem");
  if (s.ok() && handle == nullptr) s = {StatusCode::kInvalidArgument, "RegisterMem: null handle pointer"};
  if (s.ok() && access != PeerAccess::kReadWrite && access != PeerAccess::kReadOnly) {
    s = {StatusCode::kInvalidArgument, "RegisterMem: unknown PeerAccess value"};
  }
  MemType actual = MemType::kHost;
  int32_t device = -1;
  if (s.ok()) backends_->Classify(addr, &actual, &device);
  if (s.ok()) {
    if (Status ms = backends_->CheckMemoryType(type); !ms.ok())
      s = {ms.code(), "RegisterMem: " + ms.message()};
  }
  if (s.ok() && type != actual) {
    s = {StatusCode::kInvalidArgument,
         "RegisterMem: " + text::Hex(reinterpret_cast<uint64_t>(addr)) + " is " +
             (actual == MemType::kCuda
                  ? "GPU memory (device " + std::to_string(device) + "): register it as MemType::kCuda"
                  : std::string("not GPU memory, but was registered as "
                                "MemType::kCuda"))};
  }
  if (!s.ok()) {
    XLOG(WARN) << s.ToString();
    return s;
  }
  wire::WireRegion r;
  r.info = RegionInfo{reinterpret_cast<uint64_t>(addr), len, type, device, tag, false, access};
  s = Add(std::move(r), false, std::make_unique<RegionResources>(), handle);
  if (s.ok() && !tag.empty()) hooks_.tags_changed();
  return s;
}

Status RegionService::Allocate(uint64_t len, MemType type, void** addr, MemHandle* handle,
                               const std::string& tag, const AllocOptions& options) {
  Status s = self_.CheckRunning("AllocMem");
  if (s.ok() && (addr == nullptr || handle == nullptr)) {
    s = {StatusCode::kInvalidArgument, "AllocMem: null address or handle pointer"};
  }
  if (s.ok() && len == 0) s = {StatusCode::kInvalidArgument, "AllocMem: zero length"};
  if (s.ok() && options.access != PeerAccess::kReadWrite && options.access != PeerAccess::kReadOnly) {
    s = {StatusCode::kInvalidArgument, "AllocMem: unknown PeerAccess value"};
  }
  auto res = std::make_unique<RegionResources>();
  wire::WireRegion r;
  r.info = RegionInfo{0, len, type, -1, tag, type == MemType::kHost, options.access};
  if (s.ok()) {
    s = backends_->Allocate(len, type, options, &r.info.addr, &r.info.device, &res->allocation);
    if (!s.ok() && s.message().rfind("AllocMem", 0) != 0) s = {s.code(), "AllocMem: " + s.message()};
  }
  if (s.ok()) {
    const uint64_t at = r.info.addr;
    s = Add(std::move(r), true, std::move(res), handle);
    if (s.ok()) *addr = reinterpret_cast<void*>(at);
    if (s.ok() && !tag.empty()) hooks_.tags_changed();
  }
  if (!s.ok()) XLOG(WARN) << s.ToString();
  return s;
}

Status RegionService::Deregister(MemHandle handle, bool free) {
  Status s = self_.CheckRunning(free ? "FreeMem" : "DeregisterMem");
  if (!s.ok()) return s;
  const auto deadline = self_.HeartbeatDeadline();
  Removal removal;
  s = BeginRemove(handle, free, &removal);
  if (!s.ok() || !removal.removed) return s;
  hooks_.fence(deadline);  // no batch, ours or a peer's, touches the region any more
  FinishRemove(removal, deadline);
  hooks_.tags_changed();
  return Status::Ok();
}

transport::TargetAccess RegionService::Access(uint64_t addr, uint64_t len, bool write) const {
  transport::TargetAccess access;
  if (auto r = registry_.Access(addr, len, write, self_.stage_tag)) {
    access.allowed = true;
    access.writable = r->writable;
    access.device = r->type == MemType::kCuda;
    access.staged = access.device || self_.options.staging == Staging::kAlways || r->tagged;
  }
  return access;
}

void RegionService::AddGauges(MetricsSnapshot* out) const {
  uint64_t regions[2] = {}, bytes[2] = {};
  for (const auto& r : registry_.Snapshot()) {
    const int t = r.info.type == MemType::kCuda ? 1 : 0;
    ++regions[t];
    bytes[t] += r.info.len;
  }
  for (int t = 0; t < 2; ++t) {
    const std::string type(MemTypeName(static_cast<MemType>(t)));
    AddValue(out, "xfer_registered_regions", MetricType::kGauge,
             "Local regions registered (RegisterMem, AllocMem), by memory type.", regions[t],
             {{"type", type}});
    AddValue(out, "xfer_registered_bytes", MetricType::kGauge,
             "Bytes of the registered regions, by memory type.", static_cast<double>(bytes[t]),
             {{"type", type}});
  }
}

Status RegionService::Add(wire::WireRegion region, bool allocated, std::unique_ptr<RegionResources> res,
                          MemHandle* handle) {
  // What peers need to reach the memory, prepared before the lock (pinning pages is slow
  // for large regions) and dropped again if the range was registered already.
  if (Status s = backends_->PrepareRegion(region.info, res.get(), &region.blobs); !s.ok()) {
    XLOG(WARN) << "RegisterMem: " << s.ToString();
    return {s.code(), "RegisterMem: " + s.message()};
  }
  std::lock_guard lock(mu_);
  bool added = false;
  Status s = registry_.Add(region, allocated, handle, &added);
  if (!s.ok()) {
    XLOG(WARN) << s.ToString();
    return s;
  }
  if (!added) return Status::Ok();
  resources_[*handle] = std::move(res);
  wire::WireRegion r;
  registry_.Lookup(*handle, &r);
  std::string unused;
  (void)mirror_->Add(r, &unused);  // (our own registry's ids are unique, lengths nonzero)
  for (auto& sub : subscribers_) {
    Status st = sub->Send(wire::RegionAdd{r});
    if (!st.ok()) sub->Shutdown("cannot send region update: " + st.ToString());
  }
  return Status::Ok();
}

Status RegionService::BeginRemove(MemHandle handle, bool free, Removal* out) {
  *out = Removal{handle, false, {}};
  std::lock_guard lock(mu_);
  Status s = registry_.Remove(handle, &out->removed, free);
  if (!s.ok()) {
    XLOG(WARN) << s.ToString();
    return s;
  }
  if (!out->removed) return Status::Ok();  // still referenced by another RegisterMem
  mirror_->Revoke(handle);
  for (auto& sub : subscribers_) {
    uint64_t seq = 0;
    auto remove = [&](uint64_t n) { return wire::RegionRemove{handle, n}; };
    if (sub->SendNumbered(remove, &seq).ok()) {
      out->pending.emplace_back(sub, seq);
    }
  }
  return Status::Ok();
}

void RegionService::FinishRemove(Removal& removal, Clock::time_point deadline) {
  // Each peer acknowledges once its batches touching the region have finished. A peer that
  // cannot say so in time is cut off: it must not keep writing into memory we give back.
  for (auto& [sub, seq] : removal.pending) {
    if (!sub->WaitAcked(seq, deadline) && !sub->closed()) {
      XLOG(WARN) << "peer " << sub->peer_key << " did not confirm deregistration of region " << removal.handle
                 << " in time; closing its session";
      sub->Shutdown("did not confirm a deregistration in time");
    }
  }
  std::unique_ptr<RegionResources> released;  // released after the lock: no peer uses them now
  std::lock_guard lock(mu_);
  if (auto it = resources_.find(removal.handle); it != resources_.end()) {
    released = std::move(it->second);
    resources_.erase(it);
  }
}

Status RegionService::SendHelloAndSubscribe(const std::shared_ptr<control::Session>& s,
                                            const MakeHello& hello) {
  std::lock_guard lock(mu_);
  if (closed_) return {StatusCode::kCanceled, "the engine is finalizing"};
  Status st = s->Send(hello(registry_.Snapshot()));
  if (st.ok()) subscribers_.insert(s);
  return st;
}

void RegionService::Unsubscribe(const std::shared_ptr<control::Session>& s) {
  std::lock_guard lock(mu_);
  subscribers_.erase(s);
}

std::vector<std::shared_ptr<control::Session>> RegionService::CloseSubscriptions() {
  std::lock_guard lock(mu_);
  closed_ = true;
  return {subscribers_.begin(), subscribers_.end()};
}

void RegionService::ReleaseAll() {
  std::map<MemHandle, std::unique_ptr<RegionResources>> released;
  {
    std::lock_guard lock(mu_);
    released.swap(resources_);
  }
}

}  // namespace xfer
