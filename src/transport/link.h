// A link: how a backend moves batches of slices between this process and one peer (its Route
// holds it: backend.h). It knows nothing of requests, names or options parsing.
#pragma once

#include <algorithm>
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

using Clock = std::chrono::steady_clock;

// A batch's slices taken apart in order, a few bytes at a time: Next(n) gives the next n bytes
// (fewer at the end) as slices, cut where they fall.
class SliceCutter {
 public:
  explicit SliceCutter(std::span<const Slice> slices) : slices_(slices) {}
  // Returns how many bytes *out holds.
  uint64_t Next(uint64_t n, std::vector<Slice>* out) {
    out->clear();
    uint64_t got = 0;
    while (got < n && at_ < slices_.size()) {
      const Slice& c = slices_[at_];
      const uint64_t m = std::min(c.len - into_, n - got);
      out->push_back({c.local + into_, c.remote + into_, m});
      got += m;
      into_ += m;
      if (into_ == c.len) {
        ++at_;
        into_ = 0;
      }
    }
    return got;
  }

 private:
  std::span<const Slice> slices_;
  size_t at_ = 0;  // the next byte: slices_[at_], into_ bytes in
  uint64_t into_ = 0;
};

// A batch whose local side a staging buffer fills (WRITE) or empties (READ) piece by piece
// while it moves (BufferPool::Run): the link calls Ready(upto) before a WRITE's payload bytes
// [0, upto) go out, and Landed(upto) once a READ's bytes [0, upto) are in, on the calling
// thread, upto rising. A batch that goes again (on another path, after a checksum mismatch,
// or after another batch broke its connection) calls them again from the start: bytes already
// told are told again. `piece` is how many bytes the link should move between calls.
class PieceHook {
 public:
  virtual ~PieceHook() = default;
  virtual Status Ready(uint64_t upto) = 0;
  virtual Status Landed(uint64_t upto) = 0;
  virtual uint64_t piece() const = 0;
};

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
  // Execute, telling `hook` about the batch's payload as it moves, piece by piece: by
  // default an Execute per piece (a link whose Execute costs a round trip does better), a
  // pipelined link's pieces all in flight at once (each WRITE piece started once Ready).
  virtual Status ExecutePieces(Op op, std::span<const Slice> batch, Clock::time_point deadline,
                               PieceHook& hook);
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
  // cannot stall on a peer (copies through memory) do nothing. control_thread: the fence runs
  // on the control thread, which reads no peer's answers meanwhile, so a batch that waits for
  // one is no sign of a stall.
  virtual void Interrupt(Clock::time_point /*since*/, bool /*control_thread*/) {}
};

}  // namespace xfer::transport
