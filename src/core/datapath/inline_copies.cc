#include "core/datapath/inline_copies.h"

#include "core/datapath/planner.h"

namespace xfer {

bool InlineCopies::TryCopy(const std::string& remote, uint64_t version, const PeerTable::Peer& peer,
                           bool by_name, Op op, const TransferDesc& d) {
  if (!peer.state->copies_inline || peer.state->routes.stage_all) return false;
  std::shared_ptr<RemoteRegion> region =
      peer.state->regions.FindRemembered(d.remote_addr, d.len, op == Op::kWrite);
  if (!region) return false;
  RemoteRegion& r = *region;
  const PeerState& state = *peer.state;
  if (by_name) return Copy(state, op, r, d.local_addr, d.remote_addr, d.len);
  InlineTarget target{remote, version, peer.state, std::move(region)};
  return Copy(state, op, r, d.local_addr, d.remote_addr, d.len, &target);
}

transport::Route* InlineCopies::RouteFor(const PeerState& peer, Op op, RemoteRegion& region, uint64_t len,
                                         uint64_t* mapped) {
  if (op == Op::kWrite && region.info.access == PeerAccess::kReadOnly) {
    return nullptr;  // (the planned path refuses it, and says why)
  }
  uint8_t* base = nullptr;
  const int i = FirstRouteReaching(peer.routes, MemType::kHost, region, &base);  // (the planner's rule)
  if (i < 0 || base == nullptr) return nullptr;
  transport::Route* route = peer.routes.routes[i].get();
  *mapped = reinterpret_cast<uint64_t>(base);
  return route->CopiesInline(len) ? route : nullptr;
}

bool InlineCopies::Copy(const PeerState& peer, Op op, RemoteRegion& region, uint64_t local, uint64_t remote,
                        uint64_t len, InlineTarget* remember) {
  uint64_t mapped = 0;
  transport::Route* route = RouteFor(peer, op, region, len, &mapped);
  if (route == nullptr) return false;
  int k;
  auto slot = pool_.Slot(&k);
  if (!CopyInSlot(peer, *route, region, mapped, op, local, remote, len)) return false;
  if (remember != nullptr && k >= 0) {
    remember->route = route;
    remember->mapped = mapped;
    std::swap(targets_[k], *remember);  // (the slot's old target leaves with *remember, after the slot)
  }
  return true;
}

bool InlineCopies::CopyInSlot(const PeerState& state, transport::Route& route, RemoteRegion& region,
                              uint64_t mapped, Op op, uint64_t local, uint64_t remote, uint64_t len) {
  // The same order of checks as a planned batch, under the execution slot (the fence of a
  // deregistration waits for it).
  if (!route.CopiesInline(len) || !state.alive.load(std::memory_order_acquire) ||
      region.revoked.load(std::memory_order_acquire)) {
    return false;  // the planned path says why
  }
  const uint64_t at = mapped + (remote - region.info.addr);
  const uint64_t dst = op == Op::kWrite ? at : local;
  const uint64_t src = op == Op::kWrite ? local : at;
  // (Counted before the copy, which cannot fail: a locked add right after it would wait for
  // its stores.)
  route.bytes().fetch_add(len, std::memory_order_relaxed);
  EngineMetrics* m = state.metrics.get();
  const EngineMetrics::Inline counted =
      m ? m->BeginInline(state.metrics_slot, op, route.backend_index()) : EngineMetrics::Inline{};
  pool_.SharedCopy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), len);
  if (m) m->EndInline(counted, op, route.backend_index(), len);
  return true;
}

namespace {
// Lets go of the targets that forget(target) picks, each under its slot, and of those marked
// before; a slot still busy at the deadline is marked instead. (Each target is released after
// its slot: its peer's state may end with it.) marked_only: visits the marked slots alone.
template <typename Pick>
void ForgetTargets(StreamPool& pool, InlineTarget* targets, std::atomic<bool>* marked,
                   std::chrono::steady_clock::time_point deadline, bool marked_only, Pick forget) {
  for (int k = 0; k < StreamPool::kInlineSlots; ++k) {
    if (marked_only && !marked[k].load(std::memory_order_relaxed)) continue;
    InlineTarget forgotten;
    std::unique_lock slot(pool.InlineSlot(k), std::defer_lock);
    if (!slot.try_lock_until(deadline)) {
      marked[k].store(true, std::memory_order_relaxed);
    } else if (marked[k].exchange(false, std::memory_order_relaxed) || forget(targets[k])) {
      forgotten = std::exchange(targets[k], {});
    }
  }
}
}  // namespace

void InlineCopies::Forget(const PeerState* peer, const RemoteRegion* region) {
  ForgetTargets(pool_, targets_, forgotten_, {}, false, [&](const InlineTarget& t) {
    return t.state && t.state.get() == peer && (region == nullptr || t.region.get() == region);
  });
}

void InlineCopies::ForgetAll(Clock::time_point deadline) {
  ForgetTargets(pool_, targets_, forgotten_, deadline, false, [](const InlineTarget&) { return true; });
}

void InlineCopies::OnTick() {
  ForgetTargets(pool_, targets_, forgotten_, {}, true, [](const InlineTarget&) { return false; });
}

}  // namespace xfer
