// Peer authentication with a shared secret (control/auth.h has the protocol; docs/security.md
// the threat model).
#include <fstream>
#include <iterator>

#include "core/engine_impl.h"
#include "util/crypto.h"
#include "util/log.h"

namespace xfer {

Status EngineImpl::LoadSecret(const EngineOptions& o) {
  auto bad = [](const std::string& why) { return Status{StatusCode::kInvalidArgument, why}; };
  if (!o.secret.empty() && !o.secret_file.empty()) return bad("give secret or secret_file, not both");
  secret_ = o.secret;
  if (!o.secret_file.empty()) {
    std::ifstream in(o.secret_file, std::ios::binary);
    if (!in) return bad("cannot read secret_file '" + o.secret_file + "'");
    secret_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (secret_.empty()) return Status::Ok();
  if (secret_.size() < 16) {
    secret_.clear();
    return bad("the secret must be at least 16 bytes");
  }
  if (!crypto::Available()) {
    secret_.clear();
    return {StatusCode::kUnsupported, "a secret needs libsodium, which this build lacks (libsodium-dev)"};
  }
  return Status::Ok();
}

Status EngineImpl::AuthenticateOutbound(control::Session& s, const std::string& remote,
                                        Clock::time_point deadline) {
  control::Handshake hs(secret_, true, name_, incarnation_);
  Status st = s.Send(hs.Mine());
  if (st.ok()) st = s.FlushUntil(deadline);
  wire::Message m;
  if (st.ok()) st = s.ReadOne(deadline, &m);
  if (!st.ok()) return {st.code(), "authenticating with '" + remote + "': " + st.message()};
  auto denied = [&](const std::string& why) {
    return Status{StatusCode::kRemoteAccessDenied, "'" + remote + "' " + why};
  };
  if (auto* bye = std::get_if<wire::Goodbye>(&m)) return denied("refused us: " + bye->reason);
  auto* theirs = std::get_if<wire::AuthChallenge>(&m);
  if (theirs == nullptr) {
    return denied("answered without authenticating: it has no secret (both engines need the same one)");
  }
  const wire::AuthProof mine = hs.Answer(*theirs);
  if (st = s.ReadOne(deadline, &m); !st.ok()) return {st.code(), "authenticating with '" + remote + "': " + st.message()};
  auto* proof = std::get_if<wire::AuthProof>(&m);
  if (proof == nullptr || !hs.Verify(*proof)) {
    return denied("failed to prove it knows our secret (a different secret?)");
  }
  const crypto::Mac key = hs.SessionKey();
  s.auth_key.assign(reinterpret_cast<const char*>(key.data()), key.size());
  return s.Send(mine);  // (our hello follows, and the acceptor checks this first)
}

bool EngineImpl::OnUnauthenticated(const std::shared_ptr<control::Session>& s, wire::Message& msg) {
  if (!s->shutdown_reason().empty()) return true;  // refused already: the rest of its frames
  auto* challenge = std::get_if<wire::AuthChallenge>(&msg);
  if (secret_.empty()) {
    if (challenge == nullptr) return false;  // (a hello: as always)
    Refuse(s, "authentication is off on " + name_ + " (it has no secret)",
           "it asked to authenticate, and this engine has no secret");
    return true;
  }
  if (s->authenticated) return false;
  if (challenge != nullptr && !s->auth) {
    s->auth = std::make_shared<control::Handshake>(secret_, false, name_, incarnation_);
    const wire::AuthProof proof = s->auth->Answer(*challenge);
    s->SendSoon(s->auth->Mine());
    s->SendSoon(proof);
    return true;
  }
  auto* proof = std::get_if<wire::AuthProof>(&msg);
  if (proof != nullptr && s->auth) {
    if (!s->auth->Verify(*proof)) {
      Refuse(s, "authentication failed", "wrong secret, or a replayed handshake");
      return true;
    }
    s->authenticated = true;
    const crypto::Mac key = s->auth->SessionKey();
    s->auth_key.assign(reinterpret_cast<const char*>(key.data()), key.size());
    return true;
  }
  if (std::holds_alternative<wire::Goodbye>(msg) && s->auth) {
    Refuse(s, "authentication failed", "it left without proving it knows the secret (another secret?)");
  } else {
    Refuse(s, "authentication required",
           std::string("it sent ") + (challenge ? "a second challenge" : "a frame before authenticating") +
               " (this engine has a secret)");
  }
  return true;
}

void EngineImpl::Refuse(const std::shared_ptr<control::Session>& s, const std::string& reason,
                        const std::string& detail) {
  XLOG(WARN) << "refused the control connection from " << s->remote_addr() << ": " << detail;
  (void)s->Send(wire::Goodbye{reason});
  s->Shutdown(reason);
}

}  // namespace xfer
