// Peer authentication with a shared secret (control/auth.h has the exchange; docs/security.md
// the threat model): the secret, Connect's side of the handshake, and the accepting side's.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "control/session.h"
#include "core/local_engine.h"
#include "util/log.h"

namespace xfer {

class Authenticator {
 public:
  using Clock = std::chrono::steady_clock;

  explicit Authenticator(const LocalEngine& self) : self_(self) {}
  ~Authenticator() { Forget(); }

  // The secret from the options (secret or secret_file), wiped from *options; checks its
  // length. Without either, peers are not authenticated.
  Status Load(EngineOptions* options);
  // Wipes the secret from memory (Finalize, once no thread reads it).
  void Forget();
  bool on() const { return !secret_.empty(); }

  // Connect's side of the handshake, before our hello: our challenge, the peer's challenge and
  // proof, ours. kRemoteAccessDenied when the peer is not who it must be.
  Status Outbound(control::Session& s, const std::string& remote, Clock::time_point deadline);
  // The accepting side (control thread), for frames before the hello. True when msg was
  // handled here (answered, or the session refused).
  bool OnUnauthenticated(const std::shared_ptr<control::Session>& s, wire::Message& msg);
  // Refuses an accepted session: one log line naming its address, a Goodbye, and the close.
  void Refuse(const std::shared_ptr<control::Session>& s, const std::string& reason,
              const std::string& detail);

 private:
  const LocalEngine& self_;
  std::string secret_;      // empty: peers are not authenticated
  log::Limit refusal_log_;  // control thread: refused connections (Refuse)
};

}  // namespace xfer
