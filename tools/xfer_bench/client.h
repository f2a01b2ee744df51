// The client side: a local target when there is no peer, and the Bench that runs the tests or
// the table and reports them.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include "bench_mem.h"
#include "ctl.h"
#include "initiator.h"
#include "serve.h"

namespace xfer::bench {

// A target this process started: a child process running `xfer-bench serve --ctl-fd`, or (for
// --transport local) a session on a thread of this process. Either way, one end of a socketpair.
class LocalTarget {
 public:
  ~LocalTarget() { Stop(); }

  // Returns an error message, empty on success; *fd is this side's end of the control channel.
  std::string Start(bool in_process, const std::string& host_id, const std::string& secret_file, int* fd) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
      return std::string("socketpair: ") + std::strerror(errno);
    if (in_process) {
      int theirs = sv[1];
      thread_ = std::thread([theirs, host_id, secret_file] {
        Ctl ctl(theirs);
        Config side;  // (its metrics are not served: this process's engine's are)
        side.host_id = host_id;
        side.secret_file = secret_file;
        ServeSession(ctl, "127.0.0.1", side, true, false);
      });
      *fd = sv[0];
      return "";
    }
    std::string exe = SelfExe();
    if (exe.empty()) return "cannot read /proc/self/exe";
    std::vector<std::string> args = {exe, "serve", "--ctl-fd", std::to_string(sv[1])};
    if (!host_id.empty()) args.insert(args.end(), {"--host-id", host_id});
    if (!secret_file.empty()) args.insert(args.end(), {"--secret-file", secret_file});
    std::vector<char*> cargv;
    for (auto& a : args) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) return std::string("fork: ") + std::strerror(errno);
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent) _exit(1);
      fcntl(sv[1], F_SETFD, 0);  // the child's end survives exec
      execv(exe.c_str(), cargv.data());
      _exit(127);
    }
    pid_ = pid;
    close(sv[1]);
    *fd = sv[0];
    return "";
  }

  // Call after the control channel is closed: the session then ends.
  void Stop() {
    if (thread_.joinable()) thread_.join();
    if (pid_ > 0) {
      int st;
      for (int i = 0; i < 500; ++i) {  // up to 5 s for a clean exit
        if (waitpid(pid_, &st, WNOHANG) == pid_) {
          pid_ = -1;
          return;
        }
        usleep(10000);
      }
      kill(pid_, SIGKILL);
      waitpid(pid_, &st, 0);
      pid_ = -1;
    }
  }
  int pid() const { return pid_; }

 private:
  int pid_ = -1;
  std::thread thread_;
};

// One table cell (or measured row) for the `table` test.
struct Cell {
  std::string scenario, op, transport, direction, path;
  uint64_t bytes = 0;
  double gbps = -1;
  double p99 = -1;
  std::string why;  // n/a reason; empty when measured
};

class Bench {
 public:
  Bench(const Config& c, std::string argv0, std::string invoked)
      : c_(c), argv0_(std::move(argv0)), invoked_(std::move(invoked)) {}
  int Run();

 private:
  // Sets up one session (target, engines, connection) with this transport forced (empty: best),
  // c_'s memory kinds and buffer pool; a local target child gets target_host_id_ when set.
  std::string Setup(const std::string& transport);
  void Teardown();
  bool RunOne(const std::string& test, uint64_t block, Row* fwd, Row* rev, std::string* err);
  int RunTests();
  int RunTable();
  void PrintHeader(const std::string& transport_note);
  void PrintTableHeader(const std::string& test);
  void PrintRow(const Row& r);
  int Finish();
  bool WriteJson(std::string* err);
  bool WriteCsv(std::string* err);
  std::string WhereLine() const;
  std::string MemNote() const;
  std::string HugeNote() const;
  void PrintPaths(const std::string& test);
  std::string GpuNote() const;

  Config c_;
  std::string argv0_, invoked_;
  LocalTarget target_;
  Ctl ctl_;
  // Before engine_, so that they outlive it (Teardown releases them in order anyway).
  BenchMem local_, region_;  // region_: this side's target region (bidirectional)
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<NotifyDrain> drain_;  // destroyed first: it uses engine_
  std::unique_ptr<Initiator> init_;
  std::string peer_;
  xfer::PeerInfo peer_info_;
  std::string rev_transport_;
  bool rev_shm_ = false;
  bool srv_in_process_ = false;
  std::string target_host_id_;  // table, bufferpool cells: the local target's own host id
  int srv_pid_ = 0;
  std::string srv_host_;
  uint64_t srv_page_kb_ = 0;
  uint64_t local_page_kb_ = 0;  // with --huge-pages: the page size of this side's buffers
  uint64_t remote_addr_ = 0, remote_len_ = 0;
  bool remote_shared_ = false;  // the peer's region came from AllocMem
  std::vector<Row> rows_;
  std::vector<Cell> cells_;  // table
  Progress progress_;
  bool verify_failed_ = false;
};

}  // namespace xfer::bench
