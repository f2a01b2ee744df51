// xfer::DescribeTransports: the backends as an engine here would start them, started once on
// loopback and stopped at once (no port is left open, no peer is contacted).
#include "transport/backend_set.h"
#include "util/host.h"
#include "xfer/engine.h"

namespace xfer {

Status DescribeTransports(const EngineOptions& options, std::vector<TransportState>* out) {
  transport::EngineContext ctx;
  ctx.incarnation = host::RandomU64();
  ctx.listen_host = "127.0.0.1";
  ctx.options = &options;
  ctx.region_access = [](uint64_t, uint64_t, bool) { return transport::TargetAccess{}; };
  ctx.is_peer = [](uint64_t) { return false; };
  ctx.peer_auth_keys = [](uint64_t) { return std::vector<std::string>(); };
  BackendSet backends;
  Status started = backends.Start(ctx);
  out->clear();
  for (const auto& b : backends.States()) out->push_back({b.name, b.on, b.on ? "" : b.why_off, b.about});
  backends.StopServing();
  return started;
}

}  // namespace xfer
