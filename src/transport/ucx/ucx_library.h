// UCX, loaded at run time. xfer is built against UCX's headers only and dlopens libucp.so.0
// the first time the ucx transport needs it: no binary xfer builds needs a UCX library to
// start, so one binary (a Python wheel) runs on machines with or without UCX and uses the UCX
// of the machine it runs on (a cluster's own, or one a Python libucx package loaded).
//
// Every UCX function the transport calls goes through the table: Ucx().ucp_put_nbx(...).
// Types, enums, macros and the headers' inline helpers are used as the headers give them.
#pragma once

#include <ucp/api/ucp.h>

#include <string>
#include <vector>

#include "xfer/status.h"

namespace xfer::transport::ucx {

// The UCX functions the transport calls, each written once. (ucp_init is an inline wrapper
// in ucp.h around ucp_init_version: call ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, ...).)
#define XFER_UCX_FUNCTIONS(X)   \
  X(ucp_cleanup)                \
  X(ucp_config_read)            \
  X(ucp_config_release)         \
  X(ucp_context_print_info)     \
  X(ucp_context_query)          \
  X(ucp_ep_close_nbx)           \
  X(ucp_ep_create)              \
  X(ucp_ep_flush_nbx)           \
  X(ucp_ep_rkey_unpack)         \
  X(ucp_get_nbx)                \
  X(ucp_get_version_string)     \
  X(ucp_init_version)           \
  X(ucp_mem_map)                \
  X(ucp_mem_unmap)              \
  X(ucp_put_nbx)                \
  X(ucp_request_check_status)   \
  X(ucp_request_free)           \
  X(ucp_rkey_buffer_release)    \
  X(ucp_rkey_destroy)           \
  X(ucp_rkey_pack)              \
  X(ucp_worker_arm)             \
  X(ucp_worker_create)          \
  X(ucp_worker_destroy)         \
  X(ucp_worker_get_address)     \
  X(ucp_worker_get_efd)         \
  X(ucp_worker_progress)        \
  X(ucp_worker_release_address) \
  X(ucs_status_string)

// One loaded UCX: a pointer per function, and the one variable the transport reads.
struct UcxLibrary {
#define XFER_UCX_POINTER(name) decltype(&::name) name = nullptr;
  XFER_UCX_FUNCTIONS(XFER_UCX_POINTER)
#undef XFER_UCX_POINTER
  // libucs's names of the memory types, indexed by ucs_memory_type_t. (Only the types this
  // UCX reports are looked up: its array may be shorter than the headers' UCS_MEMORY_TYPE_LAST.)
  const char* const* ucs_memory_type_names = nullptr;
  std::string path;  // the file the dynamic loader opened, for messages
};

// A library to try: a path, or a soname for the dynamic loader's search (LD_LIBRARY_PATH,
// ldconfig's cache; it also matches a libucp already loaded, by soname).
struct LibraryCandidate {
  std::string name;        // as dlopen takes it
  std::string label;       // what it is and where it came from, for messages: "XFER_UCX_LIB=/x/libucp.so.0"
  bool if_loaded = false;  // only a library already loaded in the process (RTLD_NOLOAD)
};

// What to try, in order: only $XFER_UCX_LIB when it is set (xfer_ucx_lib: its value, null or
// empty when unset); otherwise a libucp.so.0 the process has loaded already (one UCX per
// process: e.g. the one a Python libucx package loaded), the build's XFER_UCX_ROOT's
// lib/libucp.so.0 where the build was configured with one, then libucp.so.0 through the
// dynamic loader's search.
std::vector<LibraryCandidate> DefaultCandidates(const char* xfer_ucx_lib);

// Opens the first candidate that has every function (RTLD_NOW | RTLD_GLOBAL: UCX's own modules,
// which it dlopens, need its symbols) and fills *out. Fails with kUnsupported, saying what was
// tried, each dlerror and how to get UCX (a message for a person, without a "ucx: " prefix). A library once
// opened is never closed (UCX installs hooks and threads that do not survive an unload).
Status LoadLibrary(const std::vector<LibraryCandidate>& candidates, UcxLibrary* out);

// The process's UCX: loaded from DefaultCandidates(getenv("XFER_UCX_LIB")) on the first call
// (thread-safe), once. Ok, or why UCX is unusable here (LoadLibrary's failure).
const Status& LibraryStatus();

// The process's UCX table. Only once LibraryStatus() is ok: every UCX object (a context, and
// the workers, endpoints and memory under it) exists only then, so code that holds one may call.
const UcxLibrary& Ucx();

}  // namespace xfer::transport::ucx
