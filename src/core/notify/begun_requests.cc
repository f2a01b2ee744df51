#include "core/notify/begun_requests.h"

namespace xfer {

void BegunRequests::RefuseLocked(Session& in, uint64_t id, const Status& why) {
  in.refused[id] = why;
  if (in.refused.size() > most_) in.refused.erase(in.refused.begin());
}

void BegunRequests::Refuse(Key session, uint64_t id, const Status& why) {
  std::lock_guard lock(mu_);
  RefuseLocked(sessions_[session], id, why);
}

Status BegunRequests::Begin(Key session, uint64_t id, std::string message, bool reserve) {
  std::lock_guard lock(mu_);
  Session& in = sessions_[session];
  if (in.begun.contains(id)) {
    return {StatusCode::kInvalidArgument, "request " + std::to_string(id) + " began already"};
  }
  Status s;
  if (in.begun.size() >= most_ || in.bytes + message.size() > most_bytes_) {
    s = {
        StatusCode::kResourceExhausted,
        "the peer has " + std::to_string(in.begun.size()) + " notified requests (" +
            std::to_string(in.bytes) +
            " bytes) begun toward this engine, the most one peer may hold (a quarter of notify.queue_messages"
            " and notify.queue_bytes)"};
  } else if (reserve) {
    s = queue_->Reserve(message.size());
  }
  if (!s.ok()) {
    RefuseLocked(in, id, s);
    return s;
  }
  in.bytes += message.size();
  in.begun.emplace(id, Held{std::move(message), reserve});
  return Status::Ok();
}

Status BegunRequests::End(Key session, uint64_t id, Held* held) {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(session);
  if (it != sessions_.end()) {
    Session& in = it->second;
    if (auto req = in.begun.find(id); req != in.begun.end()) {
      *held = std::move(req->second);
      in.bytes -= held->message.size();
      in.begun.erase(req);
      return Status::Ok();
    }
    if (auto r = in.refused.find(id); r != in.refused.end()) {
      Status why = std::move(r->second);
      in.refused.erase(r);
      return why;
    }
  }
  return {StatusCode::kResourceExhausted, "this engine holds no notification begun as request " +
                                              std::to_string(id) +
                                              " (its beginning was refused, or never came)"};
}

std::vector<BegunRequests::Held> BegunRequests::Take(Key session) {
  std::lock_guard lock(mu_);
  std::vector<Held> out;
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return out;
  for (auto& [id, held] : it->second.begun) out.push_back(std::move(held));  // (in the ids' order)
  sessions_.erase(it);
  return out;
}

void BegunRequests::Queue(Notification n, bool reserved, const std::function<void()>& before_visible) {
  if (!reserved) return queue_->PushAccepted(std::move(n), before_visible);
  const uint64_t bytes = n.message.size();  // (the reservation's: the message it held)
  queue_->PushReserved(std::move(n), bytes, before_visible);
}

}  // namespace xfer
