#include "control/auth.h"

namespace xfer::control {
namespace {

void Append(std::string* t, const std::string& field) {
  const uint32_t n = static_cast<uint32_t>(field.size());
  t->append(reinterpret_cast<const char*>(&n), sizeof n);
  t->append(field);
}

void Append(std::string* t, const wire::AuthChallenge& c) {
  Append(t, c.nonce);
  Append(t, c.name);
  t->append(reinterpret_cast<const char*>(&c.incarnation), sizeof c.incarnation);
}

}  // namespace

Handshake::Handshake(const std::string& secret, bool initiator, std::string my_name,
                     uint64_t my_incarnation)
    : secret_(secret), initiator_(initiator) {
  const crypto::Nonce n = crypto::RandomNonce();
  mine_.nonce.assign(reinterpret_cast<const char*>(n.data()), n.size());
  mine_.name = std::move(my_name);
  mine_.incarnation = my_incarnation;
}

wire::AuthProof Handshake::Answer(const wire::AuthChallenge& theirs) {
  theirs_ = theirs;
  transcript_.clear();
  Append(&transcript_, initiator_ ? mine_ : theirs_);
  Append(&transcript_, initiator_ ? theirs_ : mine_);
  const crypto::Mac mac = Tag(initiator_ ? "xfer-auth-v1 initiator" : "xfer-auth-v1 acceptor");
  return wire::AuthProof{std::string(reinterpret_cast<const char*>(mac.data()), mac.size())};
}

bool Handshake::Verify(const wire::AuthProof& theirs) const {
  if (transcript_.empty()) return false;
  const crypto::Mac expected = Tag(initiator_ ? "xfer-auth-v1 acceptor" : "xfer-auth-v1 initiator");
  return crypto::Equal(crypto::Bytes(theirs.mac), expected);
}

crypto::Mac Handshake::SessionKey() const { return Tag("xfer-auth-v1 session"); }

crypto::Mac Handshake::Tag(const char* label) const {
  std::string message(label);
  message += transcript_;
  return crypto::Hmac(crypto::Bytes(secret_), crypto::Bytes(message));
}

}  // namespace xfer::control
