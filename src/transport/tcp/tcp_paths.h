// The ways from this engine to a tcp peer over several NICs (TcpOptions::nics, the peer's
// advertised addresses), and what each one is worth now: a path that lost a connection is
// avoided for a while (doubling, from 100 ms to 5 s), then tried again.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "transport/link.h"
#include "transport/tcp/nics.h"
#include "util/net.h"

namespace xfer::transport {

struct Path {
  net::Source from;  // empty address: the kernel's choice
  net::Address to;
  std::string Name() const;  // "eth1 (10.0.0.1) -> 10.0.0.2:4100", or "-> host:port"

  // --- health (any thread)
  // A batch lost its connection on the path. Unless the path is avoided already (other batches
  // on it fail at the same time), it is now, for its back-off, which then doubles: returns that
  // time (the caller logs it), or 0 when it was avoided already.
  std::chrono::milliseconds Lost();
  // A batch moved on it: true when it had been lost (it is back: the caller logs it).
  bool Worked(uint64_t bytes);
  bool Avoided(Clock::time_point now) const { return now.time_since_epoch().count() < avoid_until_.load(); }
  std::chrono::milliseconds backoff() const;  // what its next loss brings
  uint64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> avoid_until_{0};  // steady_clock ticks
  std::atomic<uint32_t> losses_{0};      // in a row
  std::atomic<uint64_t> bytes_{0};
};

// A peer as tcp reaches it, from its hello.
struct TcpPeer {
  uint64_t incarnation = 0;
  std::string host;      // the peer's address as this engine reaches it (control connection)
  uint16_t port = 0;     // its tcp data port; 0 = none
  std::string auth_key;  // the authenticated control session's key; "" without a secret
  // Its data addresses, one per NIC it serves on (its tcp.nics; "host:port" each): empty when
  // it names none (then host:port).
  std::vector<std::string> nics{};
};

// The paths to a peer. Without NICs of ours: one, to its host and port, from where the
// kernel routes. With them: each pair of our NIC and a data address it gave (its host and
// port when it gave none) in that NIC's subnet; when no pair shares a subnet (routed
// networks), our NICs and its addresses paired in order.
std::vector<std::unique_ptr<Path>> PathsTo(const TcpPeer& peer, const std::vector<net::Nic>& nics);

}  // namespace xfer::transport
