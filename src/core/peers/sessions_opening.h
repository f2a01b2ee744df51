// The outbound sessions between their opening and Connect's end (installed or abandoned), so
// that Finalize can wait for them: a peer sent our hello must hear our goodbye.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>

#include "control/session.h"

namespace xfer {

class SessionsOpening {
 public:
  // Fails (kCanceled) once Settle has begun.
  Status Begin(const std::shared_ptr<control::Session>& session);
  void End(const std::shared_ptr<control::Session>& session);
  // Finalize: from now on nothing begins; waits until no session is between Begin and End (one
  // still there at the deadline is shut down, and its Connect then fails).
  void Settle(std::chrono::steady_clock::time_point deadline);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<std::shared_ptr<control::Session>> opening_;  // mu_
  bool settling_ = false;                                // mu_
};

}  // namespace xfer
