// StageChannel: the initiator's side of staging at the target (stage_server.h), for one peer:
// the peer's slots (asked for on first use, wire::StageOpen) and the moves asked of it
// (wire::StageMove), each answered over the control session. The one-sided route finds the
// slots' region here (SlotsRegion) where the peer's table has none: it writes and reads them as
// any region of the peer's, and the application never sees them.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "control/session.h"
#include "control/wire.h"
#include "core/awaiting_control.h"
#include "transport/remote_region.h"
#include "xfer/status.h"

namespace xfer {

class StageChannel {
 public:
  using Clock = std::chrono::steady_clock;
  StageChannel() = default;

  // The session is up (before it, and after Close, asks fail with kConnectionLost).
  void Attach(const std::shared_ptr<control::Session>& s);
  // The session ended, or the peer is dropped: waiting asks fail with kConnectionLost, and so
  // does a move answered but not yet returned (nothing more goes through the slots).
  void Close();
  // A fence gave up on the batches that the peer stalls (Link::Interrupt): when the peer has
  // answered nothing since `since`, the asks waiting here since before it fail with
  // kConnectionLost now, a move's slot coming back with its answer; later asks go on as
  // before, and a peer that answers is not stalling. control_thread: the fence runs on the
  // control thread, which reads no answers meanwhile: every ask waiting now fails. (It passes
  // such batches by, but not those that wait for what these hold, this engine's own staging
  // buffers say.)
  void Interrupt(Clock::time_point since, bool control_thread);
  // Control thread: the peer's answers; false when nothing asked for it (a protocol error).
  bool OnOpened(wire::StageOpened&& m);
  bool OnMoved(const wire::StageMoved& m);
  // The slots' region, when it holds [addr, addr+len); else null.
  std::shared_ptr<transport::RemoteRegion> SlotsRegion(uint64_t addr, uint64_t len);

  struct Slot {
    uint32_t index = 0;
    uint64_t addr = 0;  // in the peer's memory
    uint64_t bytes = 0;
  };
  // A free slot of the peer's (its slots asked for first, once), waiting for one up to the
  // deadline. The caller then Moves it, or gives it back with Release.
  Status Acquire(Clock::time_point deadline, Slot* out);
  void Release(const Slot& slot);
  // Asks the peer to copy between the slot and ranges of its memory (write: out of the slot)
  // and waits for its answer up to the deadline. Ok: the slot stays the caller's (to Release
  // once it read what the peer copied in). Otherwise it goes back by itself: at once, or, past
  // the deadline, once the peer answered (the peer may still copy it); a session that ends
  // takes every slot with it.
  Status Move(const Slot& slot, bool write, std::vector<wire::DigestRange> ranges,
              Clock::time_point deadline);

 private:
  struct Asked {
    uint32_t slot = 0;
    bool answered = false;
    bool abandoned = false;  // its caller left (deadline): the answer frees the slot alone
    Status status;
  };
  Status Open(std::unique_lock<std::mutex>& lock, Clock::time_point deadline);  // mu_ held
  // mu_ held: waits for done() (a peer's answer, which only the control thread reads, so the
  // wait is marked AwaitingControl), up to the deadline or until it gives up (GivesUp, for a
  // wait that began at `began`, when interrupts_ was `epoch`: by default, now).
  enum class Waited { kDone, kGaveUp, kTimedOut };
  template <class Done>
  Waited Await(std::unique_lock<std::mutex>& lock, Clock::time_point deadline, Done done) {
    return Await(lock, deadline, Clock::now(), interrupts_, done);
  }
  template <class Done>
  Waited Await(std::unique_lock<std::mutex>& lock, Clock::time_point deadline, Clock::time_point began,
               uint64_t epoch, Done done) {
    const AwaitingControl awaiting;
    cv_.wait_until(lock, deadline, [&] { return done() || GivesUp(began, epoch); });
    return done() ? Waited::kDone : GivesUp(began, epoch) ? Waited::kGaveUp : Waited::kTimedOut;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<control::Session> session_;  // mu_: null before Attach and after Close
  bool closed_ = false;                        // mu_
  enum class Pool { kNone, kAsked, kOpen } pool_ = Pool::kNone;
  uint64_t open_id_ = 0;  // the StageOpen waited for
  Status open_failed_;    // its answer, when it refused
  wire::StageOpened slots_;
  std::shared_ptr<transport::RemoteRegion> region_;  // once open
  std::vector<uint32_t> free_;
  std::map<uint64_t, Asked> moves_;
  uint64_t next_id_ = 1;
  // mu_: the last Interrupt's `since`, and when the peer last answered an ask.
  Clock::time_point interrupt_since_ = Clock::time_point::min();
  Clock::time_point last_answer_ = Clock::time_point::min();
  uint64_t interrupts_ = 0;  // mu_: control-thread Interrupts: every wait under way gives up
  // mu_: whether a wait that began at `began`, when interrupts_ was `epoch`, gives up: a
  // control thread's Interrupt came, or the peer answered nothing since an Interrupt's
  // `since`, which came after the wait began.
  bool GivesUp(Clock::time_point began, uint64_t epoch) const {
    return interrupts_ != epoch || (began < interrupt_since_ && last_answer_ < interrupt_since_);
  }
};

}  // namespace xfer
