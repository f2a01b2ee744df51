#include "core/datapath/request_table.h"

#include <algorithm>

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
  RequestHandle free = 0;
  if (RingPlace(s, h).compare_exchange_strong(free, h, std::memory_order_acq_rel)) return h;
  std::lock_guard lock(s.mu);
  // (At the end, unless a thread sharing the shard took a later handle and got here first.)
  s.completed.insert(std::upper_bound(s.completed.begin(), s.completed.end(), h), h);
  return h;
}

bool RequestTable::Find(RequestHandle h, bool take_completed, std::shared_ptr<Request>* req) {
  Shard& s = ShardOf(h);
  std::atomic<RequestHandle>& place = RingPlace(s, h);
  if (RequestHandle there = h; h != 0 && place.load(std::memory_order_acquire) == h) {  // (0: a free place)
    // (A handle is in the ring or elsewhere, never both: when another thread takes it first,
    // it is unknown from then on.)
    if (take_completed && !place.compare_exchange_strong(there, 0, std::memory_order_acq_rel)) return false;
    req->reset();
    return true;
  }
  std::lock_guard lock(s.mu);
  auto c = s.completed.empty() || s.completed.front() == h
               ? s.completed.begin()
               : std::lower_bound(s.completed.begin(), s.completed.end(), h);
  if (c != s.completed.end() && *c == h) {
    req->reset();
    if (take_completed) s.completed.erase(c);
    return true;
  }
  auto it = s.requests.find(h);
  if (it == s.requests.end()) return false;
  *req = it->second;
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
    std::vector<std::shared_ptr<Request>> all;
    {
      std::lock_guard lock(s.mu);
      for (auto& [h, r] : s.requests) {
        if (r) all.push_back(r);
      }
    }
    for (auto& r : all) r->Cancel();  // (outside the lock: a cancel may end the request now)
  }
}

void RequestTable::Clear() {
  for (Shard& s : shards_) {
    std::lock_guard lock(s.mu);
    s.requests.clear();
    s.completed.clear();
    for (auto& place : s.ring) place.store(0, std::memory_order_relaxed);
  }
}

}  // namespace xfer
