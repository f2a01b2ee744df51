#include "util/futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <ctime>
#include <vector>

namespace xfer::futex {
namespace {

#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449  // (the same number on every architecture)
#endif

// futex_waitv's per-word record and flags (linux/futex.h of Linux 5.16; spelled out for
// older headers).
struct WaitV {
  uint64_t val;
  uint64_t uaddr;
  uint32_t flags;
  uint32_t reserved;
};
constexpr uint32_t kSize32 = 0x02;
constexpr uint32_t kPrivate = 128;
constexpr size_t kMaxWords = 128;

std::atomic<bool> waitv_missing{false};

timespec ToTimespec(std::chrono::nanoseconds d) {
  return {static_cast<time_t>(d.count() / 1000000000), static_cast<long>(d.count() % 1000000000)};
}

bool Changed(std::span<const Watch> words) {
  for (const Watch& w : words) {
    if (w.word->load(std::memory_order_acquire) != w.seen) return true;
  }
  return false;
}

}  // namespace

void Wake(std::atomic<uint32_t>* word, bool shared) {
  (void)::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), shared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE,
                  INT_MAX, nullptr, nullptr, 0);
}

void WaitAny(std::span<const Watch> words, std::chrono::steady_clock::time_point until) {
  using namespace std::chrono;
  if (words.empty()) return;
  if (words.size() == 1) {
    const auto now = steady_clock::now();
    if (now >= until) return;
    const timespec rel = ToTimespec(duration_cast<nanoseconds>(until - now));
    (void)::syscall(SYS_futex, reinterpret_cast<uint32_t*>(words[0].word),
                    words[0].shared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE, words[0].seen, &rel, nullptr, 0);
    return;
  }
  if (words.size() <= kMaxWords && !waitv_missing.load(std::memory_order_relaxed)) {
    WaitV v[kMaxWords];
    for (size_t i = 0; i < words.size(); ++i) {
      v[i] = {words[i].seen, reinterpret_cast<uint64_t>(words[i].word),
              kSize32 | (words[i].shared ? 0 : kPrivate), 0};
    }
    // (An absolute time on CLOCK_MONOTONIC, the clock steady_clock reads.)
    const timespec abs = ToTimespec(duration_cast<nanoseconds>(until.time_since_epoch()));
    const long r = ::syscall(SYS_futex_waitv, v, words.size(), 0, &abs, CLOCK_MONOTONIC);
    // (ENOSYS: before Linux 5.16; EPERM: a seccomp filter that predates it; EINVAL: flags it
    // does not know. Then slices, from now on.)
    if (r >= 0 || (errno != ENOSYS && errno != EPERM && errno != EINVAL)) return;
    waitv_missing.store(true, std::memory_order_relaxed);
  }
  // Slices of 1 ms on the first word, checking the others between them.
  while (!Changed(words)) {
    const auto now = steady_clock::now();
    if (now >= until) return;
    const timespec slice = ToTimespec(std::min<nanoseconds>(until - now, milliseconds(1)));
    (void)::syscall(SYS_futex, reinterpret_cast<uint32_t*>(words[0].word),
                    words[0].shared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE, words[0].seen, &slice, nullptr, 0);
  }
}

}  // namespace xfer::futex
