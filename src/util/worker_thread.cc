#include "util/worker_thread.h"

#include <system_error>

#include "util/log.h"

namespace xfer {

void WorkerThread::Post(std::function<void()> job, uint64_t weight) {
  {
    std::unique_lock lock(mu_);
    if (!stopping_ && !thread_.joinable()) {
      try {
        thread_ = std::thread([this] { Run(); });
      } catch (const std::system_error& e) {  // (no thread to be had: the caller runs it)
        uint64_t more = 0;
        const bool log = start_failed_log_.Due(&more);
        lock.unlock();
        if (log) {
          XLOG(WARN) << "cannot start a worker thread (" << e.what() << "); running its job in place"
                     << log::Limit::More(more);
        }
        job();
        return;
      }
    }
    if (!stopping_) {
      queue_.emplace(weight, std::move(job));  // (after the equal weights already there)
      cv_.notify_one();
      return;
    }
  }
  job = nullptr;  // stopped: dropped, outside the lock
}

void WorkerThread::Stop() {
  std::multimap<uint64_t, std::function<void()>> dropped;
  std::thread t;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    dropped.swap(queue_);
    t = std::move(thread_);
    cv_.notify_one();
  }
  if (t.joinable()) t.join();
}

void WorkerThread::Run() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    auto job = std::move(queue_.begin()->second);
    queue_.erase(queue_.begin());
    lock.unlock();
    job();
    job = nullptr;  // (its captures go before the lock is taken again)
    lock.lock();
  }
}

}  // namespace xfer
