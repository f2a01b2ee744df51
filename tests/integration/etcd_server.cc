#include "etcd_server.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "peer_process.h"  // UnusedPort, StopProcess

namespace xfer_test {

std::string EtcdServer::Binary() {
  for (const char* p : {"/usr/bin/etcd", "/usr/local/bin/etcd"}) {
    if (access(p, X_OK) == 0) return p;
  }
  return "";
}

EtcdServer::~EtcdServer() {
  Kill();
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

bool EtcdServer::Start(std::string* error) {
  char tmpl[] = "/tmp/xfer-etcd-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    *error = "mkdtemp failed";
    return false;
  }
  dir_ = tmpl;
  client_port_ = UnusedPort();
  peer_port_ = UnusedPort();
  return Launch(error);
}

bool EtcdServer::Restart(bool fresh, std::string* error) {
  Kill();
  if (fresh) {
    std::error_code ec;
    std::filesystem::remove_all(dir_ + "/data", ec);
  }
  return Launch(error);
}

void EtcdServer::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);  // (a frozen one too)
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

bool EtcdServer::Freeze() { return pid_ > 0 && StopProcess(pid_); }

void EtcdServer::Thaw() {
  if (pid_ > 0) kill(pid_, SIGCONT);
}

bool EtcdServer::Launch(std::string* error) {
  const std::string bin = Binary();
  if (bin.empty()) {
    *error = "etcd is not installed (apt-get install etcd-server)";
    return false;
  }
  const std::string client = "http://" + endpoint();
  const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
  const std::string log = dir_ + "/log";
  std::vector<std::string> args = {bin,
                                   "--name",
                                   "xfer-test",
                                   "--data-dir",
                                   dir_ + "/data",
                                   "--listen-client-urls",
                                   client,
                                   "--advertise-client-urls",
                                   client,
                                   "--listen-peer-urls",
                                   peer,
                                   "--initial-advertise-peer-urls",
                                   peer,
                                   "--initial-cluster",
                                   "xfer-test=" + peer};
  // Everything the child needs is made before the fork: between fork and exec it only calls
  // async-signal-safe functions (this process has threads that may hold allocator locks).
  const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) {
    *error = "cannot open " + log;
    return false;
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_ = fork();
  if (pid_ == 0) {
    if (dup2(out, STDOUT_FILENO) < 0 || dup2(out, STDERR_FILENO) < 0) _exit(127);
    execv(argv[0], argv.data());
    _exit(127);
  }
  ::close(out);
  if (pid_ < 0) {
    *error = "fork failed";
    return false;
  }
  // Ready once it says it serves clients (it has elected itself leader by then).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    if (text.str().find("serving insecure client requests") != std::string::npos) return true;
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      *error = "etcd exited at start: " + text.str().substr(0, 2000);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  *error = "etcd did not start serving within 20 s";
  Kill();
  return false;
}

}  // namespace xfer_test
