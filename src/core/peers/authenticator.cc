#include "core/peers/authenticator.h"

#include <sys/stat.h>

#include <fstream>
#include <iterator>

#ifdef XFER_HAVE_SODIUM
#include <sodium.h>
#endif

#include "util/crypto.h"
#include "util/log.h"

namespace xfer {
namespace {

constexpr size_t kMaxSecretBytes = 4096;

// The name an acceptor proved is the one we dialled: the same, or the same port on a wildcard
// address (an engine listening on 0.0.0.0 or [::] calls itself that). Relaying our handshake
// to another engine would show that engine's name.
bool IsTheEngineDialled(const std::string& dialled, const std::string& proved) {
  if (dialled == proved) return true;
  net::Address d, p;
  if (!net::ParseAddress(dialled, &d).ok() || !net::ParseAddress(proved, &p).ok()) return false;
  return d.port == p.port && (p.host == "0.0.0.0" || p.host == "::" || p.host == d.host);
}

void Wipe(std::string* s) {
#ifdef XFER_HAVE_SODIUM
  sodium_memzero(s->data(), s->size());
#endif
  s->clear();
}

std::string KeyOf(const control::Handshake& hs) {
  const crypto::Mac key = hs.SessionKey();
  return std::string(reinterpret_cast<const char*>(key.data()), key.size());
}

}  // namespace

Status Authenticator::Load(EngineOptions* options) {
  const EngineOptions& o = *options;
  auto bad = [](const std::string& why) { return Status{StatusCode::kInvalidArgument, why}; };
  if (!o.secret.empty() && !o.secret_file.empty()) return bad("give secret or secret_file, not both");
  secret_ = o.secret;
  if (!o.secret_file.empty()) {
    std::ifstream in(o.secret_file, std::ios::binary);
    if (!in) return bad("cannot read secret_file '" + o.secret_file + "'");
    secret_.resize(kMaxSecretBytes + 1);  // (one byte more tells a file too long; /dev/zero ends)
    in.read(secret_.data(), static_cast<std::streamsize>(secret_.size()));
    secret_.resize(static_cast<size_t>(in.gcount()));
    struct stat st {};
    if (::stat(o.secret_file.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
      XLOG(WARN) << "secret_file '" << o.secret_file << "' is readable by other users than its owner "
                 << "(chmod 600 it)";
    }
  }
  if (secret_.empty()) return Status::Ok();
  Status s;
  if (secret_.size() < 16) s = bad("the secret must be at least 16 bytes");
  if (secret_.size() > kMaxSecretBytes) s = bad("the secret must be at most 4096 bytes");
  if (s.ok() && !crypto::Available()) {
    s = {StatusCode::kUnsupported, "a secret needs libsodium, which this build lacks (libsodium-dev)"};
  }
  if (!s.ok()) Wipe(&secret_);
  Wipe(&options->secret);  // (secret_ holds it from here on)
  return s;
}

void Authenticator::Forget() { Wipe(&secret_); }

Status Authenticator::Outbound(control::Session& s, const std::string& remote, Clock::time_point deadline) {
  // (Our proof names the address our connection reached: the acceptor checks it is its own.)
  auto hs = std::make_shared<control::Handshake>(secret_, true, self_.name, self_.incarnation);
  hs->set_dialled(net::PeerOf(s.fd()));
  auto denied = [&](const std::string& why) {
    return Status{StatusCode::kRemoteAccessDenied, "'" + remote + "' " + why};
  };
  auto failed = [&](const Status& st) {
    return Status{st.code(), "authenticating with '" + remote + "': " + st.message()};
  };
  s.set_max_payload(wire::kMaxPayloadBeforeAuth);  // (until the peer proved itself)
  wire::Message m;
  Status st = s.Send(hs->Mine());
  if (st.ok()) st = s.FlushUntil(deadline);
  if (st.ok()) st = s.ReadOne(deadline, &m);
  if (!st.ok()) return failed(st);
  if (auto* bye = std::get_if<wire::Goodbye>(&m)) return denied("refused us: " + bye->reason);
  auto* challenge = std::get_if<wire::AuthChallenge>(&m);
  if (challenge == nullptr) {
    return denied("answered without authenticating: it has no secret (both engines need the same one)");
  }
  hs->TheirChallenge(*challenge);
  st = s.Send(hs->Proof());
  if (st.ok()) st = s.FlushUntil(deadline);
  if (st.ok()) st = s.ReadOne(deadline, &m);
  if (!st.ok()) return failed(st);
  if (auto* bye = std::get_if<wire::Goodbye>(&m)) {
    return denied("refused our proof: " + bye->reason + " (is the secret the same on both engines?)");
  }
  auto* proof = std::get_if<wire::AuthProof>(&m);
  if (proof == nullptr || !hs->Verify(*proof)) {
    return denied("failed to prove it knows our secret (a different secret?)");
  }
  if (hs->their_incarnation() == self_.incarnation || !IsTheEngineDialled(remote, hs->their_name())) {
    return denied("proved to be '" + hs->their_name() + "', not the engine dialled (a relay?)");
  }
  s.auth = hs;
  s.auth_key = KeyOf(*hs);
  s.authenticated = true;
  s.set_max_payload(wire::kMaxPayload);
  return Status::Ok();
}

bool Authenticator::OnUnauthenticated(const std::shared_ptr<control::Session>& s, wire::Message& msg) {
  if (!s->shutdown_reason().empty()) return true;  // refused already: the rest of its frames
  auto* challenge = std::get_if<wire::AuthChallenge>(&msg);
  if (secret_.empty()) {
    if (challenge == nullptr) return false;  // (a hello: as always)
    Refuse(s, "authentication is off on " + self_.name + " (it has no secret)",
           "it asked to authenticate, and this engine has no secret");
    return true;
  }
  if (s->authenticated) return false;
  if (challenge != nullptr && !s->auth) {
    s->auth = std::make_shared<control::Handshake>(secret_, false, self_.name, self_.incarnation);
    s->auth->TheirChallenge(*challenge);
    s->SendSoon(s->auth->Mine());  // a nonce: nothing about this engine yet
    return true;
  }
  auto* proof = std::get_if<wire::AuthProof>(&msg);
  if (proof != nullptr && s->auth) {
    if (!s->auth->Verify(*proof)) {
      Refuse(s, "authentication failed", "wrong secret, or a replayed handshake");
    } else if (proof->incarnation == self_.incarnation) {
      Refuse(s, "authentication failed", "it claims to be this engine (our own handshake reflected?)");
    } else if (const std::string here = net::LocalOf(s->fd()); proof->dialled != here) {
      Refuse(s, "authentication failed",
             "its proof is for " + (proof->dialled.empty() ? std::string("no address") : proof->dialled) +
                 ", not this engine (" + here + "): a handshake relayed from another address");
    } else {
      s->authenticated = true;
      s->auth_key = KeyOf(*s->auth);
      s->set_max_payload(wire::kMaxPayload);
      s->SendSoon(s->auth->Proof());
    }
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

void Authenticator::Refuse(const std::shared_ptr<control::Session>& s, const std::string& reason,
                           const std::string& detail) {
  if (uint64_t more = 0; refusal_log_.Due(&more)) {  // (control thread only)
    XLOG(WARN) << "refused the control connection from " << s->remote_addr() << ": " << detail
               << log::Limit::More(more);
  }
  (void)s->Send(wire::Goodbye{reason});
  s->Shutdown(reason);
}

}  // namespace xfer
