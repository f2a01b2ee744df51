// The registry: the backends of this build, best first. A descriptor takes the first route
// that reaches its pair of memories, so the order is the preference: local (same process) >
// shm (memcpy into a same-host peer's AllocMem memory) > cuda (the copy engines, same host) >
// cma (same host) > ucx (RDMA) > tcp (any host). Adding a backend: its folder under
// src/transport/ (with a backend.cmake and a factory Make<Name>Backend), and its name here.
#include "transport/backend.h"

#define XFER_BACKENDS(X) X(Local) X(Shm) X(Cuda) X(Cma) X(Ucx) X(Tcp)

namespace xfer::transport {

#define XFER_DECLARE_FACTORY(Name) std::unique_ptr<Backend> Make##Name##Backend();
XFER_BACKENDS(XFER_DECLARE_FACTORY)

namespace {
#define XFER_FACTORY(Name) Make##Name##Backend,
constexpr BackendFactory kBackends[] = {XFER_BACKENDS(XFER_FACTORY)};
}  // namespace

std::vector<std::unique_ptr<Backend>> MakeBackends() {
  std::vector<std::unique_ptr<Backend>> all;
  for (BackendFactory make : kBackends) all.push_back(make());
  return all;
}

const std::vector<std::string>& BackendNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& b : MakeBackends()) n.emplace_back(b->name());
    return n;
  }();
  return names;
}

int BackendIndex(std::string_view name) {
  const auto& names = BackendNames();
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return static_cast<int>(i);
  }
  return 0;
}

}  // namespace xfer::transport
