// Transport "tcp": any host. Data connections are separate from the control connection.
// The initiator sends a batch as one frame (descriptors, then for WRITE the payload straight
// from the source memory); the target's service threads check every range against the
// target's own registered regions, then receive straight into or send straight from them.
//
// Data connection, after TCP connect. Every frame is padded to a multiple of 64 bytes, and a
// payload starts at a frame offset congruent to its source address mod 64 (see kAlign).
//   initiator -> target  hello: magic "XFD1" u32 | version u16 | 0 u16 | target incarnation u64
//                                | initiator incarnation u64 | zeros to 64 bytes
//   with a secret:       target -> initiator  nonce (32 bytes)
//                        initiator -> target  HMAC of the nonce and both incarnations under
//                                             the control session's key (32 bytes)
//   target -> initiator  u32 status code (0: accepted) | zeros to 64 bytes
// Then any number of batches:
//   initiator -> target  op u8 | lead u8 | flags u8 | 0 u8 | count u32 | total bytes u64
//                        | count x {addr u64, len u64} | lead zeros
//                        | WRITE: payload | [checksum u64] | padding
//   target -> initiator  code u32 | message length u16 | lead u16 | message | lead zeros
//                        | READ and code 0: payload [| checksum u64] | padding
// flags bit 0 (checksummed; TcpOptions::checksum): XXH3-64 checksums, each over the request's
// header and descriptors as sent, then the payload that follows: a WRITE's (header,
// descriptors, payload), a READ request's (header, descriptors), a READ reply's (the request's
// header and descriptors, the payload). The receiver compares; a mismatch fails the batch
// with kDataCorrupted (a WRITE's bytes have landed all the same) and leaves the connection
// usable.
// A refused batch (a range outside the target's regions) moves no byte and leaves the
// connection usable; a malformed frame closes it.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "transport/backend.h"
#include "transport/common/buffer_pool.h"
#include "transport/link.h"
#include "transport/tcp/nics.h"
#include "transport/tcp/serve_pool.h"
#include "transport/tcp/tcp_paths.h"
#include "util/log.h"
#include "util/net.h"

namespace xfer::transport {

struct TcpOptions {
  int links = 2;              // data connections per peer
  bool least_loaded = false;  // pick a free connection first (default: round-robin)
  // Each step of a batch must end within this, on both sides: the handshake, a frame's
  // sending or receiving, a reply once its turn came. A peer that stalls a step loses the
  // data connection (its control session, and with it the heartbeat, may live on).
  std::chrono::milliseconds io_timeout{3000};
  std::chrono::microseconds spin{50};  // receivers spin this long before they sleep
  bool checksum = false;               // this initiator's batches carry a checksum of their payload
  // The NICs to serve on and to connect from (EngineOptions::tcp.nics, resolved); empty: the
  // listen address alone, and whatever source the kernel picks.
  std::vector<net::Nic> nics{};
};

using TcpTargetAccess = TargetAccess;  // how the target may touch a range a batch names

// What the tcp target needs from the engine.
struct TcpTargetHooks {
  uint64_t incarnation = 0;
  std::function<TcpTargetAccess(uint64_t addr, uint64_t len, bool write)> region_access;
  // Staged ranges pass through buffers of this many bytes (at most two pieces, kStagePiece,
  // are used), lent to one frame at a time (TcpTransport::kStagingBuffers); 0: they are refused.
  uint64_t staging_bytes = 0;
  // True when an engine of that incarnation has a control session with us.
  std::function<bool(uint64_t incarnation)> is_peer;
  // With a secret (EngineContext::authenticate): each data connection answers a challenge with
  // the key of one of its peer's sessions (peer_auth_keys: the session it was opened for), or
  // is refused.
  bool authenticate = false;
  std::function<std::vector<std::string>(uint64_t incarnation)> peer_auth_keys;
};

// tcp's engine-wide side: the data listeners and the threads that serve peers' batches (the
// target), and the links to peers (the initiator).
class TcpTransport final {
 public:
  TcpTransport(TcpOptions opts, TcpTargetHooks hooks);
  ~TcpTransport();  // Stop()

  // Listens for data connections on host (port chosen by the OS), and on each of opts.nics.
  Status Start(const std::string& host);
  void Stop();
  uint16_t port() const { return port_; }
  // Where peers reach us on each of opts.nics (address and port), in their order.
  const std::vector<net::Address>& nic_addresses() const { return nic_addresses_; }
  // Closes the data connections a peer opened to us (it is gone).
  void DropPeer(uint64_t incarnation);

  // How requests are cut for tcp (the user's slice_bytes and batch_bytes over 512 KiB, at
  // most kMaxBatchBytes: a target refuses a larger frame). A connection moves one batch at a
  // time; a second keeps it busy across the round trip that ends each; a third only adds a
  // thread that waits (bench/RESULTS.md, "How the defaults were chosen").
  PlanLimits Limits(const EngineOptions& o) const {
    PlanLimits l = WithOverrides({512 << 10, 512 << 10, kMaxSlices}, o);
    l.slice_bytes = std::min(l.slice_bytes, kMaxBatchBytes);
    l.batch_bytes = std::min(l.batch_bytes, kMaxBatchBytes);
    l.batches_in_flight = 2 * static_cast<size_t>(std::max(opts_.links, 1));
    return l;
  }
  // A link to the peer; its data connections open on first use.
  Status Connect(const TcpPeer& peer, std::shared_ptr<Link>* link);
  // Waits for the peers' batches that touch this engine's memory now; one still busy at the
  // deadline has its connection closed (and is waited for: its I/O fails at once).
  void Fence(Clock::time_point deadline);

