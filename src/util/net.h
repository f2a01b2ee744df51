// Sockets and addresses: small helpers over the BSD socket API. Every blocking helper takes a
// deadline so nothing here can hang past it.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

struct iovec;

#include "xfer/status.h"

namespace xfer::net {

using Clock = std::chrono::steady_clock;

// An engine name: "host:port", "[v6]:port", or "host" alone (has_port false).
struct Address {
  std::string host;
  uint16_t port = 0;
  bool has_port = false;
  std::string ToString() const;  // canonical form, brackets around IPv6
};
Status ParseAddress(const std::string& name, Address* out);

// Owns a file descriptor; closes it on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { Reset(); }
  Fd(Fd&& o) noexcept : fd_(o.Release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = o.Release();
    }
    return *this;
  }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void Reset();

 private:
  int fd_ = -1;
};

// Binds and listens (non-blocking). *bound receives the address actually bound (port filled).
Status Listen(const Address& addr, Fd* fd, Address* bound);
// Where a connection leaves from: a local address to bind, and the interface it belongs to.
// The socket is bound to the interface too (SO_BINDTODEVICE) where the kernel allows it (any
// process from Linux 5.7; before it, root or CAP_NET_RAW): it then leaves through that NIC
// whatever the routing table prefers.
struct Source {
  std::string address;
  std::string device;
};
// Connects with a deadline; the returned socket is non-blocking with TCP_NODELAY. proceed,
// when given, is looked at every 50 ms while the connection is pending: false gives up
// (kCanceled), e.g. when the engine is finalized. from: where it leaves from (default: where
// the kernel's route says).
Status ConnectTcp(const Address& addr, Clock::time_point deadline, Fd* fd,
                  const std::atomic<bool>* proceed = nullptr, const Source* from = nullptr);
// Sends / receives exactly len bytes on a non-blocking socket, waiting with poll up to deadline.
// Receives first retry for up to `spin` before they sleep in poll: a sleep and wake-up costs
// tens of microseconds on a VM, more than a small message's whole round trip.
Status SendAll(int fd, const void* data, size_t len, Clock::time_point deadline);
Status RecvAll(int fd, void* data, size_t len, Clock::time_point deadline,
               std::chrono::microseconds spin = {});
// RecvAll for a message that may be long in coming (the next request on an idle connection):
// no deadline before its first byte; from then on, `rest` for the whole of it. *started: when
// the first byte came.
Status RecvOnceStarted(int fd, void* data, size_t len, std::chrono::milliseconds rest,
                       std::chrono::microseconds spin, Clock::time_point* started);
// RecvOnceStarted for a connection served by a pool (ServePool): spins for `spin`, then
// sleeps; when no byte came within `idle`, gives up with kTimeout and *started left at
// time_point{} (the connection is idle).
Status RecvIfStarting(int fd, void* data, size_t len, std::chrono::milliseconds rest,
                      std::chrono::microseconds spin, std::chrono::milliseconds idle,
                      Clock::time_point* started);
// Vectored bulk transfers on a blocking socket, bounded by the deadline (SO_RCVTIMEO /
// SO_SNDTIMEO): every byte the iovecs describe moves (any count; the array is modified), and
// the kernel fills a receive before it wakes the thread (MSG_WAITALL) instead of one wake-up
// per segment. The helpers above pass MSG_DONTWAIT, so they work on either kind of socket.
Status RecvVWaitAll(int fd, struct iovec* iov, size_t n, Clock::time_point deadline);
Status SendVWaitAll(int fd, struct iovec* iov, size_t n, Clock::time_point deadline);
void SetBlocking(int fd);
// The host part of "host:port" / "[v6]:port" (as in Session::remote_addr()).
std::string HostOf(const std::string& host_port);
// "ip:port" / "[v6]:port" of a socket address; the peer of a connected socket ("?" on error).
// An IPv4 address mapped into IPv6 (a dual-stack listener's) is written as IPv4.
std::string AddressText(const sockaddr_storage& ss);
std::string PeerOf(int fd);
std::string LocalOf(int fd);  // this end of a socket ("?" on error)
// Which of too many pending connections a listener closes for a new one: the oldest of those
// from the host that holds the most of them, so that one host's flood does not shut out a
// newcomer from another (a flood from the newcomer's own host still can). from: each pending
// connection's "host:port", oldest first; returns its index (0 when empty).
size_t FloodVictim(const std::vector<std::string>& from);
// An accept loop's answer to a shortage (EMFILE, ENFILE, ENOBUFS, ENOMEM): the listener stays
// readable, so accepting again at once would spin; it pauses instead, with one log line per
// stretch of shortage (what: the listener, for the log).
class AcceptPause {
 public:
  explicit AcceptPause(std::string what) : what_(std::move(what)) {}
  // After accept4 failed with err: true when that is a shortage (the caller stops accepting
  // until Over()).
  bool Shortage(int err);
  bool Over() const { return Clock::now() >= until_; }

 private:
  static constexpr std::chrono::milliseconds kPause{100};
  std::string what_;
  Clock::time_point until_{};
  Clock::time_point logged_{};
};

// True for a numeric loopback address (127.0.0.0/8, ::1) or "localhost".
bool IsLoopback(const std::string& host);
void SetNoDelay(int fd);

}  // namespace xfer::net
