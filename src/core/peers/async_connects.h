// AsyncConnects: the work behind Engine::ConnectAsync. Each connect runs on one of at most
// `threads` threads (started as work arrives, ended after a second without any, so an engine
// that does not connect asynchronously has none); a handle tells how it ended. One caller can thus connect to
// a hundred peers at once without a thread of its own per peer.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "xfer/status.h"
#include "xfer/types.h"

namespace xfer {

class AsyncConnects {
 public:
  using Work = std::function<Status()>;  // a Connect; its status is the outcome

  explicit AsyncConnects(size_t threads) : max_threads_(threads) {}
  ~AsyncConnects();  // Cancel() and Join()

  ConnectHandle Start(Work work);
  // The outcome once the work ended (the handle is then released); false: unknown handle.
  bool Poll(ConnectHandle handle, ConnectStatus* out);
  // Work not started yet ends with kCanceled at once; work running goes on (Finalize ends it).
  void Cancel();
  void Join();  // waits for the threads (after Cancel)

 private:
  void Run();
  void JoinExited();  // (mu_ held) the threads that ended when idle

  static constexpr std::chrono::seconds kIdleExit{1};  // a thread idle this long ends

  const size_t max_threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool canceled_ = false;
  size_t idle_ = 0;
  uint64_t next_ = 1;
  std::deque<std::pair<ConnectHandle, Work>> queue_;
  std::unordered_map<ConnectHandle, ConnectStatus> outcomes_;  // every handle not yet reported done
  std::vector<std::thread> threads_;
  std::vector<std::thread::id> exited_;  // ended, not joined yet
};

}  // namespace xfer
