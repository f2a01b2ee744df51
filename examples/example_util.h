// What the examples share: failing with a status, and finding a peer's region by its tag.
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

}  // namespace example
