// Cluster metadata (docs/cluster.md): this engine's entry in etcd, and other engines' cluster
// names turned into the addresses the rest of the engine knows peers by. Only Connect looks a
// name up in etcd; the data path uses the address it found, so it never waits for etcd.
#include <algorithm>
#include <cmath>

#include "core/engine_impl.h"
#include "util/log.h"

namespace xfer {

Status EngineImpl::StartDirectory(bool listens) {
  metadata::Directory::Options o;
  o.url = opts_.metadata;
  if (listens) {  // (a client-only engine cannot be connected to: it looks up, and is not listed)
    o.self = ClusterPeer{opts_.cluster_name, name_, incarnation_, host_id_, {}};
  } else if (!opts_.cluster_name.empty()) {
    XLOG(WARN) << "engine " << name_ << " does not listen: cluster_name '" << opts_.cluster_name
               << "' is not published";
  }
  // The entry outlives a dead engine by about its heartbeat timeout (etcd's minimum: 2 s).
  const double seconds = std::chrono::duration<double>(opts_.heartbeat_timeout).count();
  o.ttl = std::chrono::seconds(std::max<int64_t>(2, static_cast<int64_t>(std::ceil(seconds))));
  o.required = !opts_.start_without_metadata;
  o.tags = [this] {
    std::vector<std::string> tags;
    for (const auto& r : regions_.registry().Snapshot()) tags.push_back(r.info.tag);
    return tags;
  };
  const bool published = !o.self.name.empty();
  Status s = metadata::Directory::Start(std::move(o), &directory_);
  if (s.ok() && published) {
    XLOG(INFO) << "engine " << name_ << " is '" << opts_.cluster_name << "' at " << directory_->url();
  }
  return s;
}

Status EngineImpl::ConnectByName(const std::string& name, std::chrono::milliseconds timeout) {
  if (!directory_) {
    Status s{StatusCode::kInvalidArgument, "Connect: '" + name + "' is not host:port (connecting by "
                                           "cluster name needs EngineOptions::metadata)"};
    XLOG(WARN) << s.message();
    return s;
  }
  // (The lookup takes up to a second per etcd endpoint; Connect gets what is left of timeout.)
  const auto deadline = DeadlineAfter(timeout);
  ClusterPeer peer;
  Status s = directory_->Lookup(name, &peer);
  if (s.ok() && metadata::IsClusterName(peer.address)) {  // (a name again: no loop through etcd)
    s = {StatusCode::kInternal, "the entry of '" + name + "' at " + directory_->url() +
                                    " has no host:port address: '" + peer.address + "'"};
  }
  if (!s.ok()) {
    XLOG(WARN) << "Connect: " << s.message();
    return {s.code(), "Connect: " + s.message()};
  }
  {
    std::lock_guard lock(names_mu_);
    addresses_[name] = peer.address;
  }
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) {
    return {StatusCode::kTimeout, "Connect: looking '" + name + "' up in etcd took the whole timeout"};
  }
  return Connect(peer.address, left);
}

bool EngineImpl::LookupByName(const std::string& name, Peer* peer) {
  if (name == opts_.cluster_name) return LookupPeer(name_, peer);
  const std::string address = AddressOf(name);
  return address != name && LookupPeer(address, peer);
}

std::string EngineImpl::AddressOf(const std::string& remote) {
  if (!directory_ || !metadata::IsClusterName(remote)) return remote;
  if (remote == opts_.cluster_name) return name_;
  std::lock_guard lock(names_mu_);
  auto it = addresses_.find(remote);
  return it == addresses_.end() ? remote : it->second;
}

Status EngineImpl::ListPeers(std::vector<ClusterPeer>* peers) {
  Status s = CheckRunning("ListPeers");
  if (s.ok() && peers == nullptr) s = {StatusCode::kInvalidArgument, "ListPeers: null output"};
  if (s.ok() && !directory_) s = {StatusCode::kInvalidArgument, "ListPeers: needs EngineOptions::metadata"};
  if (s.ok()) {
    s = directory_->List(peers);
    if (!s.ok()) s = {s.code(), "ListPeers: " + s.message()};
  }
  if (!s.ok()) XLOG(WARN) << s.message();
  return s;
}

}  // namespace xfer
