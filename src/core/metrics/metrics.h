// What an engine counts (Engine::GetMetrics; docs/metrics.md has every metric).
//
// The data path adds to per-thread shards: a thread owns its shard and adds with a plain load
// and store (no locked instruction, no cache line shared with another thread), and a snapshot
// sums the shards. Past kMaxShards threads, the rest share one shard with atomic adds. Rare
// events (sessions, failures, notifications) are atomics or a locked map. Nothing allocates
// per request.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "xfer/metrics.h"
#include "xfer/status.h"
#include "xfer/types.h"

namespace xfer {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;
// A counter's or gauge's sample.
inline MetricSample ValueSample(MetricLabels labels, double value) {
  MetricSample s;
  s.labels = std::move(labels);
  s.value = value;
  return s;
}
// Adds a sample of the metric `name` to *out (the metric first, when it is not there yet):
// how each service reports its own gauges (Engine::GetMetrics).
void AddValue(MetricsSnapshot* out, std::string name, MetricType type, std::string help, double value,
              MetricLabels labels = {});

// A thread's cached shards (EngineMetrics::Mine), of the last engines it counted for: owner is
// an EngineMetrics' id, never 0 and never reused.
struct MetricsThreadShard {
  uint64_t owner = 0;
  void* shard = nullptr;
};
inline constexpr size_t kCachedShards = 4;
inline thread_local MetricsThreadShard this_thread_shards_[kCachedShards];
inline thread_local size_t this_thread_next_shard_ = 0;  // the entry a miss replaces

class EngineMetrics {
 public:
  using Clock = std::chrono::steady_clock;
  using PeerSlot = uint16_t;
  static constexpr int kOps = 2;
  static constexpr int kBackends = 8;  // the most backends a build may have
  static constexpr size_t kMaxShards = 256;
  // Request durations: upper bounds in seconds (then +Inf).
  static constexpr double kDurationBounds[] = {250e-9, 500e-9, 1e-6,   2e-6,   5e-6, 10e-6, 20e-6, 50e-6,
                                               100e-6, 200e-6, 500e-6, 1e-3,   2e-3, 5e-3,  10e-3, 20e-3,
                                               50e-3,  100e-3, 200e-3, 500e-3, 1,    2,     5,     10};
  static constexpr int kDurationBuckets = std::size(kDurationBounds) + 1;
  // Descriptors per request: 1, 2, 4, ... 65536, then +Inf.
  static constexpr int kDescBuckets = 18;
  // Inline copies (a descriptor copied on the caller's thread, well under a microsecond) are
  // timed one in kInlineSample (per peer, op and backend), each timed one standing for
  // kInlineSample: two clock reads would cost several percent of such a copy.
  static constexpr uint64_t kInlineSample = 64;

  // backends: the build's backend names (transport::BackendNames), at most kBackends.
  // max_peers: distinct values of the peer label; later peers are counted as "other".
  EngineMetrics(uint32_t max_peers, std::vector<std::string> backends);
  EngineMetrics(const EngineMetrics&) = delete;
  EngineMetrics& operator=(const EngineMetrics&) = delete;

  // The label slot of a peer (by name).
  PeerSlot SlotOf(const std::string& peer);
  // A session was installed with the peer of that key (PeerTable's): counts it, and as a
  // reconnect when the key had one before (the first 64 Ki keys are remembered).
  void SessionOpened(const std::string& key);

  // --- the data path (any thread)
  // A batch moved its bytes.
  void Moved(PeerSlot peer, Op op, int backend, uint64_t bytes);
  // A request was handed to the engine (not counted for inline copies: never in flight).
  void Started(Op op, uint64_t bytes);
  // A request ended (after Started); start: when it was submitted.
  void Ended(PeerSlot peer, Op op, int backend, uint64_t bytes, uint64_t descriptors, Clock::time_point start,
             StatusCode code);
  // One descriptor copied on the caller's thread: BeginInline before the copy, EndInline
  // after it (it moved, and ended ok: Moved and Ended in one, counted on one shard).
  struct Inline {
    void* shard;
    size_t cell;
    uint64_t weight;          // 0: not timed
    Clock::time_point start;  // when timed
  };
  // (Inline, with Mine: they cost a few nanoseconds a copy, a call would add to that.)
  Inline BeginInline(PeerSlot peer, Op op, int backend) {
    Shard& s = Mine();
    const size_t cell = Cell(peer, op, backend);
    // The first copy stands for itself, every later timed one for the kInlineSample before it:
    // the histogram's count trails the copies, never leads them. (The shared shard's threads
    // race on the count: a timed copy more or less.)
    const uint64_t n = s.inline_ok[cell].Get();
    if (n % kInlineSample != 0) return {&s, cell, 0, {}};
    return {&s, cell, n == 0 ? 1 : kInlineSample, Clock::now()};
  }
  void EndInline(const Inline& copy, Op op, int backend, uint64_t bytes) {
    Shard& s = *static_cast<Shard*>(copy.shard);
    s.bytes[copy.cell].Add(bytes, s.shared);
    s.inline_ok[copy.cell].Add(1, s.shared);
    if (copy.weight != 0) Observe(s, op, backend, Clock::now() - copy.start, copy.weight);
  }

