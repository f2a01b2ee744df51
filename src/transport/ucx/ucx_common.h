// What the ucx transport's target side (ucx_transport.cc) and its links (ucx_link.cc) share.
#pragma once

#include <ucp/api/ucp.h>

#include <memory>
#include <string>

#include "transport/transport.h"

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

// Waits for a request to complete, progressing the worker, until `until`. Returns its status
// (UCS_INPROGRESS if time ran out); frees it once complete.
ucs_status_t WaitRequest(ucp_worker_h w, void* req, Clock::time_point until);

}  // namespace xfer::transport::ucx
