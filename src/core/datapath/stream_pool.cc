#include "core/datapath/stream_pool.h"

#include <algorithm>

#include <functional>

#include "transport/common/host_copy.h"
#include "util/spin.h"
#include "util/thread_cache.h"

namespace xfer {
namespace {
// Set on a stream's own thread: its pool and its slot.
thread_local const StreamPool* stream_pool = nullptr;
thread_local StreamPool::ExecSlot* stream_slot = nullptr;
}  // namespace

StreamPool::StreamPool(int streams, std::chrono::microseconds spin) : spin_(spin) {
  for (int i = 0; i < std::max(streams, 1); ++i) {
    streams_.push_back(std::make_unique<Stream>());
  }
  for (auto& s : streams_) {
    Stream* sp = s.get();
    s->thread = std::thread([this, sp] { Run(*sp); });
  }
}

StreamPool::~StreamPool() { Stop(); }

void StreamPool::Submit(int stream, Task task) {
  Stream& s = *streams_[static_cast<size_t>(stream) % streams_.size()];
  {
    std::unique_lock lock(s.mu);
    if (stopping_.load()) {  // checked under the queue lock, so Stop() cannot miss a task
      lock.unlock();
      task();
      return;
    }
    s.queue.push_back(std::move(task));
    s.pending.fetch_add(1, std::memory_order_release);
  }
  s.cv.notify_one();
}

bool StreamPool::Busy() const {
  return std::any_of(streams_.begin(), streams_.end(), [](const auto& s) {
    return s->running.load(std::memory_order_relaxed) || s->pending.load(std::memory_order_relaxed) != 0;
  });
}

int StreamPool::Pick() {
  for (size_t i = 0; i < streams_.size(); ++i) {
    const Stream& s = *streams_[i];
    if (s.pending.load(std::memory_order_relaxed) == 0 && !s.running.load(std::memory_order_relaxed)) {
      return static_cast<int>(i);
    }
  }
  return static_cast<int>(next_.fetch_add(1, std::memory_order_relaxed) % streams_.size());
}

void StreamPool::Run(Stream& s) {
  stream_pool = this;
  stream_slot = &s.exec;
  for (;;) {
    // Spin a little before sleeping: back-to-back batches then cost no wake-up.
    // (The clock is read every few steps only: a read costs as much as a hand-off's wait.)
    auto spin_until = std::chrono::steady_clock::now() + spin_;
    Backoff backoff;
    // One spinning stream at a time takes halves of shared copies: two would keep each other
    // spinning beside the caller (three threads on two cores), and a half taken by a stream
    // that is then preempted stalls the caller's copy.
    const bool helper = !helper_.exchange(true, std::memory_order_acquire);
    waking_.store(false, std::memory_order_relaxed);
    for (unsigned step = 1;
         s.pending.load(std::memory_order_acquire) == 0 && !stopping_.load(std::memory_order_acquire);
         ++step) {
      if (helper && TryHelp()) {
        spin_until = std::chrono::steady_clock::now() + spin_;
        backoff.Reset();
      } else if (step % 16 == 1 && std::chrono::steady_clock::now() >= spin_until) {
        break;
      } else {
        backoff.Pause();
      }
    }
    if (helper) helper_.store(false, std::memory_order_release);
    Task task;
    {
      std::unique_lock lock(s.mu);
      s.cv.wait(lock, [&] { return !s.queue.empty() || stopping_.load(); });
      if (s.queue.empty()) return;  // stopping and drained
      task = std::move(s.queue.front());
      s.queue.pop_front();
      s.running.store(true, std::memory_order_relaxed);  // before pending drops (Pick's hint)
      s.pending.fetch_sub(1, std::memory_order_relaxed);
    }
    task();
    s.running.store(false, std::memory_order_relaxed);
  }
}

bool StreamPool::TryHelp() {
  int posted = kPosted;
  if (offer_.state.load(std::memory_order_relaxed) != kPosted ||
      !offer_.state.compare_exchange_strong(posted, kTaken, std::memory_order_acquire)) {
    return false;
  }
  transport::CopyHost(offer_.dst, offer_.src, offer_.len);
  offer_.state.store(kDone, std::memory_order_release);
  shared_halves_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void StreamPool::SharedCopy(void* dst, const void* src, size_t len) {
  const auto* d8 = static_cast<const uint8_t*>(dst);
  const auto* s8 = static_cast<const uint8_t*>(src);
  if (d8 < s8 + len && s8 < d8 + len) {  // overlapping ranges (not the shm path's case)
    transport::MoveHost(dst, src, len);
    return;
  }
  if (len < kMinSharedCopy || spin_.count() <= 0) {
    transport::CopyHost(dst, src, len);
    return;
  }
  thread_local uint32_t ticks[ShareRule::kClasses] = {};  // (each class times its own copies)
  const ShareRule::Choice choice = share_rule_.Choose(len, ++ticks[ShareRule::ClassOf(len)]);
  const auto start =
      choice.timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  if (choice.mode == ShareRule::kAlone) {
    transport::CopyHost(dst, src, len);
  } else if (!CopyWithHelper(dst, src, len)) {
    // Copied alone (perhaps with a stream's wake-up after it): not a sample of either way.
    if (choice.timed) share_rule_.Unmeasured(len, ShareRule::kShare);
    return;
  }
  if (choice.timed)
    share_rule_.Record(len, choice.mode, std::chrono::steady_clock::now() - start, choice.ends_trial);
}

bool StreamPool::CopyWithHelper(void* dst, const void* src, size_t len) {
  int free = kFree;
  if (!offer_.state.compare_exchange_strong(free, kFilling, std::memory_order_acquire)) {
    transport::CopyHost(dst, src, len);  // another thread's copy holds the offer
    return false;
  }
  if (!helper_.load(std::memory_order_relaxed)) {
    offer_.state.store(kFree, std::memory_order_release);
    transport::CopyHost(dst, src, len);
    // A stream spins after a task: when copies follow each other closely, wake one (once) so
    // that it can take half of the next. Sparse copies wake nobody: the stream would spin for
    // nothing, and the wake-up costs the caller a system call.
    const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
    const int64_t last = last_alone_.exchange(now, std::memory_order_relaxed);
    if (std::chrono::steady_clock::duration(now - last) < spin_ &&
        !waking_.exchange(true, std::memory_order_relaxed)) {
      Submit(Pick(), [] {});
    }
    return false;
  }
  // The second half starts on a cache line of dst, so the two cores never write the same line.
  const uintptr_t d = reinterpret_cast<uintptr_t>(dst);
  const size_t half = ((d + len / 2) & ~uintptr_t{63}) - d;
  offer_.dst = static_cast<uint8_t*>(dst) + half;
  offer_.src = static_cast<const uint8_t*>(src) + half;
  offer_.len = len - half;
  offer_.state.store(kPosted, std::memory_order_release);
  transport::CopyHost(dst, src, half);
  int posted = kPosted;
  if (offer_.state.compare_exchange_strong(posted, kFilling, std::memory_order_acquire)) {
    transport::CopyHost(offer_.dst, offer_.src, offer_.len);  // no stream took it: copy it here
  } else {
    Backoff backoff;
    while (offer_.state.load(std::memory_order_acquire) != kDone) backoff.Pause();
  }
  offer_.state.store(kFree, std::memory_order_release);
  return true;
}

void StreamPool::Stop() {
  std::lock_guard lock(stop_mu_);
  if (stopping_.exchange(true)) return;
  for (auto& s : streams_) {
    { std::lock_guard l(s->mu); }
    s->cv.notify_all();
  }
  for (auto& s : streams_) {
    if (s->thread.joinable()) s->thread.join();
  }
}

std::unique_lock<StreamPool::ExecSlot> StreamPool::Slot() {
  int unused;
  return Slot(&unused);
}

std::unique_lock<StreamPool::ExecSlot> StreamPool::Slot(int* inline_slot) {
  if (stream_pool == this) {
    *inline_slot = -1;
    return std::unique_lock<ExecSlot>(*stream_slot);
  }
  *inline_slot = static_cast<int>(ThisThreadIndex() % kInlineSlots);
  return std::unique_lock<ExecSlot>(inline_slots_[*inline_slot]);
}

std::unique_lock<StreamPool::ExecSlot> StreamPool::TryInlineSlot(int* inline_slot) {
  if (stream_pool == this) {
    *inline_slot = -1;
    return {};
  }
  *inline_slot = static_cast<int>(ThisThreadIndex() % kInlineSlots);
  return std::unique_lock<ExecSlot>(inline_slots_[*inline_slot], std::try_to_lock);
}

void StreamPool::Fence(std::chrono::steady_clock::time_point deadline, const std::function<void()>& on_late,
                       bool pass_awaiting) {
  // Once late, on_late again every 10 ms: batches that started after the fence may take the
  // slot in turn, and stall like the first. Passing awaiting batches by, it looks every
  // millisecond whether the slot's batch waits for the control thread.
  const auto step = pass_awaiting ? std::chrono::milliseconds(1) : std::chrono::milliseconds(10);
  auto pass = [&](ExecSlot& slot) {
    const auto passed = [&] { return pass_awaiting && slot.awaiting(); };
    bool free = false;
    while (!(free = slot.try_lock_until(std::min(deadline, std::chrono::steady_clock::now() + step)))) {
      if (passed()) return;
      if (std::chrono::steady_clock::now() >= deadline) break;
    }
    for (auto late = std::chrono::steady_clock::time_point{}; !free && !passed();) {
      if (const auto now = std::chrono::steady_clock::now(); now >= late) {
        on_late();
        late = now + std::chrono::milliseconds(10);
      }
      free = slot.try_lock_for(step);
    }
    if (free) slot.unlock();
  };
  for (auto& s : streams_) pass(s->exec);
  for (ExecSlot& slot : inline_slots_) pass(slot);
}

}  // namespace xfer
