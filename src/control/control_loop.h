// The control thread: one epoll loop over the listening socket and every session. It accepts
// connections, reads frames, sends heartbeats and closes sessions that went silent.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "control/session.h"
#include "util/log.h"
#include "util/net.h"
#include "util/worker_thread.h"

namespace xfer::control {

class ControlHandler {
 public:
  virtual ~ControlHandler() = default;
  // Every frame but heartbeats, in arrival order, on the control thread. For a big hello
  // (Session::kBigHello), s->prepared holds what Prepare made of it.
  virtual void OnMessage(const std::shared_ptr<Session>& s, wire::Message&& msg) = 0;
  // On the loop's worker thread, for a big hello before OnMessage gets it: the work on it that
  // touches nothing shared (checking and indexing its region table).
  virtual std::shared_ptr<SessionContext> Prepare(const wire::Message& /*hello*/) { return nullptr; }
  // The session is gone (closed by either side, silent too long, or malformed input).
  virtual void OnClosed(const std::shared_ptr<Session>& s, const std::string& reason) = 0;
  // Once per heartbeat interval or so, on the control thread, after the loop's own checks.
  virtual void OnTick() {}
};

struct LoopOptions {
  std::chrono::milliseconds heartbeat_interval{500};
  std::chrono::milliseconds heartbeat_timeout{3000};
  // Peers must authenticate (the engine has a secret): accepted sessions may send only small
  // frames until the engine lifts the cap (Session::set_max_payload).
  bool authenticate = false;
  uint64_t max_queued = 64ull << 20;  // per session (Session::set_max_queued)
  // In a busy exchange (frames other than heartbeats, or wake-ups, within kBusyGap spins of
  // each other) the loop polls this long after each such turn before it sleeps
  // (EngineOptions::spin); 0: it never polls.
  std::chrono::microseconds spin{0};
};

// Accepted connections that have not finished their hello, at most; for each one more, the
// oldest of them is closed.
inline constexpr size_t kMaxPendingSessions = 256;
// Bytes all sessions together may hold of frames not handed on yet (Session::buffered): past
// it, the session holding the most is shut down (a frame may be 64 MiB: without a budget,
// sessions that each begin one and never finish it would hold that much each).
inline constexpr size_t kMaxBufferedBytes = 512ull << 20;
// Bytes of big hellos handed to the worker and not taken yet, at most: one more waits, read,
// in its session (counted there) until those before it are taken. (One alone always goes.)
inline constexpr size_t kMaxPreparingBytes = 256ull << 20;

class ControlLoop {
 public:
  ControlLoop(net::Fd listener, ControlHandler* handler, LoopOptions opts);
  ~ControlLoop();  // Stop()

  Status Start();
  // Hands a session (connected by another thread) to the loop.
  void Add(std::shared_ptr<Session> s);
  // Closes every session (OnClosed is called for each) and joins the thread.
  void Stop();
  // Runs job on the loop's worker thread, ahead of the big hellos waiting there: for the
  // handler's work too slow for the control thread (freeing a big region table). Dropped,
  // captures and all, once the loop stopped.
  void Offload(std::function<void()> job) { worker_.Post(std::move(job)); }

  // What the loop saw of its peers' liveness (read by any thread).
  struct Counters {
    // Times an established session's peer stayed silent for half the heartbeat timeout.
    std::atomic<uint64_t> peers_late{0};
    // Sessions closed because the peer stayed silent for heartbeat_timeout.
    std::atomic<uint64_t> peers_declared_dead{0};
    // Times the loop looked at its connections: each wake-up, and each poll while it spins.
    std::atomic<uint64_t> turns{0};
  };
  const Counters& counters() const { return counters_; }

 private:
  void Run();
  void Wake();
  void Accept();
  void AddQueued();                                                  // the sessions Add() queued, now watched
  void Serve(int fd, uint32_t events);                               // a session's frames, or its end
  Session::Handlers HandlersFor(const std::shared_ptr<Session>& s);  // (for one call: s must outlive them)
  // A big hello: decoded and prepared on the worker, smallest first, while s is held; its
  // result comes back through prepared_. False (s waits in waiting_) past kMaxPreparingBytes.
  bool Prepare(const std::shared_ptr<Session>& s, std::span<const uint8_t> payload);
  void TakePrepared();                             // hands each prepared hello on, and resumes its session
  void Resume(const std::shared_ptr<Session>& s);  // s's frames read while held, and its input
  size_t preparing_ = 0;                           // control thread: bytes at the worker
  std::vector<std::shared_ptr<Session>> waiting_;  // control thread: hellos Prepare refused
  // After frames were handed on: the session's answers written, and its end when it must end.
  void AfterFrames(const std::shared_ptr<Session>& s, bool alive, std::string why, uint32_t events);
  // The events the loop asks for s: its input unless held, room to write while bytes wait.
  void Watch(Session& s);
  // After s's frames were read or handed on (it held `before` bytes then): the loop's total
  // follows, and past kMaxBufferedBytes the sessions holding the most are shut down.
  void Account(const Session& s, size_t before);
  size_t buffered_ = 0;  // control thread: Session::buffered, summed over sessions_
  log::Limit shed_log_{std::chrono::seconds(10)};
  log::Limit broken_log_;  // control thread: connections that ended in error (AfterFrames)
  // Writes what s has queued (its answers, Session::SendSoon, and what other threads' sends
  // left) without blocking, and watches the socket for room while some is left; false (with
  // *why) when the session must close.
  bool FlushAnswers(Session& s, std::string* why);
  void FlushAll();  // FlushAnswers for every session
  void CloseSession(const std::shared_ptr<Session>& s, const std::string& reason);
  void Tick();
  // The sessions accepted, not established and not shut down, oldest first.
  std::vector<std::shared_ptr<Session>> Pending() const;
  std::chrono::steady_clock::time_point last_pending_log_{};

  net::Fd listener_;
  // Out of descriptors, the listener leaves the epoll set until a tick after the pause.
  net::AcceptPause accept_pause_{"control listener"};
  bool listener_paused_ = false;
  net::Fd epoll_;
  net::Fd wake_;  // eventfd
  ControlHandler* handler_;
  const LoopOptions opts_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  // Control thread only: this turn handed on a frame other than a heartbeat, or took a wake-up.
  bool active_ = false;
  Counters counters_;

  std::mutex add_mu_;
  std::vector<std::shared_ptr<Session>> to_add_;  // add_mu_
  struct PreparedHello {
    std::shared_ptr<Session> session;
    wire::Message hello;
    std::shared_ptr<SessionContext> prepared;
    std::string error;  // the payload did not decode
    size_t bytes = 0;   // the payload's
  };
  std::vector<PreparedHello> prepared_;  // add_mu_
  WorkerThread worker_;                  // (stopped by Stop, before the members it uses go)
  std::unordered_map<int, std::shared_ptr<Session>> sessions_;  // control thread only
};

}  // namespace xfer::control
