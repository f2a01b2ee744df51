// What every part of xfer-bench shares: the libraries, the protocol and JSON versions, the
// names it knows.
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "xfer/engine.h"

namespace xfer::bench {

using json = nlohmann::json;

inline constexpr int kExitArgs = 2;
inline constexpr int kExitExpect = 3;  // --expect-bw / --expect-p99 not met
inline constexpr const char* kRegionTag = "xfer-bench";
inline constexpr const char* kLocalTag = "xfer-bench-local";
inline constexpr const char* kDefaultListen = "0.0.0.0:18515";  // perftest's port, for familiarity
inline constexpr const char* kCtlSchema = "xfer-bench-ctl";
// 2: the configuration carries mem and huge_pages; rows carry the bytes moved per path.
// 3: local_mem / remote_mem may be cuda:N (the target allocates its region on its GPU), the
//    configuration carries buffer_pool, staging_buffers and staging_bytes, the ready reply the
//    region's memory ("region_mem"), rows carry cuda_bytes / staged_bytes.
// 4: the configuration carries set (--set KEY=VALUE).
inline constexpr int kCtlVersion = 4;
inline constexpr const char* kJsonSchema = "xfer-bench";
// 3: config.mem / config.huge_pages, peer.shm, rows' shm_bytes / transport_bytes, paths[].
// 4: GPU memory and the buffer pool: config.buffer_pool and config.staging, peer.cuda, rows'
//    and paths[]' cuda_bytes / staged_bytes (paths[] also cuda_pct / staged_pct; the
//    percentages are of shm + transport + cuda + staged bytes), table cells under transport
//    "cuda" and path "bufferpool" measured where a GPU / the pool is usable, and the table's
//    direction read as local (initiator) memory to remote (target) memory for READ too.
inline constexpr int kJsonVersion = 4;

struct ArgError {
  std::string msg;
};

// Transports the table tries, in order. A name the engine does not know is reported "not built";
// a new transport needs only its name here.
inline const std::vector<std::string> kKnownTransports = {"local", "cma", "shm", "tcp", "ucx", "cuda"};

}  // namespace xfer::bench
