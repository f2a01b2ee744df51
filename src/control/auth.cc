#include "control/auth.h"

#ifdef XFER_HAVE_SODIUM
#include <sodium.h>
#endif

namespace xfer::control {
namespace {

void Append(std::string* t, const std::string& field) {
  const uint32_t n = static_cast<uint32_t>(field.size());
  t->append(reinterpret_cast<const char*>(&n), sizeof n);
  t->append(field);
}

void Append(std::string* t, const std::string& name, uint64_t incarnation) {
  Append(t, name);
  t->append(reinterpret_cast<const char*>(&incarnation), sizeof incarnation);
}

}  // namespace

Handshake::Handshake(std::string secret, bool initiator, std::string my_name, uint64_t my_incarnation)
    : secret_(std::move(secret)),
      initiator_(initiator),
      my_name_(std::move(my_name)),
      my_incarnation_(my_incarnation) {
  const crypto::Nonce n = crypto::RandomNonce();
  mine_.nonce.assign(reinterpret_cast<const char*>(n.data()), n.size());
}

Handshake::~Handshake() {
#ifdef XFER_HAVE_SODIUM
  sodium_memzero(secret_.data(), secret_.size());
#endif
}

wire::AuthProof Handshake::Proof() const {
  const crypto::Mac mac = Tag(initiator_ ? "xfer-auth-v3 initiator" : "xfer-auth-v3 acceptor", !initiator_);
  return wire::AuthProof{my_name_, my_incarnation_, dialled_,
                         std::string(reinterpret_cast<const char*>(mac.data()), mac.size())};
}

bool Handshake::Verify(const wire::AuthProof& theirs) {
  if (their_nonce_.empty()) return false;
  their_ = theirs;
  const crypto::Mac expected =
      Tag(initiator_ ? "xfer-auth-v3 acceptor" : "xfer-auth-v3 initiator", initiator_);
  return crypto::Equal(crypto::Bytes(theirs.mac), expected);
}

crypto::Mac Handshake::SessionKey() const { return Tag("xfer-auth-v3 session", true); }

crypto::Mac Handshake::Tag(const char* label, bool with_acceptor) const {
  std::string t(label);
  Append(&t, initiator_ ? mine_.nonce : their_nonce_);
  Append(&t, initiator_ ? their_nonce_ : mine_.nonce);
  if (initiator_) {
    Append(&t, my_name_, my_incarnation_);
    Append(&t, dialled_);
    if (with_acceptor) Append(&t, their_.name, their_.incarnation);
  } else {
    Append(&t, their_.name, their_.incarnation);
    Append(&t, their_.dialled);
    if (with_acceptor) Append(&t, my_name_, my_incarnation_);
  }
  return crypto::Hmac(crypto::Bytes(secret_), crypto::Bytes(t));
}

}  // namespace xfer::control
