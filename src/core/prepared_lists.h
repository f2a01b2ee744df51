// Descriptor lists prepared once and moved by index (Engine::PrepareLocalList,
// PrepareRemoteList; docs/prepared_lists.md).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/peer_table.h"
#include "core/planner.h"
#include "core/remote_regions.h"
#include "xfer/status.h"
#include "xfer/types.h"

namespace xfer {

class Registry;

struct LocalList {
  std::vector<LocalEntry> entries;
  uint64_t registry_version = 0;  // the registry's version when the entries were checked
};

struct RemoteList {
  std::string remote;   // the peer, as the caller named it
  PeerTable::Peer peer;  // its session and state when the list was prepared
  std::vector<RemoteEntry> entries;
  std::vector<std::shared_ptr<RemoteRegion>> regions;  // those the entries lie in
};

// Makes the entries of a local list from ranges and checks them against the registry and this
// process's mappings. strict: the first bad range is an error (kInvalidArgument naming it);
// otherwise a bad one is marked unusable (a list checked again after the registry changed).
Status CheckLocalEntries(const Registry& registry, std::vector<LocalEntry>* entries, bool strict);

// Finds the region of the peer's that holds each range (one that grants WRITE where there is
// one). kInvalidArgument for a malformed range, kRemoteAccessDenied for one outside every
// region; the message names the entry.
Status FindRemoteEntries(const std::vector<MemRange>& ranges, const RemoteRegions& regions,
                         RemoteList* list);

// The engine's prepared lists by handle. Handles of both kinds come from one sequence, so a
// handle of one kind given as the other is told apart from an unknown one.
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
  mutable std::mutex mu_;
  ListHandle next_ = 1;
  std::unordered_map<ListHandle, std::shared_ptr<const LocalList>> local_;    // mu_
  std::unordered_map<ListHandle, std::shared_ptr<const RemoteList>> remote_;  // mu_
};

}  // namespace xfer
