// What the examples share: failing with a status, the target's pool, and the initiator's way
// to it (connect, then find the pool by its tag).
#pragma once

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "xfer/engine.h"

namespace example {

inline int Fail(const char* what, const xfer::Status& s) {
  std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
  return 1;
}

// The peer's region tagged `tag`, waiting up to `timeout` for it to appear: a peer that has
// just started may not have registered it yet (it shows up without reconnecting).
inline xfer::Status FindRegion(xfer::Engine& engine, const std::string& remote, const std::string& tag,
                               xfer::RegionInfo* out,
                               std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::vector<xfer::RegionInfo> regions;
    if (xfer::Status s = engine.GetRemoteRegions(remote, &regions); !s.ok()) return s;
    for (const auto& r : regions) {
      if (r.tag == tag) {
        *out = r;
        return xfer::Status::Ok();
      }
    }
    if (std::chrono::steady_clock::now() >= until) {
      return {xfer::StatusCode::kTimeout, "no region tagged '" + tag + "' at " + remote};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// The target side: an engine listening at `name` with a pool of `bytes` from AllocMem, tagged
// "kv-pool" (peers on this host then copy into it directly: shm).
inline xfer::Status ServePool(xfer::Engine& engine, const std::string& name, uint64_t bytes, void** pool,
                              const xfer::EngineOptions& options = {}) {
  if (xfer::Status s = engine.Initialize(name, options); !s.ok()) return s;
  xfer::MemHandle h;
  return engine.AllocMem(bytes, xfer::MemType::kHost, pool, &h, "kv-pool");
}

// The initiator side: a client-only engine connected to `remote`, and the peer's pool.
inline xfer::Status OpenPool(xfer::Engine& engine, const std::string& remote, xfer::RegionInfo* pool) {
  if (xfer::Status s = engine.Initialize("127.0.0.1"); !s.ok()) return s;
  if (xfer::Status s = engine.Connect(remote, std::chrono::seconds(5)); !s.ok()) return s;
  // Found by its tag: no side channel needed for addresses.
  return FindRegion(engine, remote, "kv-pool", pool);
}

}  // namespace example
