// RegionService: this engine's registered regions (Engine::RegisterMem, AllocMem,
// DeregisterMem, FreeMem): the registry, what the backends hold for each region, and the
// sessions that hear of changes. A change and a hello's snapshot of the table happen under one
// lock, so a peer never misses an update.
//
// Deregistration is a fence (docs/design.md): BeginRemove forgets the region and tells every
// subscriber; the engine then waits for its own batches and its backends' target threads;
// FinishRemove waits for each peer's acknowledgement (cutting off a peer that does not answer
// in time) and only then releases what the backends held.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "control/session.h"
#include "core/local_engine.h"
#include "core/metrics/metrics.h"
#include "core/regions/registry.h"
#include "core/regions/remote_regions.h"
#include "transport/backend_set.h"

namespace xfer {

class RegionService {
 public:
  using Clock = std::chrono::steady_clock;
  using MakeHello = std::function<wire::Hello(const std::vector<wire::WireRegion>& regions)>;

  // What deregistration waits for, and who hears of the tags (EngineImpl wires them).
  struct Hooks {
    // Returns once no batch of ours and no backend thread serving a peer touches memory that
    // was deregistered before the call (the data path's fence, then the backends').
    std::function<void(Clock::time_point deadline)> fence;
    // The set of the regions' tags may have changed (the cluster entry carries them).
    std::function<void()> tags_changed;
  };

  explicit RegionService(const LocalEngine& self) : self_(self) {}
  // mirror: this engine's own view of its regions (transfers to itself).
  void Start(BackendSet* backends, RemoteRegions* mirror, Hooks hooks);
  const Registry& registry() const { return registry_; }

  // Engine API.
  Status Register(void* addr, uint64_t len, MemType type, MemHandle* handle, const std::string& tag,
                  PeerAccess access);
  Status Allocate(uint64_t len, MemType type, void** addr, MemHandle* handle, const std::string& tag,
                  const AllocOptions& options);
  // Within the heartbeat timeout whatever peers do: the fences end by then (a tcp data
  // connection still busy is closed), and a peer that has not confirmed by then is cut off.
  Status Deregister(MemHandle handle, bool free);

  // What the target-side backends may do with a range of our memory (transport::EngineContext).
  transport::TargetAccess Access(uint64_t addr, uint64_t len, bool write) const;
  void AddGauges(MetricsSnapshot* out) const;

  // Sends the hello (with a snapshot of the table) and subscribes the session to changes;
  // after CloseSubscriptions, sends nothing and fails.
  Status SendHelloAndSubscribe(const std::shared_ptr<control::Session>& s, const MakeHello& hello);
  void Unsubscribe(const std::shared_ptr<control::Session>& s);
  // Finalize: no hello goes out from now on; returns every session that was sent one (each
  // must hear goodbye).
  std::vector<std::shared_ptr<control::Session>> CloseSubscriptions();
  // Finalize, once no peer uses our memory: releases every region's resources.
  void ReleaseAll();

 private:
  // Prepares the region with every backend (their blobs), adds it (or finds the same range
  // registered already: then one more reference) and tells the subscribers of a new one.
  // allocated: memory from AllocMem (released only by FreeMem); res holds it, if so.
  Status Add(wire::WireRegion region, bool allocated, std::unique_ptr<RegionResources> res,
             MemHandle* handle);

  struct Removal {
    MemHandle handle = 0;
    bool removed = false;  // the last reference went: peers were told, FinishRemove must run
    std::vector<std::pair<std::shared_ptr<control::Session>, uint64_t>> pending;  // acks due
  };
  Status BeginRemove(MemHandle handle, bool free, Removal* out);
  void FinishRemove(Removal& removal, Clock::time_point deadline);

  const LocalEngine& self_;
  Hooks hooks_;
  BackendSet* backends_ = nullptr;
  RemoteRegions* mirror_ = nullptr;
  Registry registry_;
  mutable std::mutex mu_;                                            // orders changes with hello snapshots
  std::set<std::shared_ptr<control::Session>> subscribers_;          // mu_
  bool closed_ = false;                                              // mu_
  std::map<MemHandle, std::unique_ptr<RegionResources>> resources_;  // mu_
};

}  // namespace xfer
