// Mutual authentication of a control connection with a shared secret (docs/security.md).
//
//   initiator -> acceptor: AuthChallenge{nonce_i, name_i, incarnation_i}
//   acceptor -> initiator: AuthChallenge{nonce_a, name_a, incarnation_a}, AuthProof{mac_a}
//   initiator -> acceptor: AuthProof{mac_i}, then its Hello
//
// T = both challenges (the initiator's first), each field length-prefixed;
// mac_a = HMAC(secret, "xfer-auth-v1 acceptor" | T), mac_i = HMAC(secret, "xfer-auth-v1
// initiator" | T), and the session key both sides derive = HMAC(secret, "xfer-auth-v1 session" |
// T). Fresh nonces on both sides make a recorded handshake worthless on a new connection.
#pragma once

#include <cstdint>
#include <string>

#include "control/wire.h"
#include "util/crypto.h"

namespace xfer::control {

class Handshake {
 public:
  // me: this engine's name and incarnation; the secret must outlive the Handshake.
  Handshake(const std::string& secret, bool initiator, std::string my_name, uint64_t my_incarnation);
  // This side's challenge (the same every call).
  const wire::AuthChallenge& Mine() const { return mine_; }
  // Takes the peer's challenge; returns this side's proof.
  wire::AuthProof Answer(const wire::AuthChallenge& theirs);
  // The peer's proof, checked in constant time (after Answer).
  bool Verify(const wire::AuthProof& theirs) const;
  const wire::AuthChallenge& theirs() const { return theirs_; }
  // The key both sides derive (after Answer).
  crypto::Mac SessionKey() const;

 private:
  crypto::Mac Tag(const char* label) const;

  const std::string& secret_;
  const bool initiator_;
  wire::AuthChallenge mine_, theirs_;
  std::string transcript_;
};

}  // namespace xfer::control
