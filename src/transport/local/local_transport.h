// Transport "local": both ends live in this process, so a transfer is memcpy.
#pragma once

#include "transport/transport.h"

namespace xfer::transport {

// Copies a batch between two ranges both mapped in this process: the local transport's
// transfers, and shm's (the remote side being a peer's segment mapped here).
void CopyInProcess(Op op, std::span<const Slice> batch);

class LocalTransport final : public Transport {
 public:
  std::string_view name() const override { return "local"; }
  size_t max_slices_per_batch() const override { return 1024; }
  // Reaches only a peer in this very process.
  Status Connect(const PeerEndpoint& peer, std::shared_ptr<Link>* link) override;
};

}  // namespace xfer::transport
