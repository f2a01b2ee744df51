// What the ucx transport's target side (ucx_transport.cc) and its links (ucx_link.cc) share.
#pragma once

#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>

#include "transport/link.h"
#include "transport/ucx/ucx_library.h"  // Ucx(): every UCX call goes through it

namespace xfer::transport::ucx {

std::string UcsError(const char* what, ucs_status_t s);

// The UCP context outlives the transport while links or mapped memory still use it.
struct Context {
  ucp_context_h h = nullptr;
  ~Context();
};
Status CreateContext(std::shared_ptr<Context>* out);

// Workers are SERIALIZED: one thread at a time uses each (the target's progress thread; a
// link's leader).
Status CreateWorker(ucp_context_h ctx, ucp_worker_h* out);

// An eventfd that wakes a thread sleeping in poll on `fd`: Signal from any thread; the sleeper
// Clears it after its poll (a Signal after that wakes the next poll at once: harmless). A
// failed write or read only leaves the poll to its timeout.
struct Wakeup {
  Wakeup() = default;
  Wakeup(const Wakeup&) = delete;
  Wakeup& operator=(const Wakeup&) = delete;
  ~Wakeup() {
    if (fd >= 0) ::close(fd);
  }
  void Signal() const {
    uint64_t one = 1;
    if (::write(fd, &one, sizeof one) < 0) {
    }
  }
  void Clear() const {
    uint64_t n;
    if (::read(fd, &n, sizeof n) < 0) {
    }
  }
  const int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
};

// Waits for a request to complete, progressing the worker, until `until`. Returns its status
// (UCS_INPROGRESS if time ran out); frees it once complete.
ucs_status_t WaitRequest(ucp_worker_h w, void* req, Clock::time_point until);

}  // namespace xfer::transport::ucx
