// One thread for work too slow for the thread that has it: jobs run one at a time, lightest
// first (in order among equals), so that a cheap job is not stuck behind a queue of costly ones.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "util/log.h"

namespace xfer {

class WorkerThread {
 public:
  WorkerThread() = default;
  ~WorkerThread() { Stop(); }
  WorkerThread(const WorkerThread&) = delete;
  WorkerThread& operator=(const WorkerThread&) = delete;

  // Queues the job; weight orders the queue (say, the bytes it works on). The thread starts
  // with the first job (when it cannot, the job runs on the caller, with a log line). After
  // Stop, nothing runs: the job is dropped at once (its captures are destroyed on the
  // caller's thread).
  void Post(std::function<void()> job, uint64_t weight = 0);
  // Lets the running job end, drops the queued ones (destroying their captures here) and joins.
  void Stop();

 private:
  void Run();
  std::mutex mu_;
  std::condition_variable cv_;
  std::multimap<uint64_t, std::function<void()>> queue_;   // mu_: by weight, then in order
  bool stopping_ = false;                                  // mu_
  log::Limit start_failed_log_{std::chrono::seconds(10)};  // mu_
  std::thread thread_;                                     // started under mu_
};

}  // namespace xfer
