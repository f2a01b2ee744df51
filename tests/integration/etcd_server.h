// EtcdServer: a real etcd (Debian's etcd-server) for the cluster-metadata tests, on free
// loopback ports with a temporary data directory, started and stopped by the test. Tests
// skip when etcd is not installed (Installed()).
#pragma once

#include <sys/types.h>

#include <string>

namespace xfer_test {

class EtcdServer {
 public:
  EtcdServer() = default;
  ~EtcdServer();  // kills it and removes its data directory
  EtcdServer(const EtcdServer&) = delete;
  EtcdServer& operator=(const EtcdServer&) = delete;

  static std::string Binary();  // the etcd executable, or "" when not installed

  // Starts etcd on fresh ports and waits (up to 20 s) until it serves clients.
  bool Start(std::string* error);
  // SIGKILL, as a crash would.
  void Kill();
  // SIGSTOP / SIGCONT: an etcd that hangs (its connections stay open and answer nothing).
  // Freeze returns once every thread of etcd has stopped (false: not within 5 s).
  bool Freeze();
  void Thaw();
  // Starts it again on the same ports; fresh: with an empty data directory (etcd lost every
  // key and lease), else with the data it had.
  bool Restart(bool fresh, std::string* error);

  std::string endpoint() const { return "127.0.0.1:" + std::to_string(client_port_); }
  std::string url(const std::string& prefix = "") const {
    return "etcd://" + endpoint() + (prefix.empty() ? "" : "/" + prefix);
  }
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

 private:
  bool Launch(std::string* error);

  pid_t pid_ = -1;
  int client_port_ = 0;
  int peer_port_ = 0;
  std::string dir_;  // holds data/ and log
};

}  // namespace xfer_test
