// The extension's Engine and Request: xfer::Engine with Python conventions (timeouts in
// seconds, exceptions, the GIL released while a call may block).
#pragma once
#include <pybind11/pybind11.h>

#include <pthread.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>

#include <shared_mutex>
#include <string>
#include <vector>

#include "py_errors.h"
#include "xfer/engine.h"

namespace xfer::py {

// A readers-writer lock that lets a waiting writer in before new readers. glibc's default
// prefers readers: waits in several threads, each holding it for a slice, could overlap and
// keep close() out forever. Readers must not nest (a second shared lock with a writer waiting
// deadlocks).
class WriterFirstMutex {
 public:
  WriterFirstMutex() {
    pthread_rwlockattr_t a;
    pthread_rwlockattr_init(&a);
    pthread_rwlockattr_setkind_np(&a, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&lock_, &a);
    pthread_rwlockattr_destroy(&a);
  }
  ~WriterFirstMutex() { pthread_rwlock_destroy(&lock_); }
  WriterFirstMutex(const WriterFirstMutex&) = delete;
  WriterFirstMutex& operator=(const WriterFirstMutex&) = delete;
  void lock() { pthread_rwlock_wrlock(&lock_); }
  void unlock() { pthread_rwlock_unlock(&lock_); }
  void lock_shared() { pthread_rwlock_rdlock(&lock_); }
  void unlock_shared() { pthread_rwlock_unlock(&lock_); }

 private:
  pthread_rwlock_t lock_;
};

// What an Engine, its Requests and its Buffers share. Finalize must not race other calls
// (engine.h): every call holds `lifetime` shared, Close holds it alone. Waits hold it for 200 ms
// at a time (WaitInSlices), so close() waits for them that long at most.
struct Core {
  static constexpr std::chrono::milliseconds kSlice{200};
  Engine engine;
  WriterFirstMutex lifetime;
  std::atomic<bool> closing{false};          // set with the GIL held when close() begins: no new call
                                             // or view of alloc() memory is allowed from then on
  std::atomic<bool> closed{false};           // set under lifetime held alone, after Finalize
  std::chrono::milliseconds timeout{30000};  // for calls given none
  std::string name;                          // LocalName(), kept for after close
  std::atomic<int64_t> buffer_views{0};      // live views of this engine's alloc() buffers
  std::mutex orphans_mu;
  std::vector<RequestHandle> orphans;  // requests whose Python object died before they ended
  size_t reap_at = 64;                 // orphans.size() at which the next reap looks at them

  // Runs f(engine) without the GIL; InvalidArgument when the engine is closed or closing.
  template <class F>
  Status Call(F&& f) {
    const Status closed_status(StatusCode::kInvalidArgument, "the engine is closed");
    if (closing) return closed_status;  // (before the lock: a waiting close() goes first)
    pybind11::gil_scoped_release nogil;
    std::shared_lock lock(lifetime);
    if (closing) return closed_status;
    return f(engine);
  }
  // A wait of up to `total`: f(engine, slice) waits at most slice (<= kSlice) and returns
  // kTimeout when nothing came; between slices, Ctrl-C (a pending signal) raises and a close()
  // ends the wait (InvalidArgument, as any call on a closed engine).
  template <class F>
  Status WaitInSlices(std::chrono::milliseconds total, F&& f) {
    const auto deadline = std::chrono::steady_clock::now() + total;
    for (;;) {
      const auto left =
          std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      const auto slice = std::clamp(left, std::chrono::milliseconds(0), kSlice);
      const Status st = Call([&](Engine& e) { return f(e, slice); });
      if (st.code() != StatusCode::kTimeout || left <= slice) return st;  // (the last slice)
      if (PyErr_CheckSignals() != 0) throw pybind11::error_already_set();
    }
  }
  // Releases the handles of orphans that have ended (Engine::GetTransferStatus does), once
  // there are reap_at of them.
  void ReapOrphans();
};

// An asynchronous request (Engine.read_async / write_async).
class PyRequest {
 public:
  PyRequest(std::shared_ptr<Core> core, RequestHandle handle) : core_(std::move(core)), handle_(handle) {}
  ~PyRequest();
  // True once it completed; raises its error when it failed, timed out or was canceled; False
  // when it is still running after timeout seconds (None: until it ends).
  bool Wait(pybind11::handle timeout);
  RequestState State();  // never raises for the request's own failure
  bool Done() { return State() != RequestState::kWaiting; }
  void Cancel();
  std::vector<uint64_t> Landed() const;  // after it ended other than completed (RequestStatus)

 private:
  // Asks the engine, waiting up to ms (0: a glance), holding mu_; true when it has ended.
  bool Ask(std::chrono::milliseconds ms);
  // Waits up to ms for mu_ and then for the end (GIL released); true when it ended.
  bool WaitFor(std::chrono::milliseconds ms);

  std::shared_ptr<Core> core_;  // (reset, without the GIL, by the destructor)
  const RequestHandle handle_;
  std::timed_mutex mu_;  // one thread at a time asks the engine (the handle ends once)
  RequestStatus final_;  // written once, under mu_, before ended_ is set
  std::atomic<bool> ended_{false};
};

class PyEngine {
 public:
  PyEngine(const std::string& name, const pybind11::kwargs& options);
  // Closes the engine, unless the program still holds its Buffers, Requests, Regions or
  // PreparedLists: then
  // the engine runs on until the last of them is gone.
  ~PyEngine();
  // Finalize. Refused (BufferError) while views of alloc() memory are alive. Calls in other
  // threads are refused from the start of it; it waits for those running to return.
  void Close();
  bool Closed();
  const std::shared_ptr<Core>& core() const { return core_; }

 private:
  std::shared_ptr<Core> core_;
};

// A notify= argument: None, bytes, str (as UTF-8) or a bytes-like object.
std::optional<std::string> NotifyMessage(pybind11::handle notify);

// What every transfer method shares: timeout= and notify= converted (with the GIL), then the
// engine called without it.
struct TransferCall {
  std::chrono::milliseconds timeout;
  TransferOptions options;
  // checksum: None (the engine's EngineOptions::checksum) or a bool (TransferOptions::checksum).
  TransferCall(const Core& core, pybind11::handle timeout_s, pybind11::handle notify,
               pybind11::handle checksum);
  // f(engine, timeout, options, &result) is a TransferSync; its failure raises (with .landed).
  template <class F>
  void Sync(Core& core, F&& f) const;
  // f(engine, timeout, options, &handle) is a TransferAsync; returns its Request.
  template <class F>
  std::unique_ptr<PyRequest> Async(const std::shared_ptr<Core>& core, F&& f) const;
};

template <class F>
void TransferCall::Sync(Core& core, F&& f) const {
  RequestStatus result;
  const Status st = core.Call([&](Engine& e) { return f(e, timeout, options, &result); });
  if (!st.ok()) Raise(st, &result.landed);
}

template <class F>
std::unique_ptr<PyRequest> TransferCall::Async(const std::shared_ptr<Core>& core, F&& f) const {
  RequestHandle handle = 0;
  Check(core->Call([&](Engine& e) {
    core->ReapOrphans();
    return f(e, timeout, options, &handle);
  }));
  return std::make_unique<PyRequest>(core, handle);
}

// Adds Engine, Request and the value types to the module.
void BindEngine(pybind11::module_& m);

}  // namespace xfer::py
