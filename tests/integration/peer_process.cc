#include "peer_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#ifndef XFER_TEST_PEER_PATH
#error "XFER_TEST_PEER_PATH must be defined by the build"
#endif

namespace xfer_test {
namespace {

using Clock = std::chrono::steady_clock;

// The state letter in a /proc stat file ('?' when it cannot be read).
char StateIn(const std::string& stat_path) {
  std::ifstream in(stat_path);
  std::string line;
  std::getline(in, line);
  const size_t close = line.rfind(')');  // "pid (comm) S ..."
  return close != std::string::npos && close + 2 < line.size() ? line[close + 2] : '?';
}

void IgnoreSigpipeOnce() {
  static const bool done = [] {
    signal(SIGPIPE, SIG_IGN);  // a dead peer's stdin must not kill the test
    return true;
  }();
  (void)done;
}

Reply Parse(const std::string& line) {
  Reply r;
  r.line = line;
  std::istringstream in(line);
  std::string first;
  in >> first;
  r.ok = first == "OK";
  std::string w;
  while (in >> w) r.words.push_back(w);
  return r;
}

}  // namespace

uint64_t Reply::u64(size_t i) const {
  return i < words.size() ? std::strtoull(words[i].c_str(), nullptr, 10) : 0;
}

PeerProcess::~PeerProcess() {
  if (pid_ <= 0) return;
  if (killed_) {  // the test killed it on purpose: just reap
    KillNow();
    return;
  }
  if (stopped_) Signal(SIGCONT);
  // Polite first: the peer finalizes its engine (goodbye to us) and must exit cleanly; a
  // crash, a sanitizer report or a leak in the peer's engine fails the test that used it.
  const pid_t pid = pid_;
  int st = 0;
  if (!Send("exit") || !WaitExit(20s, &st)) {
    KillNow();
    ADD_FAILURE() << "xfer_test_peer " << pid << " did not exit within 20 s of 'exit'";
  } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    ADD_FAILURE() << "xfer_test_peer " << pid << " ended badly: "
                  << (WIFSIGNALED(st) ? "signal " + std::to_string(WTERMSIG(st))
                                      : "exit status " + std::to_string(WEXITSTATUS(st)));
  }
  CloseFds();
}

