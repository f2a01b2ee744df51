// Minimal leveled logging to stderr: XLOG(WARN) << "what went wrong";
// The level comes from XFER_LOG (error|warn|info|debug; default warn).
#pragma once

#include <sstream>

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

}  // namespace xfer::log

#define XLOG_LEVEL_ERROR ::xfer::log::Level::kError
#define XLOG_LEVEL_WARN ::xfer::log::Level::kWarn
#define XLOG_LEVEL_INFO ::xfer::log::Level::kInfo
#define XLOG_LEVEL_DEBUG ::xfer::log::Level::kDebug
#define XLOG(level)                                 \
  !::xfer::log::Enabled(XLOG_LEVEL_##level)         \
      ? (void)0                                     \
      : ::xfer::log::Voidify() & ::xfer::log::Line(XLOG_LEVEL_##level, __FILE__, __LINE__)
