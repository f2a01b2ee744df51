#include "core/region_service.h"

#include "util/log.h"

namespace xfer {

void RegionService::Start(BackendSet* backends, RemoteRegions* mirror) {
  backends_ = backends;
  mirror_ = mirror;
}

Status RegionService::Add(wire::WireRegion region, bool allocated,
                          std::unique_ptr<RegionResources> res, MemHandle* handle) {
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
      XLOG(WARN) << "peer " << sub->peer_key << " did not confirm deregistration of region "
                 << removal.handle << " in time; closing its session";
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