  // --- rare events
  struct Events {
    std::atomic<uint64_t> sessions_opened{0};
    std::atomic<uint64_t> reconnects{0};       // sessions with a peer name seen before
    std::atomic<uint64_t> notifies_sent{0};    // the target queued them
    std::atomic<uint64_t> notifies_unsent{0};  // refused by the target, or lost on the way
    std::atomic<uint64_t> notifies_received{0};
    std::atomic<uint64_t> notifies_refused{0};  // from peers, refused here (queue full, oversize)
    // How one of ours went: queued by the target (sent), or not (unsent).
    void Sent(const Status& queued) { ++(queued.ok() ? notifies_sent : notifies_unsent); }
  };
  Events& events() { return events_; }
  // A request refused before it started (bad input, unknown peer, ...).
  void Refused(Op op, StatusCode code);

  // Appends the metrics counted here to *out (the engine adds its gauges).
  void Snapshot(MetricsSnapshot* out) const;

 private:
  struct Count {
    std::atomic<uint64_t> v{0};
    void Add(uint64_t x, bool shared) {
      if (shared) {
        v.fetch_add(x, std::memory_order_relaxed);
      } else {
        v.store(v.load(std::memory_order_relaxed) + x, std::memory_order_relaxed);
      }
    }
    uint64_t Get() const { return v.load(std::memory_order_relaxed); }
  };
  struct Histogram {
    Count buckets[kDurationBuckets];
    Count sum_ns;
  };
  struct Shard {
    explicit Shard(size_t peer_slots, bool shared)
        : shared(shared),
          bytes(peer_slots * kOps * kBackends),
          ok(peer_slots * kOps * kBackends),
          inline_ok(peer_slots * kOps * kBackends) {}
    const bool shared;
    std::vector<Count> bytes;      // [peer][op][backend]
    std::vector<Count> ok;         // requests that completed, [peer][op][backend]
    std::vector<Count> inline_ok;  // inline copies (one descriptor each), [peer][op][backend]
    Histogram duration[kOps][kBackends];
    Count descriptors[kOps][kDescBuckets];
    Count descriptors_sum[kOps];
    Count started[kOps], started_bytes[kOps], ended[kOps], ended_bytes[kOps];
  };

  size_t Cell(PeerSlot peer, Op op, int backend) const {
    return (static_cast<size_t>(peer) * kOps + static_cast<int>(op)) * kBackends + backend;
  }
  // This thread's shard: cached per thread for the last kCachedShards engines it counted
  // for; a miss looks the shard up under mu_.
  Shard& Mine() {
    for (const auto& c : this_thread_shards_) {
      if (c.owner == id_) return *static_cast<Shard*>(c.shard);
    }
    return MineSlow();
  }
  Shard& MineSlow();
  void Observe(Shard& s, Op op, int backend, Clock::duration took, uint64_t weight);
  // The sums over every shard (mu_ held).
  struct Totals;
  Totals Sum() const;

  const uint64_t id_;  // tells this engine's shards apart in a thread's cache
  const uint32_t max_peers_;
  const std::vector<std::string> backends_;
  Events events_;

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Shard>> shards_;                   // mu_
  std::unordered_map<std::thread::id, Shard*> shard_of_thread_;  // mu_
  std::unique_ptr<Shard> shared_shard_;                          // past kMaxShards
  std::unordered_map<std::string, PeerSlot> slots_;              // mu_
  std::vector<std::string> peer_names_;                          // by slot; mu_
  std::unordered_set<std::string> session_keys_;                 // mu_
  // Requests that ended other than completed: (peer, op, backend, code) -> count. mu_
  std::map<std::tuple<PeerSlot, int, int, int>, uint64_t> failed_;
  std::map<std::pair<int, int>, uint64_t> refused_;  // (op, code) -> count; mu_
};

}  // namespace xfer
