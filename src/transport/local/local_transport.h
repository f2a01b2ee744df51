// Transport "local": both ends live in this process, so a transfer is memcpy.
#pragma once

#include "transport/transport.h"

namespace xfer::transport {

class LocalTransport final : public Transport {
 public:
  std::string_view name() const override { return "local"; }
  size_t max_slices_per_batch() const override { return 1024; }
  // Reaches only a peer in this very process.
  Status Connect(const PeerEndpoint& peer, std::shared_ptr<Link>* link) override;
};

}  // namespace xfer::transport
