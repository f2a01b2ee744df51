// Minimal leveled logging to stderr: XLOG(WARN) << "what went wrong";
// The level comes from XFER_LOG (error|warn|info|debug; default warn).
#pragma once

#include <chrono>
#include <cstdint>
#include <sstream>
#include <string>

namespace xfer::log {

enum class Level { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

bool Enabled(Level level);

// Collects one line and writes it with a single write(2) when destroyed.
class Line {
 public:
  Line(Level level, const char* file, int line);
  ~Line();
  template <class T>
  Line& operator<<(const T& v) {
    out_ << v;
    return *this;
  }

 private:
  std::ostringstream out_;
};

// Turns `Line << ...` into a void expression, so XLOG works as a single statement anywhere.
struct Voidify {
  void operator&(Line&) {}
};

// A log line that may come often (a peer's refusals): at most one per interval. Due() says
// whether to log now; *held_back: how many were not logged since the last line. Not
// thread-safe: the caller's thread, or a lock of the caller's.
class Limit {
 public:
  explicit Limit(std::chrono::milliseconds every = std::chrono::seconds(1)) : every_(every) {}
  bool Due(uint64_t* held_back) {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ < every_) {
      ++held_back_;
      return false;
    }
    last_ = now;
    *held_back = held_back_;
    held_back_ = 0;
    return true;
  }
  // " (and N more since the last such line)", or "" when none was held back.
  static std::string More(uint64_t held_back) {
    return held_back == 0 ? "" : " (and " + std::to_string(held_back) + " more since the last such line)";
  }

 private:
  const std::chrono::milliseconds every_;
  std::chrono::steady_clock::time_point last_{};
  uint64_t held_back_ = 0;
};

}  // namespace xfer::log

#define XLOG_LEVEL_ERROR ::xfer::log::Level::kError
#define XLOG_LEVEL_WARN ::xfer::log::Level::kWarn
#define XLOG_LEVEL_INFO ::xfer::log::Level::kInfo
#define XLOG_LEVEL_DEBUG ::xfer::log::Level::kDebug
#define XLOG(level)                         \
  !::xfer::log::Enabled(XLOG_LEVEL_##level) \
      ? (void)0                             \
      : ::xfer::log::Voidify() & ::xfer::log::Line(XLOG_LEVEL_##level, __FILE__, __LINE__)
