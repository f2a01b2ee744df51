// Which process holds the other end of a TCP connection on this host: how an engine checks a
// peer's claim to be process `pid` before it trusts that pid with a same-host path (cma
// writes into it, shm takes its descriptors, local and cuda use its addresses as ours).
#pragma once

#include <cstdint>

#include "util/net.h"
#include "xfer/status.h"

namespace xfer::host {

// A pidfd of pid (pidfd_open), or -1 with errno set.
int PidfdOpen(int32_t pid);
// True once the process of pidfd has exited (its pidfd is readable), or the pidfd is bad.
bool Exited(int pidfd);

// Ok when process pid holds the socket at the other end of the connected TCP socket fd: the
// kernel names that socket (sock_diag, in this network namespace) and pid has it among its
// descriptors. *pidfd then refers to that process: it is opened before the check, so a pid
// reused later cannot take the process's place. Otherwise why not (another network or pid
// namespace, no permission to look at pid's descriptors, or a false claim).
Status VerifyConnectionOwner(int fd, int32_t pid, net::Fd* pidfd);

}  // namespace xfer::host
