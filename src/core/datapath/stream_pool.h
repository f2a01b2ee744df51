// Streams: worker threads that execute batches. Each stream has its own queue; an idle
// stream spins briefly (a sleep and a wake-up cost tens of microseconds on a VM) and then
// sleeps.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/awaiting_control.h"
#include "core/datapath/share_rule.h"

namespace xfer {

class StreamPool {
 public:
  using Task = std::function<void()>;

  StreamPool(int streams, std::chrono::microseconds spin);
  ~StreamPool();  // Stop()

  int size() const { return static_cast<int>(streams_.size()); }
  // Whether a stream runs a task or has one queued (a hint: it may change at once).
  bool Busy() const;
  void Submit(int stream, Task task);
  // A stream for the next task: the first idle one (so that a lone caller keeps one stream
  // warm while the others sleep, rather than more threads spinning than there are cores),
  // else the next in turn.
  int Pick();
  // Runs the queued tasks, then joins the threads. Submit after Stop runs the task inline.
  void Stop();

  // Every execution of a batch holds the execution slot of its thread, for that batch alone:
  // a stream's own, or on any other thread one of the inline slots. Fence() takes each slot
  // in turn, so when it returns, every batch that was executing when it was called has
  // finished (and it waits for no more than those: not for the rest of a long request).
  // A slot still held at the deadline makes it call on_late (which must end what stalls, e.g.
  // Link::Interrupt), and again every 10 ms until that slot is free (or, pass_awaiting, its
  // batch waits for the control thread).
  // A slot: a timed mutex with the mark its batch sets while it waits for the control thread
  // (core/awaiting_control.h). Taken with lock() or try_lock(), its mark is this thread's
  // AwaitingControl::Mark() until unlock(), which gives the thread back the mark it had (a
  // slot of another engine's pool it holds); taken otherwise (try_lock_until: a fence, or a
  // thread that reaches what the slot guards) it lends no mark.
  class ExecSlot : public std::timed_mutex {
   public:
    void lock() {
      std::timed_mutex::lock();
      Hold();
    }
    bool try_lock() {
      if (!std::timed_mutex::try_lock()) return false;
      Hold();
      return true;
    }
    void unlock() {
      if (AwaitingControl::Mark() == &awaiting_) AwaitingControl::Mark() = before_;
      std::timed_mutex::unlock();
    }
    // Whether its batch waits for the control thread now.
    bool awaiting() const { return awaiting_.load(std::memory_order_acquire); }

   private:
    void Hold() {
      before_ = AwaitingControl::Mark();
      AwaitingControl::Mark() = &awaiting_;
    }
    std::atomic<bool> awaiting_{false};
    std::atomic<bool>* before_ = nullptr;  // the mark its holder had before it took the slot
  };
  std::unique_lock<ExecSlot> Slot();
  // The same; *inline_slot: the index of the inline slot taken (data that the slot guards,
  // per index, is this thread's while it holds it), or -1 on a stream's own thread.
  std::unique_lock<ExecSlot> Slot(int* inline_slot);
  // This thread's inline slot if it is free now (the lock owns nothing otherwise, and on a
  // stream's own thread, where *inline_slot is -1).
  std::unique_lock<ExecSlot> TryInlineSlot(int* inline_slot);
  // Inline slot k (0 <= k < kInlineSlots), to reach what it guards from another thread.
  ExecSlot& InlineSlot(int k) { return inline_slots_[k]; }
  static constexpr int kInlineSlots = 16;
  // pass_awaiting: the control thread fences; a slot whose batch waits for it
  // (core/awaiting_control.h) is passed by.
  void Fence(std::chrono::steady_clock::time_point deadline, const std::function<void()>& on_late,
             bool pass_awaiting = false);

  // Copies len bytes (transport::CopyHost) on the calling thread, which holds its slot. From kMinSharedCopy
  // bytes, where the share rule finds it faster (ShareRule: measured as the copies go), an
  // idle stream that is spinning (one at most: the helper) copies the second half meanwhile.
  // A sleeping stream is not waited for: the caller then copies it all, and when copies come
  // close together wakes one to spin for the next.
  void SharedCopy(void* dst, const void* src, size_t len);
  uint64_t shared_halves() const { return shared_halves_.load(std::memory_order_relaxed); }
  const ShareRule& share_rule() const { return share_rule_; }
  // Below this, half a copy takes less than handing the other half to another core.
  static constexpr size_t kMinSharedCopy = ShareRule::kMinLen;

 private:
  struct Stream {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Task> queue;
    std::atomic<size_t> pending{0};
    std::atomic<bool> running{false};
    ExecSlot exec;  // the stream's execution slot
    std::thread thread;
  };
  void Run(Stream& s);
  bool TryHelp();  // a spinning stream takes the posted half of a SharedCopy, if there is one
  // SharedCopy's copy with the helper; false when there was none (the caller copied it all).
  bool CopyWithHelper(void* dst, const void* src, size_t len);

  // The half of a SharedCopy offered to the streams.
  enum : int { kFree, kFilling, kPosted, kTaken, kDone };
  struct alignas(64) Offer {
    std::atomic<int> state{kFree};
    void* dst = nullptr;
    const void* src = nullptr;
    size_t len = 0;
  };
  Offer offer_;
  ShareRule share_rule_;
  std::atomic<bool> helper_{false};         // a stream spins now, ready to take half of a copy
  std::atomic<bool> waking_{false};         // SharedCopy woke a stream that has not spun yet
  std::atomic<int64_t> last_alone_{0};      // steady_clock ticks of the last copy nobody shared
  std::atomic<uint64_t> shared_halves_{0};  // halves of SharedCopy that streams took
  std::atomic<uint32_t> next_{0};           // Pick's turn when no stream is idle

  const std::chrono::microseconds spin_;
  std::vector<std::unique_ptr<Stream>> streams_;
  ExecSlot inline_slots_[kInlineSlots];
  std::atomic<bool> stopping_{false};
  std::mutex stop_mu_;
};

}  // namespace xfer
