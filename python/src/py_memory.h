// Memory the engine exposes to peers, as Python objects: a Region (memory the caller owns,
// registered) and a Buffer (memory the engine allocated, AllocMem, readable as a numpy array).
#pragma once
#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "py_engine.h"

namespace xfer::py {

// "host"/"cpu" or "cuda"/"gpu".
MemType ParseKind(const std::string& kind);
// "<xfer.CLS kind addr=0x... len=N [tag=T] [state]>": the repr of Region, Buffer, RegionInfo
// (state: "read-only", "deregistered", "freed").
std::string MemoryRepr(std::string_view cls, MemType type, uint64_t addr, uint64_t len,
                       const std::string& tag, std::string_view state);

// A registered range of memory the caller owns. Holds what owns the memory (keep) until it is
// deregistered, so Python cannot free the memory while peers may use it.
class PyRegion {
 public:
  PyRegion(std::shared_ptr<Core> core, uint64_t addr, uint64_t len, MemType type, std::string tag,
           PeerAccess access, pybind11::object keep, Py_buffer* view);
  // Still registered (its engine's object is being collected): deregisters first, so that the
  // memory's owner is let go only once peers can no longer use it.
  ~PyRegion();
  void Deregister();
  bool registered() const { return handle_ != 0; }
  MemHandle handle() const { return handle_; }
  uint64_t addr() const { return addr_; }
  uint64_t len() const { return len_; }
  MemType type() const { return type_; }
  const std::string& tag() const { return tag_; }
  bool read_only() const { return access_ == PeerAccess::kReadOnly; }

 private:
  void Drop();  // forgets the memory's owner (needs the GIL)

  std::shared_ptr<Core> core_;
  MemHandle handle_ = 0;
  const uint64_t addr_, len_;
  const MemType type_;
  const std::string tag_;
  const PeerAccess access_;
  pybind11::object keep_;
  Py_buffer view_{};
  bool has_view_ = false;
};

// Memory from Engine::AllocMem. Host memory offers the buffer protocol (numpy.asarray(buf),
// numpy.frombuffer(buf, dtype)); cuda memory offers __cuda_array_interface__. Freed by free()
// or when the object is collected; free() is refused while views of it are alive.
class PyBuffer {
 public:
  // Holds the Core: an engine whose Python object is gone runs on while its Buffers live.
  PyBuffer(std::shared_ptr<Core> core, void* addr, uint64_t len, MemType type, MemHandle handle,
           std::string tag, PeerAccess access)
      : core_(std::move(core)),
        addr_(addr),
        len_(len),
        type_(type),
        handle_(handle),
        tag_(std::move(tag)),
        access_(access) {}
  ~PyBuffer();
  void Free();
  bool freed() const { return handle_ == 0; }
  uint64_t addr() const { return reinterpret_cast<uint64_t>(addr_); }
  uint64_t len() const { return len_; }
  MemType type() const { return type_; }
  MemHandle handle() const { return handle_; }
  const std::string& tag() const { return tag_; }
  bool read_only() const { return access_ == PeerAccess::kReadOnly; }
  // The buffer protocol's two halves (installed on the Python type by BindMemory).
  static int GetBuffer(PyObject* self, Py_buffer* view, int flags);
  static void ReleaseBuffer(PyObject* self, Py_buffer* view);

 private:
  std::shared_ptr<Core> core_;
  void* addr_;
  const uint64_t len_;
  const MemType type_;
  MemHandle handle_;
  const std::string tag_;
  const PeerAccess access_;
  int views_ = 0;  // under the GIL
};

std::unique_ptr<PyRegion> RegisterRange(const std::shared_ptr<Core>& core, uint64_t addr, uint64_t len,
                                        MemType type, const std::string& tag, PeerAccess access,
                                        pybind11::object keep);
// obj: anything with the buffer protocol, C-contiguous and writable (this engine's READs may
// land in it, whatever peers may do).
std::unique_ptr<PyRegion> RegisterBuffer(const std::shared_ptr<Core>& core, pybind11::handle obj,
                                         const std::string& tag, PeerAccess access);
std::unique_ptr<PyBuffer> Allocate(const std::shared_ptr<Core>& core, uint64_t len, MemType type,
                                   const std::string& tag, const AllocOptions& options);

// Adds Region and Buffer to the module.
void BindMemory(pybind11::module_& m);

}  // namespace xfer::py
