// Small pieces of message text shared by the engine and the transports.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

namespace xfer::text {

// "0x7f12..." for addresses in messages.
inline std::string Hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

// "what: <strerror(errno)>", for the call that just failed.
inline std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// Appends item to a separated list ("a; b"): the reasons in a message, the names in a line.
inline void Append(std::string* list, const std::string& item, std::string_view sep = "; ") {
  if (!list->empty()) list->append(sep);
  list->append(item);
}

// An enum whose values are 0..N-1, named by names[value]: the value named text, or false.
template <class E, size_t N>
bool ParseEnum(std::string_view text, const std::string_view (&names)[N], E* out) {
  for (size_t i = 0; i < N; ++i) {
    if (text == names[i]) {
      *out = static_cast<E>(i);
      return true;
    }
  }
  return false;
}
// The name of e, or "unknown" for a value outside the names.
template <class E, size_t N>
std::string_view EnumName(E e, const std::string_view (&names)[N]) {
  const size_t i = static_cast<size_t>(e);
  return i < N ? names[i] : "unknown";
}

}  // namespace xfer::text
