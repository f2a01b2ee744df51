// Deadlines from timeouts, without overflow on huge values (a timeout of years means "none").
#pragma once

#include <algorithm>
#include <chrono>

namespace xfer {

inline std::chrono::steady_clock::time_point DeadlineAfter(std::chrono::steady_clock::time_point from,
                                                           std::chrono::milliseconds t) {
  constexpr std::chrono::milliseconds kMax = std::chrono::hours(24 * 365);
  return from + std::clamp(t, std::chrono::milliseconds(0), kMax);
}
inline std::chrono::steady_clock::time_point DeadlineAfter(std::chrono::milliseconds t) {
  return DeadlineAfter(std::chrono::steady_clock::now(), t);
}

}  // namespace xfer
