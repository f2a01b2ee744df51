// Prepared lists (docs/prepared_lists.md): ranges checked once, requests by index.
#include "core/datapath/transfer_service.h"
#include "util/log.h"

namespace xfer {

Status TransferService::PrepareLocalList(const std::vector<MemRange>& ranges, ListHandle* list) {
  Status s = self_.CheckRunning("PrepareLocalList");
  if (s.ok() && list == nullptr) s = {StatusCode::kInvalidArgument, "null list pointer"};
  if (s.ok() && ranges.empty()) s = {StatusCode::kInvalidArgument, "no ranges"};
  auto l = std::make_shared<LocalList>();
  if (s.ok()) {
    l->registry_version = regions_.registry().version();  // (first: a change during the check shows)
    l->entries.reserve(ranges.size());
    for (const MemRange& r : ranges) l->entries.push_back({r.addr, r.len});
    s = CheckLocalEntries(regions_.registry(), &l->entries, true);
  }
  if (!s.ok()) {
    XLOG(WARN) << "PrepareLocalList refused: " << s.ToString();
    return s;
  }
  *list = lists_.Add(std::shared_ptr<const LocalList>(std::move(l)));
  return Status::Ok();
}

Status TransferService::PrepareRemoteList(const std::string& remote, const std::vector<MemRange>& ranges,
                                          ListHandle* list) {
  Status s = self_.CheckRunning("PrepareRemoteList");
  if (s.ok() && list == nullptr) s = {StatusCode::kInvalidArgument, "null list pointer"};
  if (s.ok() && ranges.empty()) s = {StatusCode::kInvalidArgument, "no ranges"};
  auto l = std::make_shared<RemoteList>();
  if (s.ok()) s = peers_.Find(remote, &l->peer);
  if (s.ok() && !l->peer.state->alive.load()) {
    s = {StatusCode::kConnectionLost, "peer '" + remote + "' is gone"};
  }
  if (s.ok()) {
    l->remote = remote;
    s = FindRemoteEntries(ranges, l->peer.state->regions, l.get());
    if (s.code() == StatusCode::kRemoteAccessDenied &&
        peers_.CaughtUp(l->peer, remote, self_.options.heartbeat_timeout, &s)) {
      s = FindRemoteEntries(ranges, l->peer.state->regions, l.get());
    }
  }
  if (!s.ok()) {
    XLOG(WARN) << "PrepareRemoteList for '" << remote << "' refused: " << s.ToString();
    return s;
  }
  *list = lists_.Add(std::shared_ptr<const RemoteList>(std::move(l)));
  return Status::Ok();
}

Status TransferService::ReleaseList(ListHandle list) {
  Status s = self_.CheckRunning("ReleaseList");
  if (!s.ok()) return s;
  if (!lists_.Remove(list)) {
    return {StatusCode::kInvalidArgument,
            "ReleaseList: unknown list " + std::to_string(list) + " (never prepared, or released already)"};
  }
  return Status::Ok();
}

std::shared_ptr<const LocalList> TransferService::CurrentLocal(ListHandle h,
                                                               std::shared_ptr<const LocalList> list) {
  const Registry& registry = regions_.registry();
  const uint64_t version = registry.version();
  if (version == list->registry_version) return list;
  auto fresh = std::make_shared<LocalList>(*list);
  fresh->registry_version = version;
  (void)CheckLocalEntries(registry, &fresh->entries, false);  // (a bad entry fails the request using it)
  std::shared_ptr<const LocalList> checked = std::move(fresh);
  lists_.Replace(h, list, checked);
  return checked;
}

Status TransferService::SubmitPrepared(Op op, const PreparedDescs& d, FoundLists found,
                                       std::chrono::milliseconds timeout, const TransferOptions& options,
                                       bool track, std::shared_ptr<Request>* out) {
  const auto start = Clock::now();  // (the deadline and the duration run from here)
  Status s = self_.CheckRunning("Transfer");
  if (s.ok() && options.notify) s = notifications_.check("Transfer", *options.notify);
  if (s.ok() && op != Op::kRead && op != Op::kWrite) s = {StatusCode::kInvalidArgument, "unknown op"};
  if (s.ok() && d.local_index.size() != d.remote_index.size()) {
    s = {StatusCode::kInvalidArgument, "local_index has " + std::to_string(d.local_index.size()) +
                                           " entries, remote_index " + std::to_string(d.remote_index.size())};
  }
  if (s.ok() && d.local_index.empty()) s = {StatusCode::kInvalidArgument, "no descriptors"};
  if (s.ok()) s = found.status;
  if (!s.ok()) return Refused(op, "", s);
  std::shared_ptr<const LocalList> local = std::move(found.local);
  const std::shared_ptr<const RemoteList> remote = std::move(found.remote);
  const PeerState& peer = *remote->peer.state;
  if (!peer.alive.load()) {
    s = {StatusCode::kConnectionLost,
         "peer '" + remote->remote + "' is gone (prepare the remote list again once connected)"};
  } else if (!peer.Reachable()) {
    s = {StatusCode::kUnsupported, "no transport of this engine reaches peer '" + remote->remote + "'"};
  }
  std::shared_ptr<const Plan> plan;
  if (s.ok()) {
    local = CurrentLocal(d.local, std::move(local));
    plan = remote->last_plan.Find(op, local.get(), d.local_index, d.remote_index);
  }
  if (s.ok() && !plan) {
    Plan made;
    const PreparedPairs pairs{local->entries,  d.local_index,  remote->entries,
                              remote->regions, d.remote_index, &peer.regions};
    s = MakePreparedPlan(op, pairs, peer.routes, &made);
    if (s.code() == StatusCode::kRemoteAccessDenied &&
        peers_.CaughtUp(remote->peer, remote->remote, timeout, &s)) {
      s = MakePreparedPlan(op, pairs, peer.routes, &made);
    }
    if (s.ok()) {
      plan = std::make_shared<const Plan>(std::move(made));
      remote->last_plan.Keep(op, local, d.local_index, d.remote_index, plan);
    }
  }
  if (!s.ok()) return Refused(op, remote->remote, s);
  return NewRequest(op, start, timeout, remote->peer, std::move(plan), options, track, out);
}

TransferService::FoundLists TransferService::FindLists(const PreparedDescs& d) const {
  FoundLists f;
  f.status = lists_.Get(d.local, d.remote, &f.local, &f.remote);
  return f;
}

bool TransferService::TryInlinePrepared(Op op, const PreparedDescs& d, const FoundLists& found,
                                        std::chrono::milliseconds timeout, uint64_t max_len) {
  if ((op != Op::kRead && op != Op::kWrite) || timeout.count() <= 0 || d.local_index.size() != 1 ||
      d.remote_index.size() != 1 || !self_.running.load(std::memory_order_relaxed) || !found.status.ok()) {
    return false;
  }
  const LocalList* local = found.local.get();
  const RemoteList* remote = found.remote.get();
  const uint32_t li = d.local_index[0], ri = d.remote_index[0];
  // Anything unusual takes the planned path, which explains refusals.
  if (li >= local->entries.size() || ri >= remote->entries.size() ||
      local->registry_version != regions_.registry().version()) {
    return false;
  }
  const LocalEntry& l = local->entries[li];
  const RemoteEntry& r = remote->entries[ri];
  const PeerState& peer = *remote->peer.state;
  if (l.len != r.len || l.len > max_len || !l.usable || (op == Op::kRead && !l.writable) ||
      l.type != MemType::kHost || !peer.copies_inline || peer.routes.stage_all) {
    return false;
  }
  RemoteRegion* region = remote->regions[r.region].get();  // (the list holds it)
  std::shared_ptr<RemoteRegion> again;
  if (region->revoked.load(std::memory_order_acquire)) {  // (registered again since, perhaps)
    again = peer.regions.FindRemembered(r.addr, r.len, op == Op::kWrite);
    if (!again) return false;
    region = again.get();
  }
  return inline_->Copy(peer, op, *region, l.addr, r.addr, l.len);
}

Status TransferService::TransferSync(Op op, const PreparedDescs& descs, std::chrono::milliseconds timeout,
                                     const TransferOptions& options, RequestStatus* result) {
  FoundLists found = FindLists(descs);
  if (Plain(options) && TryInlinePrepared(op, descs, found, timeout, UINT64_MAX)) {
    if (result != nullptr) *result = {RequestState::kCompleted, {}, {}};
    return Status::Ok();
  }
  std::shared_ptr<Request> req;
  Status s = SubmitPrepared(op, descs, std::move(found), timeout, options, false, &req);
  return RunSync(s, req, timeout, result);
}

Status TransferService::TransferAsync(Op op, const PreparedDescs& descs, std::chrono::milliseconds timeout,
                                      const TransferOptions& options, RequestHandle* request) {
  if (request == nullptr) return {StatusCode::kInvalidArgument, "TransferAsync: null request pointer"};
  FoundLists found = FindLists(descs);
  if (Plain(options) && TryInlinePrepared(op, descs, found, timeout, kAsyncInlineBytes)) {
    *request = requests_.TrackCompleted();
    return Status::Ok();
  }
  std::shared_ptr<Request> req;
  Status s = SubmitPrepared(op, descs, std::move(found), timeout, options, true, &req);
  if (!s.ok()) return s;
  *request = req->id();
  Start(req);
  return Status::Ok();
}

}  // namespace xfer
