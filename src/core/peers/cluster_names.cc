#include "core/peers/cluster_names.h"

#include <algorithm>
#include <cmath>

#include "util/log.h"

namespace xfer {

Status ClusterNames::Start(bool listens, Tags tags) {
  const EngineOptions& opts = self_.options;
  metadata::Directory::Options o;
  o.url = opts.metadata;
  if (listens) {  // (a client-only engine cannot be connected to: it looks up, and is not listed)
    o.self = ClusterPeer{opts.cluster_name, self_.name, self_.incarnation, self_.host_id, {}};
  } else if (!opts.cluster_name.empty()) {
    XLOG(WARN) << "engine " << self_.name << " does not listen: cluster_name '" << opts.cluster_name
               << "' is not published";
  }
  // The entry outlives a dead engine by about its heartbeat timeout (etcd's minimum: 2 s).
  const double seconds = std::chrono::duration<double>(opts.heartbeat_timeout).count();
  o.ttl = std::chrono::seconds(std::max<int64_t>(2, static_cast<int64_t>(std::ceil(seconds))));
  o.required = !opts.start_without_metadata;
  o.tags = std::move(tags);
  const bool published = !o.self.name.empty();
  Status s = metadata::Directory::Start(std::move(o), &directory_);
  if (s.ok() && published) {
    XLOG(INFO) << "engine " << self_.name << " is '" << opts.cluster_name << "' at " << directory_->url();
  }
  return s;
}

void ClusterNames::Stop() {
  if (directory_) directory_->Stop();
}

Status ClusterNames::Resolve(const std::string& name, ClusterPeer* entry) {
  if (!directory_) {
    return {StatusCode::kInvalidArgument, "Connect: '" + name +
                                              "' is not host:port (connecting by "
                                              "cluster name needs EngineOptions::metadata)"};
  }
  ClusterPeer peer;
  Status s = directory_->Lookup(name, &peer);
  if (s.ok() && metadata::IsClusterName(peer.address)) {  // (a name again: no loop through etcd)
    s = {StatusCode::kInternal, "the entry of '" + name + "' at " + directory_->url() +
                                    " has no host:port address: '" + peer.address + "'"};
  }
  if (!s.ok()) return {s.code(), "Connect: " + s.message()};
  *entry = std::move(peer);
  return Status::Ok();
}

void ClusterNames::Remember(const std::string& name, const std::string& address) {
  std::lock_guard lock(mu_);
  addresses_[name] = address;
}

std::string ClusterNames::AddressOf(const std::string& remote) {
  if (!IsName(remote)) return remote;
  if (remote == self_.options.cluster_name) return self_.name;
  std::lock_guard lock(mu_);
  auto it = addresses_.find(remote);
  return it == addresses_.end() ? remote : it->second;
}

Status ClusterNames::List(std::vector<ClusterPeer>* peers) {
  if (peers == nullptr) return {StatusCode::kInvalidArgument, "ListPeers: null output"};
  if (!directory_) return {StatusCode::kInvalidArgument, "ListPeers: needs EngineOptions::metadata"};
  Status s = directory_->List(peers);
  if (!s.ok()) return {s.code(), "ListPeers: " + s.message()};
  return s;
}

}  // namespace xfer
