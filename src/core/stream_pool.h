// Streams: worker threads that execute batches. Each stream has its own queue; an idle
// stream spins briefly (a sleep and wake-up costs ~20 us on a VM) and then sleeps.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace xfer {

class StreamPool {
 public:
  using Task = std::function<void()>;

  StreamPool(int streams, std::chrono::microseconds spin);
  ~StreamPool();  // Stop()

  int size() const { return static_cast<int>(streams_.size()); }
  void Submit(int stream, Task task);
  // Runs the queued tasks, then joins the threads. Submit after Stop runs the task inline.
  void Stop();

  // Every execution of a batch (on a stream, or inline on a caller's thread) holds one of
  // these slots; Fence() takes each slot in turn, so when it returns, every batch that was
  // executing when it was called has finished.
  std::unique_lock<std::mutex> InlineSlot();
  void Fence();

 private:
  struct Stream {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Task> queue;
    std::atomic<size_t> pending{0};
    std::mutex exec;  // held while a task runs
    std::thread thread;
  };
  void Run(Stream& s);

  const std::chrono::microseconds spin_;
  std::vector<std::unique_ptr<Stream>> streams_;
  static constexpr int kInlineSlots = 16;
  std::mutex inline_slots_[kInlineSlots];
  std::atomic<bool> stopping_{false};
  std::mutex stop_mu_;
};

}  // namespace xfer
