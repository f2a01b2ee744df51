// Transport "cma": cross-memory attach (process_vm_writev / process_vm_readv) between
// processes of one host. Zero-copy and one-sided: the peer's threads do nothing.
#pragma once

#include <string>

#include "transport/transport.h"

namespace xfer::transport {

class CmaTransport final : public Transport {
 public:
  // Probes the system call on this process; false (with *why) when the kernel refuses it.
  static bool Available(std::string* why);

  std::string_view name() const override { return "cma"; }
  size_t max_slices_per_batch() const override;
  // Reads the peer's cookie through process_vm_readv: proves permission and that the pid is
  // the peer (same pid namespace, same incarnation) before any byte is written.
  Status Connect(const PeerEndpoint& peer, std::shared_ptr<Link>* link) override;
};

}  // namespace xfer::transport
