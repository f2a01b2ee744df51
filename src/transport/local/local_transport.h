// Transport "local": both ends live in this process, so a transfer is memcpy.
#pragma once

#include "transport/transport.h"

namespace xfer::transport {

// Copies a batch between two ranges both mapped in this process: the local transport's
// transfers, and shm's (the remote side being a peer's segment mapped here). streaming: with
// non-temporal stores, which bypass the caches (for data larger than they are).
void CopyInProcess(Op op, std::span<const Slice> batch, bool streaming = false);

// memcpy with non-temporal stores. Out of cache it ran at 1.7x glibc's memcpy on this
// machine (13 vs 7.5 GB/s, 16 KiB..8 MiB blocks over a 256 MiB span); in cache it is slower
// (25 vs 30-39 GB/s), so it is for copies too large to stay there.
void StreamingCopy(void* dst, const void* src, uint64_t n);

class LocalTransport final : public Transport {
 public:
  std::string_view name() const override { return "local"; }
  size_t max_slices_per_batch() const override { return 1024; }
  // Reaches only a peer in this very process.
  Status Connect(const PeerEndpoint& peer, std::shared_ptr<Link>* link) override;
};

}  // namespace xfer::transport
