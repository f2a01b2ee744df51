// Descriptor lists prepared once and moved by index (Engine::PrepareLocalList,
// PrepareRemoteList; docs/prepared_lists.md).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/datapath/planner.h"
#include "core/peers/peer_table.h"
#include "core/regions/remote_regions.h"
#include "xfer/status.h"
#include "xfer/types.h"

namespace xfer {

class Registry;

struct LocalList {
  std::vector<LocalEntry> entries;
  uint64_t registry_version = 0;  // the registry's version when the entries were checked
};

// The plans of the last requests over a remote list (kPlans at most), for the next one with
// the same op, local list and pairs (a request posted again, as NIXL's xfer handles are): a plan
// is reused while the local list is the one it was made from (not checked again since) and no
// region it touches was revoked.
class PlanCache {
 public:
  std::shared_ptr<const Plan> Find(Op op, const LocalList* local, std::span<const uint32_t> local_index,
                                   std::span<const uint32_t> remote_index);  // (drops stale plans)
  void Keep(Op op, std::shared_ptr<const LocalList> local, std::span<const uint32_t> local_index,
            std::span<const uint32_t> remote_index, std::shared_ptr<const Plan> plan);

 private:
  static constexpr size_t kPlans = 8;
  struct Kept {
    Op op = Op::kRead;
    std::shared_ptr<const LocalList> local;  // (held: its address is not reused meanwhile)
    std::vector<uint32_t> local_index, remote_index;
    std::shared_ptr<const Plan> plan;  // null: an empty place
  };
  std::mutex mu_;
  Kept kept_[kPlans];  // mu_
  size_t next_ = 0;    // mu_: the place the next plan takes (the oldest)
};

struct RemoteList {
  std::string remote;    // the peer, as the caller named it
  PeerTable::Peer peer;  // its session and state when the list was prepared
  std::vector<RemoteEntry> entries;
  std::vector<std::shared_ptr<RemoteRegion>> regions;  // those the entries lie in
  mutable PlanCache last_plan;
};

// Makes the entries of a local list from ranges and checks them against the registry and this
// process's mappings. strict: the first bad range is an error (kInvalidArgument naming it);
// otherwise a bad one is marked unusable (a list checked again after the registry changed).
Status CheckLocalEntries(const Registry& registry, std::vector<LocalEntry>* entries, bool strict);

// Finds the region of the peer's that holds each range (one that grants WRITE where there is
// one). kInvalidArgument for a malformed range, kRemoteAccessDenied for one outside every
// region; the message names the entry.
Status FindRemoteEntries(const std::vector<MemRange>& ranges, const RemoteRegions& regions, RemoteList* list);

// The engine's prepared lists by handle. Handles of both kinds, of every engine of the process,
// come from one sequence: a handle of one kind given as the other is told apart from an unknown
// one, and another engine's handle is unknown here.
class ListTable {
 public:
  ListHandle Add(std::shared_ptr<const LocalList> list);
  ListHandle Add(std::shared_ptr<const RemoteList> list);
  bool Remove(ListHandle h);
  // The two lists of a request; kInvalidArgument naming a handle that is unknown or of the
  // other kind.
  Status Get(ListHandle local, ListHandle remote, std::shared_ptr<const LocalList>* l,
             std::shared_ptr<const RemoteList>* r) const;
  // Puts fresh in place of old (a local list checked again), when old is still there.
  void Replace(ListHandle h, const std::shared_ptr<const LocalList>& old,
               std::shared_ptr<const LocalList> fresh);
  void Clear();

 private:
  static ListHandle NextHandle();
  mutable std::mutex mu_;
  std::unordered_map<ListHandle, std::shared_ptr<const LocalList>> local_;    // mu_
  std::unordered_map<ListHandle, std::shared_ptr<const RemoteList>> remote_;  // mu_
};

}  // namespace xfer
