#include "core/request_table.h"

namespace xfer {

void RequestTable::Track(const std::shared_ptr<Request>& req) {
  std::lock_guard lock(mu_);
  requests_.emplace(req->id(), req);
}

RequestHandle RequestTable::TrackCompleted() {
  const RequestHandle h = NextHandle();
  std::lock_guard lock(mu_);
  requests_.emplace(h, nullptr);
  return h;
}

bool RequestTable::Find(RequestHandle h, bool take_completed, std::shared_ptr<Request>* req) {
  std::lock_guard lock(mu_);
  auto it = requests_.find(h);
  if (it == requests_.end()) return false;
  *req = it->second;
  if (!*req && take_completed) requests_.erase(it);
  return true;
}

std::shared_ptr<Request> RequestTable::TakeIfDone(RequestHandle h, const RequestStatus& st) {
  if (st.state == RequestState::kWaiting) return nullptr;
  std::lock_guard lock(mu_);
  auto it = requests_.find(h);
  if (it == requests_.end()) return nullptr;
  auto r = it->second;
  requests_.erase(it);
  return r;
}

void RequestTable::CancelAll() {
  std::lock_guard lock(mu_);
  for (auto& [h, r] : requests_) {
    if (r) r->Cancel();
  }
}

void RequestTable::Clear() {
  std::lock_guard lock(mu_);
  requests_.clear();
}

}  // namespace xfer
