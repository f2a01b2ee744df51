// AllocMem host memory lives in a memfd segment (util/shared_memory.h); its region record
// carries, under the "shm" backend's name, the owner's descriptor number and the key in the
// memfd's name. Any backend of a same-host peer (shm copies into it, cuda too) maps such a
// region here through the peer's PeerMapper, once per region.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "transport/remote_region.h"
#include "util/shared_memory.h"

namespace xfer::transport {

// The backend whose blob describes a region's memfd.
inline constexpr std::string_view kMemfdBlob = "shm";

// A region's blob: the owner's memfd descriptor and the key in the memfd's name.
std::string MemfdRegionBlob(int32_t fd, uint64_t key);

// Where the peer's AllocMem region r is mapped here, mapping it on first use (once, shared by
// every backend that asks); null when r is not AllocMem memory or cannot be mapped (logged).
uint8_t* MapMemfdRegion(const shared_memory::PeerMapper& mapper, const std::string& peer_name,
                        uint64_t peer_incarnation, RemoteRegion& r);

}  // namespace xfer::transport
