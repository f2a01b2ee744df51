#include "util/net.h"

#include "util/log.h"
#include "util/spin.h"
#include "util/text.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <unordered_map>

namespace xfer::net {
using text::Errno;
namespace {

// Rounded up: a wait must not end before its deadline (a caller then tells a timeout from a
// failure by the clock).
int MillisLeft(Clock::time_point deadline) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) return 0;
  return left.count() > 1 << 30 ? 1 << 30 : static_cast<int>(left.count());
}

// True while a spin-wait that started at the first call may go on (and paces it once).
bool SpinOnce(std::chrono::microseconds spin, Clock::time_point* until, Backoff* backoff) {
  if (spin.count() <= 0) return false;
  auto now = Clock::now();
  if (*until == Clock::time_point{}) *until = now + spin;
  if (now >= *until) return false;
  backoff->Pause();
  return true;
}

// Waits for `events` on fd; false on timeout (also when the deadline has passed already, ready
// or not: a caller that loops on it must not spin past its deadline).
bool PollFor(int fd, short events, Clock::time_point deadline) {
  if (Clock::now() >= deadline) return false;
  for (;;) {
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, MillisLeft(deadline));
    if (r > 0) return true;
    if (r == 0) {
      if (Clock::now() >= deadline) return false;
      continue;  // woke early (the kernel's timer slack): wait out the rest
    }
    if (errno != EINTR) return true;  // let the following call report the error
  }
}

Status Resolve(const Address& addr, sockaddr_storage* ss, socklen_t* len) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | AI_PASSIVE;
  addrinfo* res = nullptr;
  std::string port = std::to_string(addr.port);
  int rc = ::getaddrinfo(addr.host.empty() ? nullptr : addr.host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return {StatusCode::kInvalidArgument, "cannot resolve host '" + addr.host + "': " + ::gai_strerror(rc)};
  }
  std::memcpy(ss, res->ai_addr, res->ai_addrlen);
  *len = res->ai_addrlen;
  ::freeaddrinfo(res);
  return Status::Ok();
}

}  // namespace

std::string Address::ToString() const {
  std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return has_port ? h + ":" + std::to_string(port) : h;
}

Status ParseAddress(const std::string& name, Address* out) {
  Address a;
  std::string rest;
  if (name.empty()) return {StatusCode::kInvalidArgument, "empty engine name"};
  if (name[0] == '[') {
    size_t close = name.find(']');
    if (close == std::string::npos) {
      return {StatusCode::kInvalidArgument, "'" + name + "': missing ']' after IPv6 address"};
    }
    a.host = name.substr(1, close - 1);
    rest = name.substr(close + 1);
    if (!rest.empty() && rest[0] != ':') {
      return {StatusCode::kInvalidArgument, "'" + name + "': expected ':port' after ']'"};
    }
  } else {
    size_t colon = name.rfind(':');
    if (colon != std::string::npos && name.find(':') != colon) {
      return {StatusCode::kInvalidArgument, "'" + name + "': IPv6 addresses need brackets, as in [::1]:5000"};
    }
    a.host = name.substr(0, colon);
    if (colon != std::string::npos) rest = name.substr(colon);
  }
  if (a.host.empty()) return {StatusCode::kInvalidArgument, "'" + name + "': empty host"};
  if (!rest.empty()) {
    std::string digits = rest.substr(1);
    if (digits.empty() || digits.size() > 5 || digits.find_first_not_of("0123456789") != std::string::npos ||
        std::stoul(digits) > 65535) {
      return {StatusCode::kInvalidArgument, "'" + name + "': port must be a number 0..65535"};
    }
    a.port = static_cast<uint16_t>(std::stoul(digits));
    a.has_port = true;
  }
  *out = a;
  return Status::Ok();
}

void Fd::Reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void SetNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

Status Listen(const Address& addr, Fd* out, Address* bound) {
  sockaddr_storage ss{};
  socklen_t len = 0;
  Status s = Resolve(addr, &ss, &len);
  if (!s.ok()) return s;
  Fd fd(::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return {StatusCode::kResourceExhausted, Errno("socket")};
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    return {StatusCode::kInvalidArgument, Errno(("bind " + addr.ToString()).c_str())};
  }
  if (::listen(fd.get(), 128) != 0) return {StatusCode::kInternal, Errno("listen")};
  sockaddr_storage got{};
  socklen_t glen = sizeof got;
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&got), &glen);
  *bound = addr;
  bound->has_port = true;
  bound->port = ntohs(got.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&got)->sin6_port
                                                : reinterpret_cast<sockaddr_in*>(&got)->sin_port);
  *out = std::move(fd);
  return Status::Ok();
}

