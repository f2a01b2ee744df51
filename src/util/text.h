// Small pieces of message text shared by the engine and the transports.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace xfer::text {

// "0x7f12..." for addresses in messages.
inline std::string Hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

// "what: <strerror(errno)>", for the call that just failed.
inline std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

}  // namespace xfer::text
