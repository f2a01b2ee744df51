// Pacing of a bounded spin-wait. The first steps only pause the CPU: when the awaited thread is
// running, its change lands within a microsecond or two, and a system call would only delay
// noticing it (a sched_yield costs about a microsecond: bench/RESULTS.md, "How the defaults
// were chosen"). Later steps yield the core: when threads outnumber cores (caller, streams,
// control), the awaited thread may need exactly it.
#pragma once

#include <sched.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace xfer {

class Backoff {
 public:
  // busy_steps: how many steps only pause before the yields begin.
  explicit Backoff(int busy_steps = 64) : busy_steps_(busy_steps) {}
  void Pause() {
    if (steps_ < busy_steps_) {
      ++steps_;
#if defined(__x86_64__) || defined(__i386__)
      _mm_pause();
#elif defined(__aarch64__)
      asm volatile("yield");
#endif
    } else {
      ::sched_yield();
    }
  }
  void Reset() { steps_ = 0; }

 private:
  int busy_steps_;
  int steps_ = 0;
};

}  // namespace xfer
