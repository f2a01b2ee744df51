// Mutual authentication of a control connection with a shared secret (docs/security.md).
//
//   initiator -> acceptor: AuthChallenge{nonce_i}
//   acceptor -> initiator: AuthChallenge{nonce_a}
//   initiator -> acceptor: AuthProof{name_i, incarnation_i, dialled, mac_i}
//   acceptor -> initiator: AuthProof{name_a, incarnation_a, "", mac_a}   (once mac_i checked out)
//   then the initiator's Hello, and the acceptor's
//
// id_i = name_i | incarnation_i | dialled (the address the initiator's connection reached),
// mac_i = HMAC(secret, "xfer-auth-v3 initiator" | nonce_i | nonce_a | id_i),
// mac_a = HMAC(secret, "xfer-auth-v3 acceptor" | nonce_i | nonce_a | id_i | id_a), and the
// session key both derive = HMAC(secret, "xfer-auth-v3 session" | the same), each field
// length-prefixed. Nonces are fresh on both sides, so a recorded handshake is worthless on a
// new connection; the acceptor says nothing but a nonce before the initiator has proved itself;
// each side checks who the other claims to be (Engine: not itself, and the name it dialled),
// and the acceptor that the initiator meant to reach it: `dialled` is its own end of the
// connection. A relay at another address, passing one engine's handshake to
// another, is thereby refused by both: its address is in the initiator's proof.
#pragma once

#include <cstdint>
#include <string>

#include "control/wire.h"
#include "util/crypto.h"

namespace xfer::control {

class Handshake {
 public:
  Handshake(std::string secret, bool initiator, std::string my_name, uint64_t my_incarnation);
  ~Handshake();
  Handshake(const Handshake&) = delete;
  Handshake& operator=(const Handshake&) = delete;

  // The initiator's, before its Proof: the address its connection reached (net::PeerOf).
  void set_dialled(std::string dialled) { dialled_ = std::move(dialled); }
  // This side's challenge (the same every call).
  const wire::AuthChallenge& Mine() const { return mine_; }
  // The other side's challenge.
  void TheirChallenge(const wire::AuthChallenge& theirs) { their_nonce_ = theirs.nonce; }
  // This side's proof. The acceptor's covers the initiator's identity: call it after Verify.
  wire::AuthProof Proof() const;
  // Checks the other side's proof (constant time) and keeps the identity it claims.
  bool Verify(const wire::AuthProof& theirs);
  // The identity the other side proved (after Verify returned true).
  const std::string& their_name() const { return their_.name; }
  uint64_t their_incarnation() const { return their_.incarnation; }
  // The acceptor's: the address the initiator proved it dialled.
  const std::string& their_dialled() const { return their_.dialled; }
  // The key both sides derive (after both proofs).
  crypto::Mac SessionKey() const;

 private:
  // label | nonce_i | nonce_a | id_i [| id_a], under the secret.
  crypto::Mac Tag(const char* label, bool with_acceptor) const;

  std::string secret_;
  const bool initiator_;
  const std::string my_name_;
  const uint64_t my_incarnation_;
  std::string dialled_;  // the initiator's
  wire::AuthChallenge mine_;
  std::string their_nonce_;
  wire::AuthProof their_;  // name and incarnation, once Verify saw them
};

}  // namespace xfer::control
