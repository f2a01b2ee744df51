#include "core/request_table.h"

#include "util/thread_cache.h"

namespace xfer {

RequestHandle RequestTable::NextHandle() {
  const unsigned mine = ThisThreadIndex() % kShards;  // (the same shard in every table)
  return shards_[mine].next.fetch_add(1, std::memory_order_relaxed) * kShards + mine;
}

void RequestTable::Track(const std::shared_ptr<Request>& req) {
  Shard& s = ShardOf(req->id());
  std::lock_guard lock(s.mu);
  s.requests.emplace(req->id(), req);
}

RequestHandle RequestTable::TrackCompleted() {
  const RequestHandle h = NextHandle();
  Shard& s = ShardOf(h);
  std::lock_guard lock(s.mu);
  s.requests.emplace(h, nullptr);
  return h;
}

bool RequestTable::Find(RequestHandle h, bool take_completed, std::shared_ptr<Request>* req) {
  Shard& s = ShardOf(h);
  std::lock_guard lock(s.mu);
  auto it = s.requests.find(h);
  if (it == s.requests.end()) return false;
  *req = it->second;
  if (!*req && take_completed) s.requests.erase(it);
  return true;
}

std::shared_ptr<Request> RequestTable::TakeIfDone(RequestHandle h, const RequestStatus& st) {
  if (st.state == RequestState::kWaiting) return nullptr;
  Shard& s = ShardOf(h);
  std::lock_guard lock(s.mu);
  auto it = s.requests.find(h);
  if (it == s.requests.end()) return nullptr;
  auto r = it->second;
  s.requests.erase(it);
  return r;
}

void RequestTable::CancelAll() {
  for (Shard& s : shards_) {
    std::lock_guard lock(s.mu);
    for (auto& [h, r] : s.requests) {
      if (r) r->Cancel();
    }
  }
}

void RequestTable::Clear() {
  for (Shard& s : shards_) {
    std::lock_guard lock(s.mu);
    s.requests.clear();
  }
}

}  // namespace xfer
