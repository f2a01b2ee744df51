// Backend "shm": memory from Engine::AllocMem lives in a memfd; a same-host peer takes a
// duplicate of the descriptor (pidfd_getfd), maps it once, and moves bytes with memcpy.
#pragma once

#include <cstdint>
#include <string>

#include "transport/remote_region.h"
#include "util/shared_memory.h"

namespace xfer::transport::shm {

using shared_memory::PeerMapper;

// Where the peer's AllocMem region r is mapped here, mapping it on first use (once, shared by
// every backend that asks: cuda copies into it too); null when r is not AllocMem memory or
// cannot be mapped (logged).
uint8_t* MapRegion(const PeerMapper& mapper, const std::string& peer_name,
                   uint64_t peer_incarnation, RemoteRegion& r);

}  // namespace xfer::transport::shm
