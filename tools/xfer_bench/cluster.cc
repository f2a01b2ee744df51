#include "cluster.h"

#include <chrono>

#include "ctl.h"

namespace xfer::bench {

namespace {
alignas(64) char announced_page[64];  // the announcer's region: only its tag matters
}

std::string AnnounceServe(const Config& c, int port, std::unique_ptr<Engine>* announcer) {
  std::string host, unused;
  if (!SplitHostPort(c.listen, &host, &unused)) return "--listen: bad address '" + c.listen + "'";
  if (host == "0.0.0.0" || host == "::" || host == "[::]") {
    return "--metadata needs --listen with the address clients reach this host at (not " + host + ")";
  }
  EngineOptions o;
  o.metadata = c.metadata;
  o.cluster_name = c.cluster_name;
  o.secret_file = c.secret_file;
  auto e = std::make_unique<Engine>();
  Status s = e->Initialize(
      (host.find(':') != std::string::npos && host[0] != '[' ? "[" + host + "]" : host) + ":0", o);
  MemHandle h = 0;
  const std::string where =
      (host.find(':') != std::string::npos && host[0] != '[' ? "[" + host + "]" : host) + ":" +
      std::to_string(port);
  if (s.ok()) {
    s = e->RegisterMem(announced_page, sizeof announced_page, MemType::kHost, &h, kServeTag + where,
                       PeerAccess::kReadOnly);
  }
  if (!s.ok()) return "announcing '" + c.cluster_name + "': " + s.ToString();
  *announcer = std::move(e);
  return "";
}

std::string FindServe(Config& c) {
  EngineOptions o;
  o.metadata = c.metadata;
  Engine finder;
  Status s = finder.Initialize("127.0.0.1", o);  // (client-only: it looks up, is not listed)
  std::vector<ClusterPeer> peers;
  if (s.ok()) s = finder.ListPeers(&peers);
  if (!s.ok()) return "looking up '" + c.peer + "': " + s.ToString();
  for (const auto& p : peers) {
    if (p.name != c.peer) continue;
    for (const auto& tag : p.tags) {
      if (tag.rfind(kServeTag, 0) == 0) {
        c.peer = tag.substr(std::string(kServeTag).size());
        return "";
      }
    }
    return "'" + p.name + "' at " + c.metadata + " is not an xfer-bench serve (no " + kServeTag + " tag)";
  }
  return "no engine named '" + c.peer + "' at " + c.metadata;
}

}  // namespace xfer::bench
