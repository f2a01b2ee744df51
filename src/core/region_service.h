// This engine's registered regions: the registry, what the backends hold for each region, and
// the sessions that hear of changes. A change and a hello's snapshot of the table happen under
// one lock, so a peer never misses an update.
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
#include <utility>
#include <vector>

#include "control/session.h"
#include "core/backend_set.h"
#include "core/registry.h"
#include "core/remote_regions.h"

namespace xfer {

class RegionService {
 public:
  using Clock = std::chrono::steady_clock;
  using MakeHello = std::function<wire::Hello(const std::vector<wire::WireRegion>& regions)>;

  // mirror: this engine's own view of its regions (transfers to itself).
  void Start(BackendSet* backends, RemoteRegions* mirror);
  const Registry& registry() const { return registry_; }

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
  BackendSet* backends_ = nullptr;
  RemoteRegions* mirror_ = nullptr;
  Registry registry_;
  mutable std::mutex mu_;  // orders changes with hello snapshots
  std::set<std::shared_ptr<control::Session>> subscribers_;           // mu_
  bool closed_ = false;                                               // mu_
  std::map<MemHandle, std::unique_ptr<RegionResources>> resources_;  // mu_
};

}  // namespace xfer
