#include "transport/ucx/ucx_library.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdlib>

#include "util/text.h"

namespace xfer::transport::ucx {
namespace {

constexpr const char* kSoname = "libucp.so.0";
constexpr const char* kEnv = "XFER_UCX_LIB";
// How to get a UCX, for the message when none loads.
constexpr const char* kHowToFix =
    "install UCX (Debian: libucx0), put a cluster's UCX on LD_LIBRARY_PATH, or set "
    "XFER_UCX_LIB=/path/to/libucp.so.0";

std::string DlError() {
  const char* e = ::dlerror();
  return e ? e : "unknown error";
}

// The file behind a handle (a soname resolves to a path through the loader's search).
std::string LoadedPath(void* handle, const std::string& name) {
  link_map* map = nullptr;
  if (::dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && *map->l_name) return map->l_name;
  return name;
}

// One symbol of an open library (dlsym on libucp's handle also searches its dependencies:
// ucs_* are libucs's); null and *why when it is missing.
void* Find(void* handle, const char* symbol, std::string* why) {
  ::dlerror();  // (clear a stale one)
  void* p = ::dlsym(handle, symbol);
  if (p == nullptr) *why = std::string("it lacks ") + symbol + ": " + DlError();
  return p;
}

// Fills every entry of *lib from an open library; false and *why at the first one missing.
bool Resolve(void* handle, UcxLibrary* lib, std::string* why) {
#define XFER_UCX_RESOLVE(name)                                                 \
  lib->name = reinterpret_cast<decltype(lib->name)>(Find(handle, #name, why)); \
  if (lib->name == nullptr) return false;
  XFER_UCX_FUNCTIONS(XFER_UCX_RESOLVE)
#undef XFER_UCX_RESOLVE
  lib->ucs_memory_type_names = static_cast<const char* const*>(Find(handle, "ucs_memory_type_names", why));
  return lib->ucs_memory_type_names != nullptr;
}

struct Loaded {
  UcxLibrary lib;
  Status status;
};

const Loaded& Process() {
  static const Loaded loaded = [] {
    Loaded l;
    l.status = LoadLibrary(DefaultCandidates(std::getenv(kEnv)), &l.lib);
    return l;
  }();
  return loaded;
}

}  // namespace

std::vector<LibraryCandidate> DefaultCandidates(const char* xfer_ucx_lib) {
  if (xfer_ucx_lib != nullptr && *xfer_ucx_lib != '\0') {
    return {{xfer_ucx_lib, std::string(kEnv) + "=" + xfer_ucx_lib}};
  }
  std::vector<LibraryCandidate> out = {
      {kSoname, std::string(kSoname) + " already loaded in this process", true}};
#ifdef XFER_UCX_ROOT_LIB  // (backend.cmake: ${XFER_UCX_ROOT}/lib/libucp.so.0)
  out.push_back({XFER_UCX_ROOT_LIB, std::string("the build's XFER_UCX_ROOT: ") + XFER_UCX_ROOT_LIB});
#endif
  out.push_back(
      {kSoname, std::string(kSoname) + " through the dynamic loader's search (LD_LIBRARY_PATH, ldconfig)"});
  return out;
}

Status LoadLibrary(const std::vector<LibraryCandidate>& candidates, UcxLibrary* out) {
  std::string tried;
  bool opened = false;  // one opened, but lacked a function: too old a UCX
  for (const LibraryCandidate& c : candidates) {
    std::string why;
    const int flags = RTLD_NOW | RTLD_GLOBAL | (c.if_loaded ? RTLD_NOLOAD : 0);
    if (void* handle = ::dlopen(c.name.c_str(), flags); handle == nullptr) {
      why = c.if_loaded ? "none is" : DlError();
    } else {
      UcxLibrary lib;
      if (Resolve(handle, &lib, &why)) {
        lib.path = LoadedPath(handle, c.name);
        *out = std::move(lib);
        return Status::Ok();
      }
      opened = true;  // (left open: see the header)
    }
    text::Append(&tried, c.label + " (" + why + ")");
  }
  return {StatusCode::kUnsupported,
          std::string(opened ? "no usable UCX (libucp.so.0 of UCX 1.10 or later) found at run time"
                             : "UCX (libucp.so.0) not found at run time") +
              " (tried " + (tried.empty() ? std::string("nothing") : tried) + "): " + kHowToFix};
}

const Status& LibraryStatus() { return Process().status; }

const UcxLibrary& Ucx() { return Process().lib; }

}  // namespace xfer::transport::ucx
