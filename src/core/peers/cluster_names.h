// Cluster metadata (docs/cluster.md): this engine's entry in the metadata service (etcd, or an
// HTTP metadata server), and other engines' cluster names turned into the addresses the rest of
// the engine knows peers by. Only Connect looks a name up there; the data path uses the address
// it found, so it never waits for the service.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/local_engine.h"
#include "metadata/directory.h"

namespace xfer {

class ClusterNames {
 public:
  using Tags = std::function<std::vector<std::string>()>;

  explicit ClusterNames(const LocalEngine& self) : self_(self) {}

  // Publishes this engine (when it listens and has a cluster name), with the tags of its
  // regions, and starts the lookups. Only with EngineOptions::metadata.
  Status Start(bool listens, Tags tags);
  void Stop();
  // Whether remote is to be read as a cluster name (metadata is on, and it is no host:port).
  bool IsName(const std::string& remote) const { return directory_ && metadata::IsClusterName(remote); }
  // The entry of the engine of that name (address, incarnation), looked up afresh.
  Status Resolve(const std::string& name, ClusterPeer* entry);
  // Transfers by that name go to address from now on: once a Connect to it succeeded (a failed
  // one, to an address a rogue entry named, leaves the name with the engine it had).
  void Remember(const std::string& name, const std::string& address);
  // The address a cluster name was last looked up at (this engine's for its own name; remote
  // itself for anything else).
  std::string AddressOf(const std::string& remote);
  // Engine::ListPeers.
  Status List(std::vector<ClusterPeer>* peers);
  // The tags of the registered regions changed: published anew.
  void TagsChanged() {
    if (directory_) directory_->TagsChanged();
  }

 private:
  const LocalEngine& self_;
  std::unique_ptr<metadata::Directory> directory_;  // with EngineOptions::metadata
  std::mutex mu_;
  std::unordered_map<std::string, std::string> addresses_;  // (mu_) cluster name -> address
};

}  // namespace xfer
