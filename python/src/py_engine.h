// The extension's Engine and Request: xfer::Engine with Python conventions (timeouts in
// seconds, exceptions, the GIL released while a call may block).
#pragma once
#include <pybind11/pybind11.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "xfer/engine.h"

namespace xfer::py {

// What an Engine, its Requests and its Buffers share. Finalize must not race other calls
// (engine.h): every call holds `lifetime` shared, Close holds it alone.
struct Core {
  Engine engine;
  std::shared_mutex lifetime;
  std::atomic<bool> closed{false};  // set under lifetime held alone
  std::chrono::milliseconds timeout{30000};  // for calls given none
  std::string name;                          // LocalName(), kept for after close
  std::atomic<int64_t> buffer_views{0};      // live views of this engine's alloc() buffers
  std::mutex orphans_mu;
  std::vector<RequestHandle> orphans;  // requests whose Python object died before they ended
  size_t reap_at = 64;                 // orphans.size() at which the next reap looks at them

  // Runs f(engine) without the GIL; InvalidArgument when the engine is closed.
  template <class F>
  Status Call(F&& f) {
    pybind11::gil_scoped_release nogil;
    std::shared_lock lock(lifetime);
    if (closed) return Status(StatusCode::kInvalidArgument, "the engine is closed");
    return f(engine);
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

  std::shared_ptr<Core> core_;
  const RequestHandle handle_;
  std::timed_mutex mu_;         // one thread at a time asks the engine (the handle ends once)
  RequestStatus final_;         // written once, under mu_, before ended_ is set
  std::atomic<bool> ended_{false};
};

class PyEngine {
 public:
  PyEngine(const std::string& name, const pybind11::kwargs& options);
  ~PyEngine();
  // Finalize. Refused (BufferError) while views of alloc() memory are alive.
  void Close();
  bool Closed();
  const std::shared_ptr<Core>& core() const { return core_; }

 private:
  std::shared_ptr<Core> core_;
};

// Adds Engine, Request and the value types to the module.
void BindEngine(pybind11::module_& m);

}  // namespace xfer::py
