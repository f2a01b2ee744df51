// The control channel between client and target (one JSON object per line), and the sockets
// under it.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common.h"

namespace xfer::bench {

class Ctl {
 public:
  Ctl() = default;
  explicit Ctl(int fd) : fd_(fd) {}
  ~Ctl() { Close(); }
  Ctl(const Ctl&) = delete;
  Ctl& operator=(const Ctl&) = delete;
  void Reset(int fd) {
    Close();
    fd_ = fd;
    buf_.clear();
  }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  bool open() const { return fd_ >= 0; }
  int fd() const { return fd_; }

  bool Send(const json& j) {
    std::string s = j.dump() + "\n";
    size_t off = 0;
    while (off < s.size()) {
      ssize_t n = send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      off += size_t(n);
    }
    return true;
  }
  // Waits up to timeout_ms (-1: forever) for one message. Empty error = ok.
  std::string Recv(json* out, int timeout_ms) {
    uint64_t deadline = timeout_ms < 0 ? 0 : NowNs() + uint64_t(timeout_ms) * 1000000ull;
    for (;;) {
      size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        try {
          *out = json::parse(line);
        } catch (const std::exception& e) {
          return std::string("bad control message: ") + e.what();
        }
        if (!out->is_object() || !out->contains("type")) return "bad control message: no type";
        return "";
      }
      if (buf_.size() > (1u << 20)) return "control message too long";
      int wait = -1;
      if (timeout_ms >= 0) {
        int64_t left = (int64_t(deadline) - int64_t(NowNs())) / 1000000;
        if (left <= 0) return "timed out waiting for the peer's control message";
        wait = int(left);
      }
      pollfd p{fd_, POLLIN, 0};
      int r = poll(&p, 1, wait);
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) continue;
      char tmp[4096];
      ssize_t n = read(fd_, tmp, sizeof tmp);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return "the control connection closed";
      buf_.append(tmp, size_t(n));
    }
  }
  // Send, then wait for a reply; a reply of type "error" becomes the error.
  std::string Call(const json& req, json* reply, int timeout_ms) {
    if (!Send(req)) return "the control connection closed";
    std::string e = Recv(reply, timeout_ms);
    if (!e.empty()) return e;
    if ((*reply)["type"] == "error") return (*reply).value("msg", std::string("error"));
    return "";
  }

 private:
  int fd_ = -1;
  std::string buf_;
};

// "host:port" -> address; brackets for IPv6.
bool SplitHostPort(const std::string& s, std::string* host, std::string* port);
// The numeric address of a connected socket's local or remote end, formatted for an engine name.
std::string SockHost(int fd, bool peer);
// Connects to host:port, retrying until the deadline (start order must not matter).
int ConnectRetry(const std::string& hostport, double timeout_s, std::string* err);
// A listening socket on host:port; -1 and *err on failure.
int ListenSocket(const std::string& hostport, std::string* err);

}  // namespace xfer::bench
