// xfer-bench with cluster metadata (--metadata etcd://...): `serve --name NAME` publishes an
// engine of that cluster name whose one region is tagged with the serve's control address,
// and a client given NAME instead of host:port finds the serve there.
#pragma once

#include <memory>
#include <string>

#include "config.h"
#include "xfer/engine.h"

namespace xfer::bench {

inline constexpr const char* kServeTag = "xfer-bench-serve=";  // + the control host:port

// The serve side: an engine named c.cluster_name whose region tag says where clients reach the
// serve (host of c.listen, control port `port`). "" on success, else why not.
std::string AnnounceServe(const Config& c, int port, std::unique_ptr<Engine>* announcer);
// The client side: c.peer, a cluster name, becomes the control address its serve announced.
// "" on success, else why not.
std::string FindServe(Config& c);

}  // namespace xfer::bench
