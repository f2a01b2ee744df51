// Whether StreamPool::SharedCopy hands half of a copy to a spinning stream, or copies it all on
// the caller: decided by measurement, per size class, as the copies go.
//
// Sharing pays for memory that is not in the caches, and for blocks in the caches from 64 KiB,
// while the other core is free. It loses when that core is taken by other work (another
// process, a hyperthread sibling that is busy, a hypervisor that runs something else there):
// the caller then waits for the half it handed over. Neither can be known in advance, so each
// mode keeps a moving average of its cost per byte, from timed copies, and the cheaper one is
// used. Of every 128 copies of a class, 7 or 8 in the preferred mode are timed; and the other
// mode is tried in a run of 4 copies, the last 2 timed (the first ones move cache lines from
// one core to the other, which the mode does not cost once it runs). Each trial the other mode
// loses doubles the copies until the next (up to 64 x 128): a mode that keeps losing costs
// little, and sharing that keeps losing seldom wakes a stream. A change of mode starts the
// trials over, every 128 copies.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace xfer {

class ShareRule {
 public:
  enum Mode : int { kAlone = 0, kShare = 1 };
  struct Choice {
    Mode mode;
    bool timed;       // Record what this copy took
    bool ends_trial;  // the last copy of a trial of the other mode
  };
  static constexpr uint32_t kPeriod = 128;     // copies
  static constexpr uint32_t kTimeEvery = 16;   // copies in the preferred mode per timed one
  static constexpr uint32_t kTrial = 4;        // copies in a row in the other mode
  static constexpr uint32_t kMaxBackoff = 6;   // trials at least every 2^6 periods
  static constexpr size_t kMinLen = 16 << 10;  // the smallest class; smaller copies never share

  static constexpr int kClasses = 8;  // 16 KiB, 32 KiB, ..., 2 MiB and above
  static size_t ClassOf(size_t len) {
    const size_t units = std::max<size_t>(len / kMinLen, 1);
    return std::min<size_t>(std::bit_width(units) - 1, kClasses - 1);
  }

  // tick: a count that the calling thread advances by one per copy of len's class.
  Choice Choose(size_t len, uint32_t tick) const {
    const Class& c = classes_[ClassOf(len)];
    const Mode preferred = Preferred(c);
    const uint32_t at = tick % kPeriod;
    const uint32_t every = 1u << c.backoff.load(std::memory_order_relaxed);
    if (at < kTrial && (tick / kPeriod) % every == 0) {
      return {Other(preferred), at >= kTrial / 2, at == kTrial - 1};
    }
    return {preferred, at % kTimeEvery == 0, false};
  }

  // A timed copy of len bytes that ran in mode and took that long. ends_trial: it was the
  // last copy of a trial (Choice::ends_trial): when the trial's mode still loses, the trials
  // back off.
  void Record(size_t len, Mode mode, std::chrono::nanoseconds took, bool ends_trial = false) {
    Class& c = classes_[ClassOf(len)];
    const Mode before = Preferred(c);
    uint64_t cost = std::max<uint64_t>(1, static_cast<uint64_t>(took.count()) * kCostScale / len);
    const uint64_t old = c.cost[mode].load(std::memory_order_relaxed);
    // A sample counts for at most twice the average: one copy that waited for a preempted
    // stream must not rule a mode out for thousands of copies (a lasting slowdown still
    // doubles the average within 6 samples).
    if (old != 0) cost = std::min(cost, 2 * old);
    // (Threads racing here may lose an update: the averages are a guide, not a count.)
    c.cost[mode].store(old == 0 ? cost : old - old / kWeight + cost / kWeight, std::memory_order_relaxed);
    const Mode after = Preferred(c);
    const uint32_t backoff = c.backoff.load(std::memory_order_relaxed);
    if (after != before) {
      c.backoff.store(0, std::memory_order_relaxed);
    } else if (ends_trial && mode != after && backoff < kMaxBackoff) {
      c.backoff.store(backoff + 1, std::memory_order_relaxed);
    }
  }

  // A timed copy chose mode but could not run in it (no stream was spinning to take a half).
  // When that mode is out of favour, its average is lowered a little, so that a verdict on old
  // measurements is tried again in time, rather than never.
  void Unmeasured(size_t len, Mode mode) {
    Class& c = classes_[ClassOf(len)];
    const uint64_t old = c.cost[mode].load(std::memory_order_relaxed);
    if (Preferred(c) == mode || old <= 1) return;  // (0: not measured, so tried already)
    c.cost[mode].store(old - std::max<uint64_t>(old / kForget, 1), std::memory_order_relaxed);
  }

  // The mode an untimed copy of len bytes runs in: the cheaper by the averages; a mode with no
  // measurement yet is tried first (sharing first: the default where nothing is known).
  Mode Preferred(size_t len) const { return Preferred(classes_[ClassOf(len)]); }
  // The averages, in 1/65536 ns a byte (0: none yet), for tests and diagnostics.
  uint64_t AverageCost(size_t len, Mode mode) const {
    return classes_[ClassOf(len)].cost[mode].load(std::memory_order_relaxed);
  }
  // Periods between trials of the other mode, as a power of 2.
  uint32_t Backoff(size_t len) const {
    return classes_[ClassOf(len)].backoff.load(std::memory_order_relaxed);
  }

 private:
  static constexpr uint64_t kCostScale = 1 << 16;  // the averages' unit: 1/65536 ns a byte
  static constexpr uint64_t kWeight = 8;           // a new sample moves the average by 1/8 of the gap
  static constexpr uint64_t kForget = 64;          // Unmeasured lowers the average by 1/64
  struct alignas(64) Class {
    std::atomic<uint64_t> cost[2]{};  // by Mode
    std::atomic<uint32_t> backoff{0};
  };
  static Mode Other(Mode m) { return m == kShare ? kAlone : kShare; }
  static Mode Preferred(const Class& c) {
    const uint64_t share = c.cost[kShare].load(std::memory_order_relaxed);
    const uint64_t alone = c.cost[kAlone].load(std::memory_order_relaxed);
    if (share == 0) return kShare;
    if (alone == 0) return kAlone;
    return share <= alone ? kShare : kAlone;
  }
  Class classes_[kClasses];
};

}  // namespace xfer
