#include "core/notify/begun_requests.h"

namespace xfer {

Status BegunRequests::Begin(Key session, uint64_t seq, std::string message) {
  std::lock_guard lock(mu_);
  auto& begun = begun_[session];
  if (begun.contains(seq)) {
    return {StatusCode::kInvalidArgument, "request " + std::to_string(seq) + " began already"};
  }
  if (Status s = queue_->Reserve(message.size()); !s.ok()) return s;
  begun.emplace(seq, std::move(message));
  return Status::Ok();
}

Status BegunRequests::End(Key session, uint64_t begin, std::string* message) {
  std::lock_guard lock(mu_);
  auto it = begun_.find(session);
  auto req = it == begun_.end() ? decltype(it->second)::iterator{} : it->second.find(begin);
  if (it == begun_.end() || req == it->second.end()) {
    return {StatusCode::kInvalidArgument, "no notified request began as " + std::to_string(begin)};
  }
  *message = std::move(req->second);
  it->second.erase(req);
  return Status::Ok();
}

std::vector<std::string> BegunRequests::Take(Key session) {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  auto it = begun_.find(session);
  if (it == begun_.end()) return out;
  for (auto& [seq, message] : it->second) out.push_back(std::move(message));
  begun_.erase(it);
  return out;
}

}  // namespace xfer
