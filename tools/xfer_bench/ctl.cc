#include "ctl.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include <cstdio>
#include <cstring>

namespace xfer::bench {

bool SplitHostPort(const std::string& s, std::string* host, std::string* port) {
  if (!s.empty() && s[0] == '[') {
    size_t e = s.find(']');
    if (e == std::string::npos || e + 1 >= s.size() || s[e + 1] != ':') return false;
    *host = s.substr(1, e - 1);
    *port = s.substr(e + 2);
  } else {
    size_t c = s.rfind(':');
    if (c == std::string::npos || c == 0) return false;
    *host = s.substr(0, c);
    *port = s.substr(c + 1);
  }
  return !port->empty() && port->find_first_not_of("0123456789") == std::string::npos &&
         std::stoul(*port) <= 65535;
}

std::string SockHost(int fd, bool peer) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if ((peer ? getpeername(fd, (sockaddr*)&ss, &len) : getsockname(fd, (sockaddr*)&ss, &len)) != 0) return "";
  char host[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    inet_ntop(AF_INET, &((sockaddr_in*)&ss)->sin_addr, host, sizeof host);
    return host;
  }
  if (ss.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &((sockaddr_in6*)&ss)->sin6_addr, host, sizeof host);
    return std::string("[") + host + "]";
  }
  return "";
}

namespace {

// A connect to a port of this host that nobody listens on yet can meet itself (TCP
// simultaneous open, when the kernel picks that very port as the source): the socket would then
// hold the port the server is about to bind. Such a connection counts as refused.
bool ConnectedToItself(int fd) {
  sockaddr_storage me{}, peer{};
  socklen_t ml = sizeof me, pl = sizeof peer;
  return getsockname(fd, reinterpret_cast<sockaddr*>(&me), &ml) == 0 &&
         getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) == 0 && ml == pl &&
         std::memcmp(&me, &peer, ml) == 0;
}

}  // namespace

int ConnectRetry(const std::string& hostport, double timeout_s, std::string* err) {
  std::string host, port;
  if (!SplitHostPort(hostport, &host, &port)) {
    *err = "bad peer address '" + hostport + "' (host:port, or [v6]:port)";
    return -1;
  }
  uint64_t deadline = NowNs() + uint64_t(timeout_s * 1e9);
  std::string last;
  for (;;) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
    if (rc != 0) {
      last = std::string("getaddrinfo: ") + gai_strerror(rc);
    } else {
      for (addrinfo* a = res; a; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        const bool connected = connect(fd, a->ai_addr, a->ai_addrlen) == 0;
        if (connected && !ConnectedToItself(fd)) {
          freeaddrinfo(res);
          int one = 1;
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          return fd;
        }
        last = connected ? "connected to itself (nothing listens there yet)" : std::strerror(errno);
        close(fd);
      }
      freeaddrinfo(res);
    }
    if (NowNs() >= deadline) {
      char secs[32];
      std::snprintf(secs, sizeof secs, "%g", timeout_s);
      *err = "cannot reach xfer-bench serve at " + hostport + " within " + secs +
             " s (--connect-timeout): " + last;
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

int ListenSocket(const std::string& hostport, std::string* err) {
  std::string host, port;
  if (!SplitHostPort(hostport, &host, &port)) {
    *err = "--listen: bad address '" + hostport + "' (host:port, or [v6]:port)";
    return -1;
  }
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) {
    *err = "--listen " + hostport + ": " + gai_strerror(rc);
    return -1;
  }
  int fd = socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, res->ai_protocol);
  int one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 8) != 0) {
    *err = "--listen " + hostport + ": " + std::strerror(errno);
    freeaddrinfo(res);
    if (fd >= 0) close(fd);
    return -1;
  }
  freeaddrinfo(res);
  return fd;
}

}  // namespace xfer::bench
