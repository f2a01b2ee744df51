// The transport interface. A transport knows how to move bytes between this process and a
// peer; it knows nothing of requests, deadlines, names or options parsing.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "xfer/status.h"
#include "xfer/types.h"

namespace xfer::transport {

// One contiguous piece: local and remote addresses in the respective address spaces.
struct Slice {
  uint64_t local = 0;
  uint64_t remote = 0;
  uint64_t len = 0;
};

// What a transport may use to reach a peer, taken from the peer's hello.
struct PeerEndpoint {
  int32_t pid = 0;
  uint64_t incarnation = 0;
  uint64_t cma_cookie = 0;  // address in the peer of a u64 holding its incarnation
  std::string host;         // the peer's address as this engine reaches it (control connection)
  uint16_t tcp_port = 0;    // the peer's tcp data port; 0 = none
  std::string auth_key;     // the authenticated control session's key; "" without a secret
  int pidfd = -1;           // same host: the peer process, verified (a transport dups it)
  // The peer's tcp data addresses, one per NIC it serves on (its tcp.nics; "host:port" each):
  // empty when it names none (then host:tcp_port).
  std::vector<std::string> tcp_nics{};
};

using Clock = std::chrono::steady_clock;

// A connection to one peer. Execute moves one batch synchronously on the calling thread (a
// stream thread of the engine, or a caller helping its request); it may be called from several
// threads at once, and returns by the deadline.
//
// A pipelined link (ucx) also keeps many batches in flight from one thread: Start starts one
// and returns at once; its `done` is called once, with the result, inline or on a thread that
// drives the link (Drive or Start on it, or the transport's own thread when nobody drives for
// a while). `ready`, when set, is asked just before the batch goes out: an error ends it with
// that status, nothing moved. Drive progresses the link's batches on the calling thread until
// `finished()` (cheap; called often, under the link's lock or not) or `until`. Quiesce is a
// fence: when it returns, every batch in flight at its mark has either moved its bytes or not
// yet asked `ready`.
class Link {
 public:
  using Done = std::function<void(Status)>;
  virtual ~Link() = default;
  virtual Status Execute(Op op, std::span<const Slice> batch, Clock::time_point deadline) = 0;
  virtual bool pipelined() const { return false; }
  virtual void Start(Op op, std::span<const Slice> batch, Clock::time_point deadline, Done done,
                     std::function<Status()> ready = {}) {
    Status s = ready ? ready() : Status::Ok();
    done(s.ok() ? Execute(op, batch, deadline) : std::move(s));
  }
  virtual void Drive(Clock::time_point /*until*/, const std::function<bool()>& /*finished*/) {}
  // QuiesceMark() names the batches in flight now; Quiesce(mark, deadline) returns once each
  // of them has moved its bytes or not yet asked `ready` (a fence over several links takes
  // every link's mark first, then waits). Past `deadline`, those it still waits for are
  // interrupted: their connections close (what they posted is canceled) and they fail with
  // kConnectionLost; it returns once they did.
  virtual uint64_t QuiesceMark() { return 0; }
  virtual void Quiesce(uint64_t /*mark*/, Clock::time_point /*deadline*/) {}
  // The peer is gone or leaving: batches in progress end soon (a pipelined link lets what was
  // posted complete first, for a second, two at most), and later ones fail.
  virtual void Shutdown() {}
  // A link over several network paths (tcp over several NICs): the bytes each moved, by name.
  virtual std::vector<std::pair<std::string, uint64_t>> PathBytes() const { return {}; }
  // A fence has waited for this link's batches as long as it may. When a connection busy since
  // before `since` has finished no batch since, the peer stalls: the batches on every busy
  // connection of the link that finished none since end at once with kConnectionLost and are
  // not retried (a batch that starts later opens a fresh connection). Links whose batches
  // cannot stall on a peer (copies through memory) do nothing.
  virtual void Interrupt(Clock::time_point /*since*/) {}
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string_view name() const = 0;
  // The most slices one Execute() call may carry (the kernel's IOV_MAX for cma).
  virtual size_t max_slices_per_batch() const = 0;
  // Bytes per batch (and per slice) when the user sets none: measured per transport.
  virtual uint64_t default_batch_bytes() const { return 256 << 10; }
  // Whether a link reaches the peer's GPU memory (tcp: the target's threads stage it).
  virtual bool reaches_device_memory() const { return false; }
  // How many batches of one request on a link are worth running at once: more only add
  // threads that wait.
  virtual size_t useful_batches_in_flight() const { return SIZE_MAX; }
  // Opens a link to a peer, or says why this transport cannot reach it.
  virtual Status Connect(const PeerEndpoint& peer, std::shared_ptr<Link>* link) = 0;
  // For transports whose threads touch this engine's memory on a peer's behalf (tcp): waits
  // until work that started before the call has finished. Memory checks made after the call
  // see the registry as it is now. (Backend::Fence: the deadline.)
  virtual void Fence(Clock::time_point deadline) {}
};

}  // namespace xfer::transport
