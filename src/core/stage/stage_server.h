// StageServer: the target's side of staging over a one-sided route (docs/gpu.md, "Staging at
// the target"). A peer whose route cannot reach some of our memory itself (GPU memory that our
// UCX does not register; with staging = always, any memory) asks for slots of our own
// (wire::StageOpen): host memory, page-locked where a GPU is usable, that its route does reach.
// It then fills a slot and asks us to copy it into our memory, or asks us to fill a slot from
// our memory and reads it (wire::StageMove). One thread of its own (never the control thread)
// makes the copies, each range checked against the regions that peer may touch, under a lock
// that a deregistration's fence takes between two moves.
//
// Each session gets one pool (EngineOptions::staging_buffers slots of staging_buffer_bytes),
// staging_pools in all; a pool whose session ended goes to the next session that asks, never
// back to the system until Finalize, so that a peer still holding its key never reaches freed
// memory.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "control/session.h"
#include "core/local_engine.h"
#include "core/regions/region_service.h"
#include "transport/common/staging.h"

namespace xfer {

class StageServer {
 public:
  using Clock = std::chrono::steady_clock;
  // Every backend's blobs for a pool being offered, and what holds them until Finalize.
  using Prepare = std::function<Status(const RegionInfo& info, std::unique_ptr<RegionResources>* res,
                                       transport::Blobs* blobs)>;
  StageServer(const LocalEngine& self, RegionService& regions) : self_(self), regions_(regions) {}
  ~StageServer() { Stop(); }

  void Start(Prepare prepare);  // the thread
  // Finalize, once no peer uses our memory: moves queued are dropped, the pools freed.
  void Stop();

  // Control thread: a peer's asks. Open is answered at once; a move once its copy is made, or
  // at once when refused.
  void OnOpen(const std::shared_ptr<control::Session>& s, const wire::StageOpen& m);
  void OnMove(const std::shared_ptr<control::Session>& s, wire::StageMove&& m);
  // The session ended: its moves are dropped, its pool goes back once no copy uses it.
  void SessionClosed(const control::Session* s);
  // Returns once no copy that began before the call touches this engine's memory (a
  // deregistration: the region is gone from the registry already).
  void Fence(Clock::time_point deadline);
  // Pools made, and those lent to a session now.
  size_t pools() const;
  size_t pools_lent() const;

 private:
  struct Pool {
    std::unique_ptr<transport::StagingBuffer> memory;
    std::unique_ptr<RegionResources> resources;
    wire::WireRegion region;
    const control::Session* owner = nullptr;  // mu_
    // mu_: per slot, whether a move of it is queued or being copied (one at most).
    std::vector<bool> slot_moving;
    bool Moving() const {
      return std::find(slot_moving.begin(), slot_moving.end(), true) != slot_moving.end();
    }
  };
  struct Move {
    std::shared_ptr<control::Session> session;
    Pool* pool;
    wire::StageMove ask;
  };
  Pool* PoolOf(const control::Session* s) const;  // mu_
  // The pool lent to s: its own, a free one, or a new one; null with *why when none.
  Pool* Lend(const control::Session* s, Status* why);  // mu_
  void Serve();                                        // the thread
  Status Copy(const Move& m);                          // under copying_
  uint64_t slot_bytes() const { return self_.options.staging_buffer_bytes; }
  uint32_t slots() const { return static_cast<uint32_t>(self_.options.staging_buffers); }
  size_t max_pools() const { return static_cast<size_t>(self_.options.staging_pools); }

  const LocalEngine& self_;
  RegionService& regions_;
  Prepare prepare_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Pool>> pools_;  // mu_
  std::deque<Move> moves_;                    // mu_
  bool stop_ = false;                         // mu_
  std::thread thread_;
  std::mutex copying_;  // held while a move copies (Fence takes it)
};

}  // namespace xfer
