#include "core/stream_pool.h"

#include <functional>

#include "util/spin.h"

namespace xfer {
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

void StreamPool::Run(Stream& s) {
  for (;;) {
    // Spin a little before sleeping: back-to-back batches then cost no wake-up.
    auto spin_until = std::chrono::steady_clock::now() + spin_;
    while (s.pending.load(std::memory_order_acquire) == 0 &&
           !stopping_.load(std::memory_order_acquire) &&
           std::chrono::steady_clock::now() < spin_until) {
      SpinPause();
    }
    Task task;
    {
      std::unique_lock lock(s.mu);
      s.cv.wait(lock, [&] { return !s.queue.empty() || stopping_.load(); });
      if (s.queue.empty()) return;  // stopping and drained
      task = std::move(s.queue.front());
      s.queue.pop_front();
      s.pending.fetch_sub(1, std::memory_order_relaxed);
    }
    std::lock_guard exec(s.exec);
    task();
  }
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

std::unique_lock<std::mutex> StreamPool::InlineSlot() {
  size_t slot = std::hash<std::thread::id>{}(std::this_thread::get_id()) % kInlineSlots;
  return std::unique_lock<std::mutex>(inline_slots_[slot]);
}

void StreamPool::Fence() {
  for (auto& s : streams_) std::lock_guard l(s->exec);
  for (auto& m : inline_slots_) std::lock_guard l(m);
}

}  // namespace xfer
