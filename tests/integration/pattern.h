// Deterministic data patterns and a fast content hash, shared by the tests and xfer_test_peer
// (header-only so the peer needs nothing but the xfer library).
#pragma once

#include <cstdint>
#include <cstring>

namespace xfer_test {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Fills [p, p+len) with pseudo-random bytes determined by (seed, len): byte k of the output is
// byte k of the stream SplitMix64(seed*K + 0), SplitMix64(seed*K + 1), ... (little-endian words).
inline void FillPattern(void* p, uint64_t len, uint64_t seed) {
  auto* b = static_cast<unsigned char*>(p);
  const uint64_t base = seed * 0xD1B54A32D192ED03ull;
  const uint64_t words = len / 8;
  for (uint64_t i = 0; i < words; ++i) {
    const uint64_t w = SplitMix64(base + i);
    std::memcpy(b + 8 * i, &w, 8);
  }
  if (len % 8 != 0) {
    const uint64_t w = SplitMix64(base + words);
    std::memcpy(b + 8 * words, &w, len % 8);
  }
}

// A 64-bit hash of the bytes [p, p+len). Not cryptographic; any changed byte changes it with
// overwhelming probability.
inline uint64_t Hash64(const void* p, uint64_t len) {
  const auto* b = static_cast<const unsigned char*>(p);
  uint64_t h = 0x6A09E667F3BCC909ull ^ (len * 0x9E3779B97F4A7C15ull);
  const uint64_t words = len / 8;
  for (uint64_t i = 0; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, b + 8 * i, 8);
    h = (h ^ w) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 29;
  }
  if (len % 8 != 0) {
    uint64_t w = 0;
    std::memcpy(&w, b + 8 * words, len % 8);
    h = (h ^ w ^ 0xA5) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 29;
  }
  return SplitMix64(h);
}

}  // namespace xfer_test
