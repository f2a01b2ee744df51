// PeerProcess: starts xfer_test_peer as a real child process and drives it over pipes.
// Every read has a deadline (a wedged peer fails the test instead of hanging it); the
// destructor always reaps the child (asking it to exit, then SIGKILL).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "xfer/types.h"

namespace xfer_test {

using namespace std::chrono_literals;

struct PeerOptions {
  std::string name = "127.0.0.1:0";
  std::string host_id;           // empty: the engine's default
  int heartbeat_ms = 0;          // 0: the engine's default
  int heartbeat_timeout_ms = 0;  // 0: the engine's default
  std::vector<std::string> extra_args;
  std::string netns;             // run inside this network namespace (ip netns exec), as another host
  std::vector<std::string> env;  // NAME=VALUE set for the peer alone (e.g. UCX_NET_DEVICES)
  std::string stderr_file;       // the peer's stderr (its engine's log) into this file; empty: ours
};

// A reply line split into words. ok is true for "OK ..." replies.
struct Reply {
  bool ok = false;
  std::string line;                // the whole line ("TIMEOUT"/"EOF" if none came)
  std::vector<std::string> words;  // words after OK / ERR
  // For ERR replies: the status code name, e.g. "REMOTE_ACCESS_DENIED".
  std::string code() const { return !ok && !words.empty() ? words[0] : std::string(); }
  uint64_t u64(size_t i) const;  // words[i] as a number (0 if missing)
};

// A region the peer allocated and registered.
struct PeerRegion {
  uint64_t handle = 0;
  uint64_t addr = 0;
  uint64_t len = 0;
};

class PeerProcess {
 public:
  PeerProcess() = default;
  ~PeerProcess();
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  // Starts the peer and waits for READY. On failure returns false with *error set.
  bool Start(const PeerOptions& options, std::string* error, std::chrono::milliseconds ready_timeout = 30s);

  const std::string& name() const { return name_; }  // the bound name, e.g. 127.0.0.1:4321
  int port() const;                                  // the port of name()
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }

  // Sends one command and returns its reply. Never blocks past timeout.
  Reply Call(const std::string& command, std::chrono::milliseconds timeout = 30s);
  // Sends a command without reading its reply; read it later with ReadReply.
  bool Send(const std::string& command);
  Reply ReadReply(std::chrono::milliseconds timeout = 30s);

  // "xfer <op> <to> <timeout_ms> <local> <remote> <len> [count]": the peer's own TransferSync
  // of count descriptors (1 when 0) of len bytes, to the engine named `to`.
  Reply Xfer(const char* op, const std::string& to, int timeout_ms, uint64_t local, uint64_t remote,
             uint64_t len, uint64_t count = 0);

  // Convenience wrappers; on an ERR reply they add a gtest failure and return zeros.
  PeerRegion Alloc(uint64_t bytes, const std::string& tag = "",
                   xfer::PeerAccess access = xfer::PeerAccess::kReadWrite);
  // Memory from Engine::AllocMem (shared: same-host engines map it).
  PeerRegion ShmAlloc(uint64_t bytes, const std::string& tag = "", bool huge_pages = false,
                      xfer::PeerAccess access = xfer::PeerAccess::kReadWrite);
  // Registers a range of the peer's memory (again), e.g. one that Alloc mapped.
  PeerRegion Reg(uint64_t addr, uint64_t len, const std::string& tag = "",
                 xfer::PeerAccess access = xfer::PeerAccess::kReadWrite);
  uint64_t Buf(uint64_t bytes);  // unregistered memory, returns its address
  // GPU memory in the peer: Engine::AllocMem(kCuda) on `device` (-1: the peer's current
  // device), or cudaMalloc + RegisterMem(kCuda) (registered: true). Fill/Sum work on it (the
  // peer copies through host memory).
  PeerRegion DeviceAlloc(uint64_t bytes, int device = -1, const std::string& tag = "",
                         bool registered = false, xfer::PeerAccess access = xfer::PeerAccess::kReadWrite);
  void Fill(const PeerRegion& r, uint64_t seed) { FillRange(r.addr, r.len, seed); }
  void FillRange(uint64_t addr, uint64_t len, uint64_t seed);
  uint64_t Sum(const PeerRegion& r) { return SumRange(r.addr, r.len); }
  uint64_t SumRange(uint64_t addr, uint64_t len);

  // Signals. Kill(SIGKILL) does not reap; WaitExit does.
  // Sends sig; SIGSTOP returns once the process has stopped (or after 5 s).
  void Signal(int sig);
  // The process's state letter in /proc (R, S, T, Z, ...; '?' when gone).
  char State() const;
  // Waits for the child to end; returns false on timeout. *status gets the waitpid status.
  bool WaitExit(std::chrono::milliseconds timeout, int* status = nullptr);
  // Asks the peer to exit ("exit"), waits, and reports whether it exited with status 0.
  bool ExitCleanly(std::chrono::milliseconds timeout = 20s);
  // SIGKILL and reap (blocking). Safe to call when not running.
  void KillNow();

 private:
  bool ReadLine(std::string* line, std::chrono::steady_clock::time_point deadline);
  void CloseFds();

  pid_t pid_ = -1;
  int to_child_ = -1;
  int from_child_ = -1;
  bool stopped_ = false;
  bool killed_ = false;  // SIGKILLed through Signal(): reaped quietly
  std::string name_;
  std::string buffer_;
};

// A fresh TCP port on 127.0.0.1 that nothing listens on (bound then closed), below the
// ephemeral range where it can be (so no port-0 bind or connection takes it meanwhile).
int UnusedPort();

// Sends SIGSTOP to pid and returns once every thread of it has stopped (true), or after the
// timeout (false). A stop signal wakes one thread, which stops the others as each next runs:
// until the last has, a process under load may still answer requests.
bool StopProcess(pid_t pid, std::chrono::milliseconds timeout = 5s);
// Whether every thread of pid is stopped by a signal (state T in /proc/pid/task/*/stat).
bool EveryThreadStopped(pid_t pid);

}  // namespace xfer_test
