#include "core/request_table.h"

namespace xfer {

void RequestTable::Track(const std::shared_ptr<Request>& req) {
  std::lock_guard lock(mu_);
  requests_.emplace(req->id(), req);
}

std::shared_ptr<Request> RequestTable::Find(RequestHandle h) const {
  std::lock_guard lock(mu_);
  auto it = requests_.find(h);
  return it == requests_.end() ? nullptr : it->second;
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
  for (auto& [h, r] : requests_) r->Cancel();
}

void RequestTable::Clear() {
  std::lock_guard lock(mu_);
  requests_.clear();
}

}  // namespace xfer
