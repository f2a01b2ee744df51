#include "core/peers/async_connects.h"

#include <algorithm>
#include <system_error>

namespace xfer {

AsyncConnects::~AsyncConnects() {
  Cancel();
  Join();
}

ConnectHandle AsyncConnects::Start(Work work) {
  std::lock_guard lock(mu_);
  const ConnectHandle h = next_++;
  outcomes_[h] = ConnectStatus{};
  if (canceled_) {
    outcomes_[h] = ConnectStatus{true, {StatusCode::kCanceled, "ConnectAsync: the engine is finalizing"}};
    return h;
  }
  queue_.emplace_back(h, std::move(work));
  JoinExited();
  // (idle_ drops only once a woken thread runs: a burst must not count one idle thread twice)
  if (queue_.size() > idle_ && threads_.size() < max_threads_) {
    try {
      threads_.emplace_back([this] { Run(); });
    } catch (const std::system_error& e) {
      if (threads_.empty()) {  // (no thread to run it at all)
        queue_.pop_back();
        outcomes_[h] = ConnectStatus{true,
                                     {StatusCode::kResourceExhausted,
                                      std::string("ConnectAsync: cannot start a thread: ") + e.what()}};
        return h;
      }
    }
  }
  cv_.notify_one();
  return h;
}

bool AsyncConnects::Poll(ConnectHandle handle, ConnectStatus* out) {
  std::lock_guard lock(mu_);
  auto it = outcomes_.find(handle);
  if (it == outcomes_.end()) return false;
  *out = it->second;
  if (out->done) outcomes_.erase(it);
  return true;
}

void AsyncConnects::Cancel() {
  std::lock_guard lock(mu_);
  canceled_ = true;
  for (auto& [h, work] : queue_) {
    outcomes_[h] = ConnectStatus{true, {StatusCode::kCanceled, "ConnectAsync: the engine was finalized"}};
  }
  queue_.clear();
  cv_.notify_all();
}

void AsyncConnects::JoinExited() {
  for (const auto id : exited_) {
    auto it = std::find_if(threads_.begin(), threads_.end(),
                           [&](const std::thread& t) { return t.get_id() == id; });
    if (it != threads_.end()) {
      it->join();
      threads_.erase(it);
    }
  }
  exited_.clear();
}

void AsyncConnects::Join() {
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(mu_);
    threads.swap(threads_);
    exited_.clear();  // (their threads are in `threads`: joined below)
  }
  for (auto& t : threads) t.join();
}

void AsyncConnects::Run() {
  std::unique_lock lock(mu_);
  for (;;) {
    ++idle_;
    const bool woken = cv_.wait_for(lock, kIdleExit, [&] { return canceled_ || !queue_.empty(); });
    --idle_;
    if (queue_.empty()) {  // canceled, or idle for kIdleExit: this thread ends
      if (!woken) exited_.push_back(std::this_thread::get_id());
      return;
    }
    auto [h, work] = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    Status s = work();
    lock.lock();
    outcomes_[h] = ConnectStatus{true, std::move(s)};
  }
}

}  // namespace xfer
