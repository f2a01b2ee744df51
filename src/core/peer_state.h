// What the data path needs to know about one peer: its regions, its link, whether it lives.
#pragma once

#include <atomic>
#include <memory>

#include "core/buffer_pool.h"
#include "core/planner.h"
#include "core/remote_regions.h"
#include "transport/shm/shm_memory.h"
#include "transport/transport.h"
#include "xfer/types.h"

namespace xfer {

struct PeerState {
  PeerInfo info;
  RemoteRegions regions;
  std::shared_ptr<transport::Link> link;  // null when no transport reaches the peer
  // tcp beside a ucx or cma link, for the peer's GPU regions (which only tcp's target stages).
  std::shared_ptr<transport::Link> gpu_link;
  // Same host: maps the peer's AllocMem memory, which is then moved with memcpy. Null otherwise.
  std::unique_ptr<transport::shm::PeerMapper> mapper;
  bool same_process = false;  // the peer's addresses are valid here as they are
  bool cuda = false;  // same host, CUDA on both sides: the peer's GPU memory can be opened here
  std::shared_ptr<BufferPool> staging;  // the engine's buffer pool; null when staging is off
  PeerPaths paths;                      // which path each descriptor takes, and batch sizes
  std::atomic<bool> alive{true};  // cleared when the session ends; batches check it
  std::atomic<uint64_t> shm_bytes{0}, cuda_bytes{0}, staged_bytes{0}, link_bytes{0};  // by path

  // Some path reaches the peer, so transfers can be tried.
  bool Reachable() const { return link || paths.shm_base || paths.cuda_base; }
};

}  // namespace xfer
