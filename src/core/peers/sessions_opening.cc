#include "core/peers/sessions_opening.h"

#include "util/log.h"

namespace xfer {

Status SessionsOpening::Begin(const std::shared_ptr<control::Session>& session) {
  std::lock_guard l(mu_);
  if (settling_) return {StatusCode::kCanceled, "the engine is finalizing"};
  opening_.insert(session);
  return Status::Ok();
}

void SessionsOpening::End(const std::shared_ptr<control::Session>& session) {
  std::lock_guard l(mu_);
  if (opening_.erase(session) != 0) cv_.notify_all();
}

void SessionsOpening::Settle(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock l(mu_);
  settling_ = true;
  if (!cv_.wait_until(l, deadline, [&] { return opening_.empty(); })) {
    for (const auto& s : opening_) {
      XLOG(WARN) << "the connection to " << s->remote_addr() << " did not finish within the heartbeat "
                 << "timeout while the engine finalized; closing it";
      s->Shutdown("engine finalized");
    }
    cv_.wait(l, [&] { return opening_.empty(); });  // (their reads fail at once now)
  }
}

}  // namespace xfer
