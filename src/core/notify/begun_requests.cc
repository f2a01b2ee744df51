#include "core/notify/begun_requests.h"

namespace xfer {

Status BegunRequests::Begin(Key session, uint64_t seq, std::string message) {
  std::lock_guard lock(mu_);
  Session& in = sessions_[session];
  if (in.begun.contains(seq)) {
    return {StatusCode::kInvalidArgument, "request " + std::to_string(seq) + " began already"};
  }
  if (in.begun.size() >= most_ || in.bytes + message.size() > most_bytes_) {
    return {
        StatusCode::kResourceExhausted,
        "the peer has " + std::to_string(in.begun.size()) + " notified requests (" +
            std::to_string(in.bytes) +
            " bytes) begun toward this engine, the most one peer may hold (a quarter of notify.queue_messages"
            " and notify.queue_bytes)"};
  }
  if (Status s = queue_->Reserve(message.size()); !s.ok()) return s;
  in.bytes += message.size();
  in.begun.emplace(seq, std::move(message));
  return Status::Ok();
}

Status BegunRequests::End(Key session, uint64_t begin, std::string* message) {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(session);
  auto req =
      it == sessions_.end() ? std::map<uint64_t, std::string>::iterator{} : it->second.begun.find(begin);
  if (it == sessions_.end() || req == it->second.begun.end()) {
    return {StatusCode::kInvalidArgument, "no notified request began as " + std::to_string(begin)};
  }
  *message = std::move(req->second);
  it->second.bytes -= message->size();
  it->second.begun.erase(req);
  return Status::Ok();
}

std::vector<std::string> BegunRequests::Take(Key session) {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return out;
  for (auto& [seq, message] : it->second.begun) out.push_back(std::move(message));
  sessions_.erase(it);
  return out;
}

}  // namespace xfer
