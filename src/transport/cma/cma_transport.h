// Transport "cma": cross-memory attach (process_vm_writev / process_vm_readv) between
// processes of one host. Zero-copy and one-sided: the peer's threads do nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "transport/link.h"
#include "xfer/status.h"

namespace xfer::transport {

// A peer as cma reaches it: its process, and where in it a u64 holds its incarnation.
struct CmaPeer {
  int32_t pid = 0;
  uint64_t incarnation = 0;
  uint64_t cookie = 0;  // the address of that u64 in the peer
  int pidfd = -1;       // the peer process, verified (dup'ed by the link); -1: none
};

class CmaTransport final {
 public:
  // Probes the system call on this process; false (with *why) when the kernel refuses it.
  static bool Available(std::string* why);
  // The most slices one batch may carry (the kernel's IOV_MAX).
  static size_t max_slices_per_batch();
  // Reads the peer's cookie through process_vm_readv: proves permission and that the pid is
  // the peer (same pid namespace, same incarnation) before any byte is written.
  static Status Connect(const CmaPeer& peer, std::shared_ptr<Link>* link);
};

}  // namespace xfer::transport
