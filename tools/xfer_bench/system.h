// Small system helpers: the machine line, this executable, the --links note, engine options,
// page sizes, a progress line.
#pragma once

#include <unistd.h>

#include "config.h"

namespace xfer::bench {

std::string MachineLine();
std::string SelfExe();
// What the header says about --links for this transport: never silently ignored.
std::string LinksNote(const Config& c, const std::string& transport);
EngineOptions MakeEngineOptions(const Config& c);
// Why --set's KEY=VALUE cannot be set (an unknown key, a value not of its kind), or "".
std::string SetOptionArg(const std::string& kv);
// The kernel page size (KiB) of the mapping that holds p, from /proc/self/smaps; 0 if unknown.
uint64_t PageKbAt(const void* p);

// A progress line on stderr, only when stderr is a terminal.
class Progress {
 public:
  Progress() : on_(isatty(STDERR_FILENO) == 1) {}
  void Show(const std::string& what, uint64_t bytes, double done, double total, bool iters) {
    if (!on_) return;
    std::fprintf(stderr, "\r\033[K  %s %s B: %.1f / %.1f %s", what.c_str(), FormatSize(bytes).c_str(), done,
                 total, iters ? "requests" : "s");
    shown_ = true;
  }
  void Clear() {
    if (on_ && shown_) std::fprintf(stderr, "\r\033[K");
    shown_ = false;
  }

 private:
  bool on_;
  bool shown_ = false;
};

}  // namespace xfer::bench
