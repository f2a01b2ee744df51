// The primitives peer authentication needs, from libsodium (Debian: libsodium-dev): random
// nonces, HMAC-SHA-256, constant-time comparison. No cryptography is written here.
// Without libsodium (a build on a machine without it) Available() is false, and the engine
// refuses a secret at Initialize.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

namespace xfer::crypto {

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;
using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;

// True when this build has libsodium and it initialized.
bool Available();
// Fresh random bytes (libsodium's CSPRNG).
Nonce RandomNonce();
// HMAC-SHA-256 of message under key (any length).
Mac Hmac(std::span<const uint8_t> key, std::span<const uint8_t> message);
// a == b, in time independent of where they differ.
bool Equal(std::span<const uint8_t> a, std::span<const uint8_t> b);

inline std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace xfer::crypto
