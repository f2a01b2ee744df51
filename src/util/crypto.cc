#include "util/crypto.h"

#include <cstdlib>

#ifdef XFER_HAVE_SODIUM
#include <sodium.h>
#endif

namespace xfer::crypto {

#ifdef XFER_HAVE_SODIUM

bool Available() {
  static const bool ok = sodium_init() >= 0;
  return ok;
}

Nonce RandomNonce() {
  Nonce n;
  randombytes_buf(n.data(), n.size());
  return n;
}

Mac Hmac(std::span<const uint8_t> key, std::span<const uint8_t> message) {
  crypto_auth_hmacsha256_state st;
  crypto_auth_hmacsha256_init(&st, key.data(), key.size());
  crypto_auth_hmacsha256_update(&st, message.data(), message.size());
  Mac mac;
  crypto_auth_hmacsha256_final(&st, mac.data());
  return mac;
}

bool Equal(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  return a.size() == b.size() && sodium_memcmp(a.data(), b.data(), a.size()) == 0;
}

#else  // Without libsodium nothing calls these: Initialize refuses a secret.

bool Available() { return false; }
Nonce RandomNonce() { std::abort(); }
Mac Hmac(std::span<const uint8_t>, std::span<const uint8_t>) { std::abort(); }
bool Equal(std::span<const uint8_t>, std::span<const uint8_t>) { std::abort(); }

#endif

}  // namespace xfer::crypto