bool PeerProcess::Start(const PeerOptions& o, std::string* error, std::chrono::milliseconds ready_timeout) {
  IgnoreSigpipeOnce();
  if (pid_ > 0) {
    *error = "already started";
    return false;
  }
  std::vector<std::string> args = {XFER_TEST_PEER_PATH, "--name", o.name};
  if (!o.env.empty()) {
    args.insert(args.begin(), o.env.begin(), o.env.end());
    args.insert(args.begin(), "env");
  }
  if (!o.netns.empty()) args.insert(args.begin(), {"ip", "netns", "exec", o.netns});
  if (!o.host_id.empty()) args.insert(args.end(), {"--host-id", o.host_id});
  if (o.heartbeat_ms > 0) args.insert(args.end(), {"--heartbeat-ms", std::to_string(o.heartbeat_ms)});
  if (o.heartbeat_timeout_ms > 0) {
    args.insert(args.end(), {"--heartbeat-timeout-ms", std::to_string(o.heartbeat_timeout_ms)});
  }
  args.insert(args.end(), o.extra_args.begin(), o.extra_args.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) {
    *error = std::string("pipe2: ") + std::strerror(errno);
    return false;
  }
  if (pipe2(out, O_CLOEXEC) != 0) {
    *error = std::string("pipe2: ") + std::strerror(errno);
    close(in[0]);
    close(in[1]);
    return false;
  }
  const int err = o.stderr_file.empty()
                      ? -1
                      : open(o.stderr_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (!o.stderr_file.empty() && err < 0) {
    *error = o.stderr_file + ": " + std::strerror(errno);
    for (int fd : {in[0], in[1], out[0], out[1]}) close(fd);
    return false;
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    *error = std::string("fork: ") + std::strerror(errno);
    for (int fd : {in[0], in[1], out[0], out[1], err}) {
      if (fd >= 0) close(fd);
    }
    return false;
  }
  if (pid == 0) {
    // Child: async-signal-safe calls only until exec.
    dup2(in[0], STDIN_FILENO);
    dup2(out[1], STDOUT_FILENO);
    if (err >= 0) dup2(err, STDERR_FILENO);
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
    if (getppid() != parent) _exit(126);
    // Do not leak the test engine's sockets into the peer.
    if (syscall(SYS_close_range, 3u, ~0u, 0u) != 0) {
      for (int fd = 3; fd < 4096; ++fd) close(fd);
    }
    execvp(argv[0], argv.data());
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  if (err >= 0) close(err);
  pid_ = pid;
  to_child_ = in[1];
  from_child_ = out[0];
  stopped_ = false;
  killed_ = false;
  buffer_.clear();

  const auto deadline = Clock::now() + ready_timeout;
  std::string line;
  while (ReadLine(&line, deadline)) {
    if (line.rfind("READY ", 0) == 0) {
      std::istringstream ss(line.substr(6));
      ss >> name_;
      return !name_.empty();
    }
    if (line.rfind("FAIL", 0) == 0) {
      *error = "peer failed to start: " + line;
      WaitExit(5s);
      KillNow();
      CloseFds();
      return false;
    }
  }
  *error = "peer did not print READY within the deadline (" + args[0] + ")";
  KillNow();
  CloseFds();
  return false;
}

int PeerProcess::port() const {
  const size_t colon = name_.rfind(':');
  return colon == std::string::npos ? 0 : std::atoi(name_.c_str() + colon + 1);
}

bool PeerProcess::Send(const std::string& command) {
  if (to_child_ < 0) return false;
  const std::string line = command + "\n";
  size_t off = 0;
  while (off < line.size()) {
    const ssize_t n = write(to_child_, line.data() + off, line.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

Reply PeerProcess::ReadReply(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string line;
  while (ReadLine(&line, deadline)) {
    if (line.rfind("OK", 0) == 0 || line.rfind("ERR", 0) == 0) return Parse(line);
    // Anything else is not part of the protocol: show it and keep reading.
    std::fprintf(stderr, "[peer %d] %s\n", static_cast<int>(pid_), line.c_str());
  }
  Reply r;
  r.line = from_child_ < 0 ? "EOF (no peer)" : "TIMEOUT or EOF waiting for the peer's reply";
  return r;
}

Reply PeerProcess::Call(const std::string& command, std::chrono::milliseconds timeout) {
  if (!Send(command)) {
    Reply r;
    r.line = "SEND FAILED (peer gone?)";
    return r;
  }
  return ReadReply(timeout);
}

bool PeerProcess::ReadLine(std::string* line, Clock::time_point deadline) {
  for (;;) {
    const size_t nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      *line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return true;
    }
    if (from_child_ < 0) return false;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{from_child_, POLLIN, 0};
    const int rc = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (rc < 0 && errno != EINTR) return false;
    if (rc <= 0) continue;
    char buf[4096];
    const ssize_t n = read(from_child_, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return false;  // EOF: the peer is gone
    buffer_.append(buf, static_cast<size_t>(n));
  }
}

namespace {
// The last words of alloc, shmalloc and reg: the tag ("-" for none) and "ro" for read-only.
std::string TagAndAccess(const std::string& tag, xfer::PeerAccess access) {
  return " " + (tag.empty() ? std::string("-") : tag) + (access == xfer::PeerAccess::kReadOnly ? " ro" : "");
}
}  // namespace

PeerRegion PeerProcess::Alloc(uint64_t bytes, const std::string& tag, xfer::PeerAccess access) {
  Reply r = Call("alloc " + std::to_string(bytes) + TagAndAccess(tag, access));
  if (!r.ok || r.words.size() < 2) {
    ADD_FAILURE() << "peer alloc " << bytes << " failed: " << r.line;
    return {};
  }
  return PeerRegion{r.u64(0), r.u64(1), bytes};
}

Reply PeerProcess::Xfer(const char* op, const std::string& to, int timeout_ms, uint64_t local,
                        uint64_t remote, uint64_t len, uint64_t count) {
  return Call(std::string("xfer ") + op + " " + to + " " + std::to_string(timeout_ms) + " " +
              std::to_string(local) + " " + std::to_string(remote) + " " + std::to_string(len) +
              (count ? " " + std::to_string(count) : std::string()));
}

PeerRegion PeerProcess::ShmAlloc(uint64_t bytes, const std::string& tag, bool huge_pages,
                                 xfer::PeerAccess access) {
  Reply r =
      Call("shmalloc " + std::to_string(bytes) + TagAndAccess(tag, access) + (huge_pages ? " huge" : ""));
  if (!r.ok || r.words.size() < 2) {
    ADD_FAILURE() << "peer shmalloc " << bytes << " failed: " << r.line;
    return {};
  }
  return PeerRegion{r.u64(0), r.u64(1), bytes};
}

PeerRegion PeerProcess::Reg(uint64_t addr, uint64_t len, const std::string& tag, xfer::PeerAccess access) {
  Reply r = Call("reg " + std::to_string(addr) + " " + std::to_string(len) + TagAndAccess(tag, access));
  if (!r.ok || r.words.empty()) {
    ADD_FAILURE() << "peer reg " << len << " bytes failed: " << r.line;
    return {};
  }
  return PeerRegion{r.u64(0), addr, len};
}

PeerRegion PeerProcess::DeviceAlloc(uint64_t bytes, int device, const std::string& tag, bool registered,
                                    xfer::PeerAccess access) {
  Reply r = Call(std::string(registered ? "dreg " : "dalloc ") + std::to_string(bytes) + " " +
                 std::to_string(device) + TagAndAccess(tag, access));
  if (!r.ok || r.words.size() < 2) {
    ADD_FAILURE() << "peer " << (registered ? "dreg " : "dalloc ") << bytes << " failed: " << r.line;
    return {};
  }
  return PeerRegion{r.u64(0), r.u64(1), bytes};
}

uint64_t PeerProcess::Buf(uint64_t bytes) {
  Reply r = Call("buf " + std::to_string(bytes));
  if (!r.ok || r.words.empty()) {
    ADD_FAILURE() << "peer buf " << bytes << " failed: " << r.line;
    return 0;
  }
  return r.u64(0);
}

void PeerProcess::FillRange(uint64_t addr, uint64_t len, uint64_t seed) {
  Reply r = Call("fillr " + std::to_string(addr) + " " + std::to_string(len) + " " + std::to_string(seed));
  if (!r.ok) ADD_FAILURE() << "peer fillr failed: " << r.line;
}

uint64_t PeerProcess::SumRange(uint64_t addr, uint64_t len) {
  Reply r = Call("sumr " + std::to_string(addr) + " " + std::to_string(len));
  if (!r.ok || r.words.empty()) {
    ADD_FAILURE() << "peer sumr failed: " << r.line;
    return 0;
  }
  return r.u64(0);
}

char PeerProcess::State() const { return StateIn("/proc/" + std::to_string(pid_) + "/stat"); }

void PeerProcess::Signal(int sig) {
  if (pid_ <= 0) return;
  if (sig == SIGSTOP) {
    StopProcess(pid_);  // (nothing the test does next is served by the process still running)
  } else {
    kill(pid_, sig);
  }
  if (sig == SIGKILL) killed_ = true;
  if (sig == SIGSTOP) stopped_ = true;
  if (sig == SIGCONT) stopped_ = false;
}

bool PeerProcess::WaitExit(std::chrono::milliseconds timeout, int* status) {
  if (pid_ <= 0) return true;
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    int st = 0;
    const pid_t r = waitpid(pid_, &st, WNOHANG);
    if (r == pid_ || (r < 0 && errno == ECHILD)) {
      if (status != nullptr) *status = st;
      pid_ = -1;
      CloseFds();
      return true;
    }
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
}

bool PeerProcess::ExitCleanly(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return false;
  if (stopped_) Signal(SIGCONT);
  Send("exit");
  int st = 0;
  if (!WaitExit(timeout, &st)) {
    KillNow();
    return false;
  }
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

void PeerProcess::KillNow() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  int st = 0;
  while (waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  stopped_ = false;
  killed_ = false;
  CloseFds();
}

void PeerProcess::CloseFds() {
  if (to_child_ >= 0) close(to_child_);
  if (from_child_ >= 0) close(from_child_);
  to_child_ = from_child_ = -1;
}

namespace {

// Whether a listening socket may bind 127.0.0.1:port now (port 0: any; *port gets the one).
bool BindsNow(int* port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(*port));
  socklen_t len = sizeof a;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  if (ok) *port = ntohs(a.sin_port);
  close(fd);
  return ok;
}

}  // namespace

int UnusedPort() {
  // Below the kernel's ephemeral range, where no bind to port 0 and no outgoing connection
  // lands: a server stopped and started again on its port (etcd) finds it still free, though
  // other tests run beside it. (Other tests' picks here are random, so rarely the same.)
  int low = 32768, high = 60999;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> low >> high;
  constexpr int kFirst = 10000;
  if (low - kFirst >= 1000) {
    std::random_device seed;
    std::mt19937 pick(seed());
    std::uniform_int_distribution<int> in(kFirst, low - 1);
    for (int tries = 0; tries < 100; ++tries) {
      int port = in(pick);
      if (BindsNow(&port)) return port;
    }
  }
  int port = 0;
  return BindsNow(&port) ? port : 0;
}

bool EveryThreadStopped(pid_t pid) {
  std::error_code ec;
  std::filesystem::directory_iterator tasks("/proc/" + std::to_string(pid) + "/task", ec);
  if (ec) return false;
  bool any = false;
  for (const auto& task : tasks) {
    const char state = StateIn(task.path().string() + "/stat");
    if (state != 'T' && state != '?') return false;  // ('?': the thread ended meanwhile)
    any = any || state == 'T';
  }
  return any;
}

bool StopProcess(pid_t pid, std::chrono::milliseconds timeout) {
  if (kill(pid, SIGSTOP) != 0) return false;
  const auto until = Clock::now() + timeout;
  while (!EveryThreadStopped(pid)) {
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return true;
}

}  // namespace xfer_test
