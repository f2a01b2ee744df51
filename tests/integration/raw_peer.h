// Speaking the wire protocol the way a peer engine would, or an attacker: raw control sessions
// (with or without the secret's handshake) and raw tcp data connections. The formats:
// src/control/wire.h, src/control/auth.h, src/transport/tcp/tcp_transport.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "control/auth.h"
#include "control/session.h"
#include "control/wire.h"
#include "util/net.h"

namespace xfer_test {

// A raw control connection to the engine `name` (host:port).
struct RawSession {
  explicit RawSession(const std::string& name);
  void Send(const xfer::wire::Message& m);  // and flushes it
  // Our side of the handshake (hs: its secret, name, incarnation): challenges, then our proof;
  // returns the proof sent, and whether the engine answered with a proof that checks out (when
  // it answers otherwise, ReadAll() gets that frame first).
  xfer::wire::AuthProof Authenticate(xfer::control::Handshake& hs, bool* verified = nullptr);
  // Our hello, and the engine's answer (nullopt-like: an empty name when it sent none).
  xfer::wire::Hello Hello(const xfer::wire::Hello& ours);
  // Every frame until the engine closes (or 10 s pass).
  std::vector<xfer::wire::Message> ReadAll();

  std::shared_ptr<xfer::control::Session> s;
  std::vector<xfer::wire::Message> early;  // read by Authenticate or Hello, not what they wanted
};

xfer::wire::Hello HelloOf(const std::string& name, uint64_t incarnation);  // from another host
bool AnyHello(const std::vector<xfer::wire::Message>& frames);
std::string GoodbyeReason(const std::vector<xfer::wire::Message>& frames);  // "(no goodbye)"
// Sends hello on raw, then expects the engine to close with a Goodbye of that reason and
// without having sent its own hello.
void ExpectRefused(RawSession& raw, const xfer::wire::Hello& hello, const std::string& reason);
// A recorded handshake (our challenge and proof) replayed on a new connection to the engine:
// its fresh nonce makes the old proof wrong, and the hello after it is refused.
void ExpectReplayRefused(const std::string& engine, const xfer::wire::AuthChallenge& challenge,
                         const xfer::wire::AuthProof& proof, const xfer::wire::Hello& hello);

// The tcp data port an engine's hello offers (0: none).
uint16_t DataPortOf(const xfer::wire::Hello& engine);
// A tcp data connection to the engine whose hello is `engine`, as the peer of incarnation `me`:
// the hello, the answer to the challenge under `key` when the engine sends one (a session's
// key, Handshake::SessionKey), and the engine's verdict (0: accepted). False when the engine
// closed the connection instead.
bool OpenDataConnection(const xfer::wire::Hello& engine, uint64_t me, const std::string& key,
                        xfer::net::Fd* fd, uint32_t* verdict);
std::string KeyOf(const xfer::control::Handshake& hs);  // its session key, as bytes
// The head of a tcp data connection's WRITE of len bytes at addr (header and its one
// descriptor); the payload would follow.
std::vector<uint8_t> WriteFrameHead(uint64_t addr, uint64_t len);

}  // namespace xfer_test
