// InlineCopies: one small descriptor into a same-host peer's mapped memory (AllocMem memory
// over shm, or this process's memory over local) moved with a memcpy on the caller's thread,
// without planning a request: the copy costs less than any hand-off. Anything unusual takes
// the planned path, which explains refusals.
//
// Each inline execution slot (StreamPool::Slot) remembers what the copy through it found of
// the peer and region it copied to last (InlineTarget), read and written only under that slot,
// so that the next copy through the slot to the same peer and region looks them up in no table
// and counts no reference (after a copy of a few KiB, each of those is a cache miss or a locked
// instruction that waits for the copy's stores); it reads the peer table's version. A target
// holds its peer's state and region alive. Forget lets go of it when the peer is dropped or the
// region revoked: at once where the slot is free, else at the slot's next inline copy or the
// control thread's next tick (OnTick). A copy still checks, under the slot, that both are
// current: a fence orders it with their end.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "core/datapath/stream_pool.h"
#include "core/peers/peer_service.h"
#include "core/peers/peer_state.h"
#include "core/regions/registry.h"
#include "util/range.h"

namespace xfer {

struct InlineTarget {
  std::string remote;          // the peer's name as the caller gave it
  uint64_t peers_version = 0;  // PeerTable::version() when the peer was looked up
  std::shared_ptr<PeerState> state;
  std::shared_ptr<RemoteRegion> region;
  transport::Route* route = nullptr;  // the route that copies inline (one of state's)
  uint64_t mapped = 0;                // where region's first byte is mapped in this process

  // Whether this target stands for [addr, addr + len) of that peer, for that access.
  bool Serves(const std::string& name, uint64_t version, uint64_t addr, uint64_t len, bool write) const {
    return state && version == peers_version && RangeInside(addr, len, region->info.addr, region->info.len) &&
           (!write || region->info.access == PeerAccess::kReadWrite) && name == remote;
  }
};

class InlineCopies {
 public:
  using Clock = std::chrono::steady_clock;

  InlineCopies(StreamPool& pool, PeerService& peers, const Registry& registry,
               const std::atomic<bool>& running)
      : pool_(pool), peers_(peers), registry_(registry), running_(running) {}

  // Moves d into or out of a peer's mapped memory on this thread, when its route copies
  // inline (Route::CopiesInline) and every check passes at once; false leaves it to the
  // planned path, which explains refusals.
  // TryRemembered: through the target this thread's slot remembers, with no lookup at all.
  // *eligible: whether d may go inline at all (a READ or WRITE of this process's host memory,
  // with time left), for TryCopy.
  bool TryRemembered(const std::string& remote, Op op, const TransferDesc& d,
                     std::chrono::milliseconds timeout, bool* eligible);
  // TryCopy: an eligible d, with the peer looked up (by_name: as a cluster name, which is not
  // remembered); version: the peer table's, read before that lookup.
  bool TryCopy(const std::string& remote, uint64_t version, const PeerTable::Peer& peer, bool by_name, Op op,
               const TransferDesc& d);
  // An inline copy, once the remote range is known to lie in region (and the local one in host
  // memory this process may read, or for READ write). With remember (its route and mapping are
  // filled in here), the copy's slot remembers that target.
  bool Copy(const PeerState& peer, Op op, RemoteRegion& region, uint64_t local, uint64_t remote, uint64_t len,
            InlineTarget* remember = nullptr);

  // Lets go of the targets of that peer (and region, when not null), and of those marked
  // earlier; a slot busy now is not waited for (the control thread calls this) but marked.
  void Forget(const PeerState* peer, const RemoteRegion* region = nullptr);
  // Every target, waiting until the deadline for busy slots (Finalize).
  void ForgetAll(Clock::time_point deadline);
  // The targets marked while their slot was busy (the control thread's tick).
  void OnTick();

 private:
  // The route that copies len bytes to region inline, as the planner would choose it, with
  // where the region is mapped here; null when there is none (or a WRITE into read-only memory).
  transport::Route* RouteFor(const PeerState& peer, Op op, RemoteRegion& region, uint64_t len,
                             uint64_t* mapped);
  // The copy itself, by the caller that holds the execution slot: false (nothing copied) when
  // the route does not copy len bytes inline, or the peer or region ended.
  bool CopyInSlot(const PeerState& state, transport::Route& route, RemoteRegion& region, uint64_t mapped,
                  Op op, uint64_t local, uint64_t remote, uint64_t len);

  StreamPool& pool_;
  PeerService& peers_;
  const Registry& registry_;
  const std::atomic<bool>& running_;
  InlineTarget targets_[StreamPool::kInlineSlots];  // each under its inline slot of pool_
  // Marked by Forget when it found the slot busy: its target no longer serves.
  std::atomic<bool> forgotten_[StreamPool::kInlineSlots] = {};
};

// (In the header: the hot path of small copies, inlined into its callers.)
inline bool InlineCopies::TryRemembered(const std::string& remote, Op op, const TransferDesc& d,
                                        std::chrono::milliseconds timeout, bool* eligible) {
  // Anything unusual takes the planned path, which explains refusals.
  *eligible = (op == Op::kRead || op == Op::kWrite) && timeout.count() > 0 && d.len != 0 &&
              d.local_addr != 0 && d.remote_addr != 0 && d.local_addr + d.len >= d.local_addr &&
              d.remote_addr + d.len >= d.remote_addr && running_.load(std::memory_order_relaxed) &&
              registry_.TypeOf(d.local_addr, d.len) == MemType::kHost;
  if (!*eligible) return false;
  const uint64_t version = peers_.version();
  // (Not waited for: a busy slot may hold a batch to a peer that copies nothing inline; the
  // lookup finds out, and Copy then waits where it copies.)
  InlineTarget forgotten;  // (released after the slot)
  int k;
  auto slot = pool_.TryInlineSlot(&k);
  if (!slot.owns_lock()) return false;
  if (forgotten_[k].load(std::memory_order_relaxed)) {
    forgotten = std::exchange(targets_[k], {});
    forgotten_[k].store(false, std::memory_order_relaxed);
  }
  const InlineTarget& t = targets_[k];
  return t.Serves(remote, version, d.remote_addr, d.len, op == Op::kWrite) &&
         CopyInSlot(*t.state, *t.route, *t.region, t.mapped, op, d.local_addr, d.remote_addr, d.len);
}

}  // namespace xfer