  static constexpr uint32_t kMaxSlices = 1024;
  static constexpr uint64_t kMaxBatchBytes = 1ull << 30;
  // Data connections that have not finished their handshake (each waits at most io_timeout,
  // and holds no thread: for each one more, the oldest is closed), and those one peer engine
  // may hold (it opens tcp.links, at most 64, and replaces broken ones: more are refused).
  // A log line a second at most.
  static constexpr size_t kMaxPendingHandshakes = 64;
  static constexpr size_t kMaxConnectionsPerPeer = 256;
  // Threads that serve data connections: a connection keeps the thread that serves it while
  // batches come at least every kServeGrace (so a busy connection is served as by a thread of
  // its own: handing a busy connection from thread to thread costs bandwidth, bench/RESULTS.md);
  // idle longer, it waits in the pool's epoll set and holds none. At most kMaxServeThreads;
  // past it, connections with a batch wait for one to come free, and each connection gives
  // its thread up after every batch (busy ones cannot starve the others).
  static constexpr std::chrono::milliseconds kServeGrace{50};
  static constexpr size_t kMaxServeThreads = 1024;
  // The target's staging buffers (staged frames: GPU memory, or staging = always), allocated
  // on first use and lent to one frame at a time: at most kStagingBuffers in all, and
  // kStagingBuffersPerPeer to one peer engine's frames at once; a frame waits for one within
  // its io_timeout. The pool is the target's own, apart from the engine's outgoing one, so that
  // two engines staging to each other never wait for each other's buffers.
  static constexpr int kStagingBuffers = 64;
  static constexpr int kStagingBuffersPerPeer = 16;
  // Staging buffers allocated now (lent or free), and lent to frames now.
  int staging_buffers() { return target_staging_.allocated(); }
  int staging_buffers_lent() { return target_staging_.in_use(); }
  size_t serve_threads() const { return serving_.threads(); }  // now

 private:
  struct Service;
  struct Handshaking;
  struct Frame;
  // Accepts new data connections and moves their handshakes on (no thread of their own until
  // the peer has proved itself); a connection whose handshake passes joins serving_.
  void AcceptLoop();
  void Accept(int listener, std::list<Handshaking>* handshaking);
  bool Advance(Handshaking& h);  // false: the handshake is over (admitted, refused or failed)
  void Admit(Handshaking& h, StatusCode verdict);  // sends the verdict; kOk: starts serving
  // Whether h's engine still holds the control session it named (with a secret: the one whose
  // key it proved).
  bool StillPeer(const Handshaking& h) const;
  void ReapServices();  // forgets the connections that ended
  // A data connection with a batch (on a thread of serving_): batch after batch, while they
  // come within the spin; kIdle when none came, kDone when the connection ended or had to
  // close (logged, unless we closed it).
  net::ServePool::Next Serve(Service& svc);
  size_t ConnectionsOf(uint64_t incarnation);  // admitted and serving
  void LogRefusal(const std::string& line);    // at most once a second
  std::mutex refusal_log_mu_;
  log::Limit refusal_log_;  // (refusal_log_mu_)
  // The next frame's header and descriptors; false with *why empty and *idle when none came
  // within the spin.
  bool ReadFrame(Service& svc, uint64_t replied, Frame* f, std::string* why, bool* idle);
  // Checks every range of the frame against this engine's regions (f->denied says why not).
  void CheckRanges(Frame* f) const;
  bool ServeFrame(Service& svc, Frame* f, uint64_t* replied, std::string* why);
  // A staged frame's buffer, into *stage (none for a frame not staged or refused). None free:
  // waited for with `exec` unlocked, the frame checked again under it. False when the
  // connection must close (*why).
  bool LendStagingBuffer(Service& svc, Frame* f, std::unique_lock<std::timed_mutex>& exec,
                         BufferPool::Lease* stage, std::string* why);
  // A checked batch that names staged ranges, moved piece by piece through a staging buffer
  // (target_staging_'s, lent to the frame); *intact: a checksummed WRITE's payload matched its
  // checksum. False when the connection must close (*why says why).
  bool ServeStaged(Service& svc, const Frame& f, uint8_t* buffer, bool* intact, std::string* why);

  const TcpOptions opts_;
  const TcpTargetHooks hooks_;
  std::vector<net::Fd> listeners_;  // host's, then one per NIC (set before the acceptor starts)
  std::vector<net::Address> nic_addresses_;
  net::AcceptPause accept_pause_{"tcp data listener"};  // (AcceptLoop only)
  uint16_t port_ = 0;
  std::thread acceptor_;
  std::atomic<bool> stop_{false};
  std::mutex services_mu_;
  std::condition_variable services_ended_;        // a service is done (services_mu_)
  std::list<std::shared_ptr<Service>> services_;  // one per accepted data connection
  BufferPool target_staging_;
  net::ServePool serving_{[this](void* svc) { return Serve(*static_cast<Service*>(svc)); }, kMaxServeThreads,
                          std::chrono::seconds(1)};
};

}  // namespace xfer::transport
