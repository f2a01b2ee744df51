// Directory: this engine's entry in the cluster's metadata service, and the lookups of other
// engines' entries (name -> address, incarnation, host id, region tags). Two services:
// - etcd (etcd_directory.cc): the entry lives under a lease that a thread keeps alive: when the
//   engine dies, etcd deletes it once the lease runs out; Stop revokes it at once.
// - an HTTP metadata server speaking Mooncake's protocol (http_directory.cc): no leases and no
//   listing; Stop deletes the entry.
// When the service cannot be reached the thread logs once, retries with back-off and publishes
// again when it can; nothing else in the engine waits for it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "xfer/status.h"
#include "xfer/types.h"

namespace xfer::metadata {

// A cluster name: 1..128 of A-Z a-z 0-9 . _ - (never a "host:port"). kInvalidArgument else.
Status CheckClusterName(const std::string& name);
// True when remote names an engine by its cluster name rather than by its address.
inline bool IsClusterName(const std::string& remote) { return remote.find(':') == std::string::npos; }

class Directory {
 public:
  struct Options {
    std::string url;              // etcd://host:port[,...][/prefix] or http://host:port/path
    ClusterPeer self;             // self.name empty: look up others, publish nothing
    std::chrono::seconds ttl{3};  // etcd's lease (it may raise it to its minimum); renewed every third
    bool required = true;         // Start fails when the service cannot be reached now
    std::function<std::vector<std::string>()> tags;  // the current region tags (any thread)
  };
  // With required, publishes before it returns (or fails saying why); otherwise the thread
  // publishes as soon as the service answers. kUnsupported in a build without libcurl.
  static Status Start(Options options, std::unique_ptr<Directory>* out);
  virtual ~Directory() = default;

  // Ends the thread and revokes the lease: the entry goes at once (bounded by a timeout).
  virtual void Stop() = 0;
  // The region tags changed: published again soon (changes close together go out once).
  virtual void TagsChanged() = 0;
  virtual Status Lookup(const std::string& name, ClusterPeer* peer) = 0;
  virtual Status List(std::vector<ClusterPeer>* peers) = 0;
  // The service, as "etcd://endpoints/prefix" or the HTTP URL.
  virtual const std::string& url() const = 0;
};

}  // namespace xfer::metadata
