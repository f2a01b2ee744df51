// Prepared lists in Python (Engine.prepare_local, prepare_remote, and the transfers by index:
// read_prepared, write_prepared and their _async forms).
#pragma once
#include <pybind11/pybind11.h>

#include <memory>
#include <optional>
#include <string>

#include "py_engine.h"

namespace xfer::py {

// A prepared list: released by release(), the end of a with block, or when the object dies
// (the engine open then).
class PyPreparedList {
 public:
  PyPreparedList(std::shared_ptr<Core> core, ListHandle handle, size_t size, std::optional<std::string> peer)
      : core_(std::move(core)), handle_(handle), size_(size), peer_(std::move(peer)) {}
  ~PyPreparedList();
  void Release();  // InvalidArgumentError when released already
  // The handle for a transfer; InvalidArgumentError once released.
  ListHandle handle(const char* what) const;
  size_t size() const { return size_; }
  const std::optional<std::string>& peer() const { return peer_; }
  bool released() const { return released_; }
  const Core* core() const { return core_.get(); }

 private:
  std::shared_ptr<Core> core_;  // (reset, without the GIL, by the destructor)
  const ListHandle handle_;
  const size_t size_;
  const std::optional<std::string> peer_;  // none for a local list
  bool released_ = false;                  // (GIL held)
};

// Adds PreparedList to the module, and the prepared-list methods to Engine.
void BindPrepared(pybind11::module_& m, pybind11::class_<PyEngine>& engine);

}  // namespace xfer::py