Status ConnectTcp(const Address& addr, Clock::time_point deadline, Fd* out, const std::atomic<bool>* proceed,
                  const Source* from) {
  sockaddr_storage ss{};
  socklen_t len = 0;
  Status s = Resolve(addr, &ss, &len);
  if (!s.ok()) return s;
  Fd fd(::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return {StatusCode::kResourceExhausted, Errno("socket")};
  SetNoDelay(fd.get());
  if (from != nullptr && !from->address.empty()) {
    if (!from->device.empty()) {  // (best effort: without the privilege, the address alone)
      ::setsockopt(fd.get(), SOL_SOCKET, SO_BINDTODEVICE, from->device.c_str(),
                   static_cast<socklen_t>(from->device.size()));
    }
    sockaddr_storage src{};
    socklen_t src_len = 0;
    if (s = Resolve(Address{from->address, 0, true}, &src, &src_len); !s.ok()) return s;
    const int no_port = 1;  // (the port is chosen at connect, per destination: no port held)
    ::setsockopt(fd.get(), IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &no_port, sizeof no_port);
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&src), src_len) != 0) {
      return {StatusCode::kConnectionLost, Errno(("bind to " + from->address).c_str())};
    }
  }
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    if (errno != EINPROGRESS) {
      return {StatusCode::kConnectionLost, Errno(("connect " + addr.ToString()).c_str())};
    }
    for (;;) {
      const auto step = proceed ? std::min(deadline, Clock::now() + std::chrono::milliseconds(50)) : deadline;
      if (PollFor(fd.get(), POLLOUT, step)) break;
      if (Clock::now() >= deadline)
        return {StatusCode::kTimeout, "connect " + addr.ToString() + ": timed out"};
      if (!proceed->load()) return {StatusCode::kCanceled, "connect " + addr.ToString() + ": given up"};
    }
    int err = 0;
    socklen_t elen = sizeof err;
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &elen);
    if (err != 0) {
      return {StatusCode::kConnectionLost, "connect " + addr.ToString() + ": " + std::strerror(err)};
    }
  }
  *out = std::move(fd);
  return Status::Ok();
}

Status SendAll(int fd, const void* data, size_t len, Clock::time_point deadline) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!PollFor(fd, POLLOUT, deadline)) return {StatusCode::kTimeout, "send timed out"};
      continue;
    }
    return {StatusCode::kConnectionLost, Errno("send")};
  }
  return Status::Ok();
}

namespace {

// RecvAll, and with rest > 0 RecvOnceStarted: the deadline becomes now + rest at the first byte.
Status Recv(int fd, void* data, size_t len, Clock::time_point deadline, std::chrono::milliseconds rest,
            std::chrono::microseconds spin, Clock::time_point* started) {
  char* p = static_cast<char*>(data);
  Clock::time_point spin_until{};
  // Every step is a recv call already: yield at once, the sender may need this core (pauses
  // first made tcp slower: bench/RESULTS.md, "How the defaults were chosen").
  Backoff backoff(0);
  while (len > 0) {
    ssize_t n = ::recv(fd, p, len, MSG_DONTWAIT);
    if (n > 0) {
      if (rest.count() > 0 && p == data) {
        *started = Clock::now();
        deadline = *started + rest;
      }
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return {StatusCode::kConnectionLost, "peer closed the connection"};
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (SpinOnce(spin, &spin_until, &backoff)) continue;
      if (!PollFor(fd, POLLIN, deadline)) return {StatusCode::kTimeout, "receive timed out"};
      continue;
    }
    return {StatusCode::kConnectionLost, Errno("recv")};
  }
  return Status::Ok();
}

}  // namespace

Status RecvAll(int fd, void* data, size_t len, Clock::time_point deadline, std::chrono::microseconds spin) {
  return Recv(fd, data, len, deadline, {}, spin, nullptr);
}

Status RecvOnceStarted(int fd, void* data, size_t len, std::chrono::milliseconds rest,
                       std::chrono::microseconds spin, Clock::time_point* started) {
  return Recv(fd, data, len, Clock::time_point::max(), std::max(rest, std::chrono::milliseconds(1)), spin,
              started);
}

Status RecvIfStarting(int fd, void* data, size_t len, std::chrono::milliseconds rest,
                      std::chrono::microseconds spin, std::chrono::milliseconds idle,
                      Clock::time_point* started) {
  *started = Clock::time_point{};
  // (The first byte moves the deadline to its arrival + rest.)
  return Recv(fd, data, len, Clock::now() + idle, std::max(rest, std::chrono::milliseconds(1)), spin,
              started);
}

namespace {

// Drops `done` bytes from the front of iov[*first..n).
void Advance(iovec* iov, size_t n, size_t* first, size_t done) {
  while (*first < n && done >= iov[*first].iov_len) {
    done -= iov[*first].iov_len;
    ++*first;
  }
  if (*first < n) {
    iov[*first].iov_base = static_cast<char*>(iov[*first].iov_base) + done;
    iov[*first].iov_len -= done;
  }
}

template <class Call>
Status MoveV(int fd, iovec* iov, size_t n, Clock::time_point deadline, short event, Call call,
             const char* what) {
  size_t first = 0;
  while (first < n && iov[first].iov_len == 0) ++first;
  while (first < n) {
    int cnt = static_cast<int>(std::min<size_t>(n - first, IOV_MAX));
    ssize_t r = call(fd, iov + first, cnt);
    if (r > 0) {
      Advance(iov, n, &first, static_cast<size_t>(r));
      continue;
    }
    if (r == 0) return {StatusCode::kConnectionLost, "peer closed the connection"};
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!PollFor(fd, event, deadline)) return {StatusCode::kTimeout, std::string(what) + " timed out"};
      continue;
    }
    return {StatusCode::kConnectionLost, Errno(what)};
  }
  return Status::Ok();
}

}  // namespace

