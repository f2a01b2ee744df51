// DigestServer: the target's side of end-to-end checksums (docs/notifications.md, "Checksums").
// Peers' asks (wire::Digest) wait in a queue per session, their ranges bounded per session and
// in all, and one thread of its own (never the control thread) answers them, the sessions
// taking turns of at most a chunk's work each (kChunkBytes of memory read, or that many ranges'
// worth of small ones), so that a peer that asks for the checksums of huge ranges delays
// another's ask by one chunk per turn, not by the whole of its own. Each range is checked
// against the regions that peer may read and read in chunks, each under a lock that a
// deregistration's fence takes between two chunks; an ask whose session ended, or asked while
// the engine stops, is given up between chunks.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "control/session.h"
#include "core/local_engine.h"
#include "core/regions/region_service.h"
#include "util/checksum.h"

namespace xfer {

class DigestServer {
 public:
  using Clock = std::chrono::steady_clock;

  DigestServer(const LocalEngine& self, RegionService& regions) : self_(self), regions_(regions) {}
  ~DigestServer() { Stop(); }

  void Start();  // the thread (once: again while it runs does nothing)
  void Stop();   // what is queued is dropped; the ask being answered is given up

  // Control thread: queues a peer's ask, or refuses it at once (its queue full, stopping).
  void Queue(const std::shared_ptr<control::Session>& s, wire::Digest&& ask);
  // The session ended: its queued asks are dropped.
  void Forget(const control::Session* s);
  // Control thread: the peer no longer wants ask `id`'s answer: dropped, waiting or under way
  // (then between two chunks). An id it does not know is ignored.
  void Cancel(const control::Session* s, uint64_t id);
  // Returns once no chunk that began before the call reads this engine's memory (a
  // deregistration: the region is gone from the registry already), past the deadline too:
  // the region is freed next, and a chunk takes well under a millisecond.
  void Fence(Clock::time_point deadline);

  // The checksums of the ranges of this engine's memory that ask names, on the calling thread,
  // or why not. give_up, when set, is asked between chunks (true: the answer is not wanted).
  wire::DigestAnswer Answer(const wire::Digest& ask, const std::function<bool()>& give_up = {});

 private:
  // Ranges waiting (16 B each as asked, some 80 B as queued): per session, and in all; an ask
  // counts kAskRanges more for itself (Weight), so that asks of one range or none cannot
  // queue without bound.
  static constexpr size_t kMaxRangesPerSession = 1 << 20;
  static constexpr size_t kMaxRanges = 1 << 24;
  static constexpr size_t kAskRanges = 4;
  static constexpr size_t kDropsPerTurn = 1024;  // canceled asks dropped in one turn
  static size_t Weight(const wire::Digest& ask) { return ask.ranges.size() + kAskRanges; }
  static constexpr uint64_t kChunkBytes = 4ull << 20;
  static constexpr uint64_t kRangeBytes = 256;  // what a range costs a turn, however short
  // ...of GPU memory: a copy out of it (memory_sum.h) costs ~10 us, about what 256 KiB of
  // cold host memory takes to sum (bench/RESULTS.md: 22.7 GB/s).
  static constexpr uint64_t kGpuRangeBytes = 256 << 10;

  // An ask being answered, and how far.
  struct Answering {
    wire::Digest ask;
    wire::DigestAnswer answer;
    size_t range = 0;     // the range under way
    uint64_t offset = 0;  // the bytes of it summed so far
    checksum::Running sum;
  };
  struct SessionAsks {
    std::shared_ptr<control::Session> session;
    std::deque<wire::Digest> asks;
    // The ids of the asks in `asks`: whether each was canceled (Cancel finds it without a scan;
    // its ranges stop counting at once, its kAskRanges once the thread drops it).
    struct Queued {
      wire::Digest* ask = nullptr;  // in `asks` (a deque: kept in place while others come and go)
      bool canceled = false;        // (its ranges then freed)
    };
    std::unordered_map<uint64_t, Queued> queued;
    size_t ranges = 0;  // the Weight of asks and current, less what canceled asks no longer count
    std::unique_ptr<Answering> current;  // (out with the thread during a turn)
    bool in_turn = false;                // in turns_, or being served
  };
  void Serve();  // the thread
  // Moves w on by one turn: up to kChunkBytes read (a range counts at least kRangeBytes, or
  // kGpuRangeBytes in GPU memory);
  // true once it is answered (its answer: the digests, or why not). give_up, when set, is
  // asked between chunks.
  bool Step(Answering& w, const std::function<bool()>& give_up);
  // The next chunk of range r, from offset, into sum (at most `most` bytes; *gpu: it lies in
  // GPU memory); false (with *why) when it is no longer readable by peers, a copy of GPU memory
  // failed, or give_up says so.
  bool SumChunk(const wire::DigestRange& r, uint64_t offset, uint64_t most,
                const std::function<bool()>& give_up, checksum::Running* sum, bool* gpu, Status* why);

  const LocalEngine& self_;
  RegionService& regions_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<const control::Session*, SessionAsks> queues_;  // mu_
  std::deque<const control::Session*> turns_;  // mu_: sessions with asks queued, in turn
  // mu_: the ask the thread works on during a turn (its session, its id); Cancel sets
  // serving_canceled_ for it.
  const control::Session* serving_session_ = nullptr;
  uint64_t serving_id_ = 0;
  std::atomic<bool> serving_canceled_{false};
  size_t queued_ranges_ = 0;  // mu_: the Weight of all queues' asks
  bool running_ = false;      // mu_
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::timed_mutex reading_;     // held while a chunk of our memory is read
  std::atomic<int> fencing_{0};  // fences waiting for reading_: they go before the next chunk
};

}  // namespace xfer
