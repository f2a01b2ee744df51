#include "util/log.h"

#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace xfer::log {
namespace {

Level LevelFromEnv() {
  const char* v = std::getenv("XFER_LOG");
  if (v == nullptr) return Level::kWarn;
  std::string s(v);
  if (s == "error") return Level::kError;
  if (s == "info") return Level::kInfo;
  if (s == "debug") return Level::kDebug;
  return Level::kWarn;
}

const char* LevelName(Level l) {
  switch (l) {
    case Level::kError:
      return "E";
    case Level::kWarn:
      return "W";
    case Level::kInfo:
      return "I";
    case Level::kDebug:
      return "D";
  }
  return "?";
}

}  // namespace

bool Enabled(Level level) {
  static const Level max = LevelFromEnv();
  return level <= max;
}

Line::Line(Level level, const char* file, int line) {
  timeval tv{};
  gettimeofday(&tv, nullptr);
  tm t{};
  localtime_r(&tv.tv_sec, &t);
  char stamp[32];
  std::snprintf(stamp, sizeof stamp, "%02d:%02d:%02d.%06ld", t.tm_hour, t.tm_min, t.tm_sec,
                static_cast<long>(tv.tv_usec));
  const char* base = std::strrchr(file, '/');
  out_ << "xfer " << LevelName(level) << " " << stamp << " " << getpid() << " " << (base ? base + 1 : file)
       << ":" << line << "] ";
}

Line::~Line() {
  out_ << '\n';
  const std::string s = out_.str();
  ssize_t ignored = ::write(STDERR_FILENO, s.data(), s.size());
  (void)ignored;
}

}  // namespace xfer::log