namespace {
// Bounds the blocking calls that follow on fd by the deadline (SO_RCVTIMEO / SO_SNDTIMEO).
bool SetTimeout(int fd, int opt, Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now());
  if (left.count() <= 0) return false;
  timeval tv{static_cast<time_t>(left.count() / 1000000), static_cast<suseconds_t>(left.count() % 1000000)};
  ::setsockopt(fd, SOL_SOCKET, opt, &tv, sizeof tv);
  return true;
}

// Moves all of iov on a blocking socket: recvmsg(MSG_WAITALL) or sendmsg, within the deadline.
// The deadline is for the whole move: a call cut short by the socket's timeout with part of
// the bytes moved is followed by one that may wait only for what is left of it (else a peer
// that trickles a byte per timeout would hold the move for ever).
Status MoveVBlocking(int fd, iovec* iov, size_t n, Clock::time_point deadline, bool send) {
  const int opt = send ? SO_SNDTIMEO : SO_RCVTIMEO;
  if (!SetTimeout(fd, opt, deadline))
    return {StatusCode::kTimeout, send ? "send timed out" : "receive timed out"};
  bool first = true;
  return MoveV(
      fd, iov, n, deadline, send ? POLLOUT : POLLIN,
      [&](int f, iovec* v, int c) -> ssize_t {
        if (!first && !SetTimeout(f, opt, deadline)) {
          errno = EAGAIN;  // (MoveV's poll then finds the deadline passed)
          return -1;
        }
        first = false;
        msghdr m{};
        m.msg_iov = v;
        m.msg_iovlen = static_cast<size_t>(c);
        return send ? ::sendmsg(f, &m, MSG_NOSIGNAL) : ::recvmsg(f, &m, MSG_WAITALL);
      },
      send ? "send" : "receive");
}

}  // namespace

Status RecvVWaitAll(int fd, iovec* iov, size_t n, Clock::time_point deadline) {
  return MoveVBlocking(fd, iov, n, deadline, false);
}

Status SendVWaitAll(int fd, iovec* iov, size_t n, Clock::time_point deadline) {
  return MoveVBlocking(fd, iov, n, deadline, true);
}

void SetBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK); }

std::string HostOf(const std::string& host_port) {
  if (!host_port.empty() && host_port[0] == '[') return host_port.substr(1, host_port.find(']') - 1);
  return host_port.substr(0, host_port.rfind(':'));
}

size_t FloodVictim(const std::vector<std::string>& from) {
  std::unordered_map<std::string, size_t> per_host;
  size_t most = 0;
  std::string flooder;
  for (const auto& f : from) {
    std::string host = HostOf(f);
    if (const size_t n = ++per_host[host]; n > most) {
      most = n;
      flooder = std::move(host);
    }
  }
  for (size_t i = 0; i < from.size(); ++i) {
    if (HostOf(from[i]) == flooder) return i;
  }
  return 0;
}

std::string AddressText(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  bool v6 = false;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = a->sin_port;
  } else {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    v6 = !IN6_IS_ADDR_V4MAPPED(&a->sin6_addr);
    if (v6) {
      ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    } else {
      ::inet_ntop(AF_INET, &a->sin6_addr.s6_addr[12], host, sizeof host);
    }
    port = a->sin6_port;
  }
  const std::string h(host);
  return (v6 ? "[" + h + "]" : h) + ":" + std::to_string(ntohs(port));
}

namespace {
// "ip:port" of one end of a socket, as getpeername or getsockname (`name`) gives it.
std::string EndOf(int fd, int (*name)(int, sockaddr*, socklen_t*)) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (name(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  return AddressText(ss);
}
}  // namespace

std::string PeerOf(int fd) { return EndOf(fd, ::getpeername); }
std::string LocalOf(int fd) { return EndOf(fd, ::getsockname); }

bool AcceptPause::Shortage(int err) {
  if (err != EMFILE && err != ENFILE && err != ENOBUFS && err != ENOMEM) return false;
  const auto now = Clock::now();
  if (now - logged_ > std::chrono::seconds(10)) {
    XLOG(WARN) << what_ << ": cannot accept connections (" << std::strerror(err)
               << "); pausing, and refusing them while it lasts";
    logged_ = now;
  }
  until_ = now + kPause;
  return true;
}

bool IsLoopback(const std::string& host) {
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return host == "localhost";
}

}  // namespace xfer::net
