#include "py_memory.h"

#include <cstdio>

#include "py_errors.h"

namespace xfer::py {
namespace pyb = pybind11;

MemType ParseKind(const std::string& kind) {
  if (kind == "host" || kind == "cpu") return MemType::kHost;
  if (kind == "cuda" || kind == "gpu") return MemType::kCuda;
  RaiseInvalid("memory kind must be \"host\" or \"cuda\", not \"" + kind + "\"");
}

PyRegion::PyRegion(std::shared_ptr<Core> core, uint64_t addr, uint64_t len, MemType type, std::string tag,
                   PeerAccess access, pyb::object keep, Py_buffer* view)
    : core_(std::move(core)),
      addr_(addr),
      len_(len),
      type_(type),
      tag_(std::move(tag)),
      access_(access),
      keep_(std::move(keep)) {
  if (view != nullptr) {
    view_ = *view;
    has_view_ = true;
  }
  const Status st = core_->Call([&](Engine& e) {
    return e.RegisterMem(reinterpret_cast<void*>(addr_), len_, type_, &handle_, tag_, access_);
  });
  if (!st.ok()) {
    Drop();
    Raise(st);
  }
}

PyRegion::~PyRegion() {
  if (handle_ != 0 && !core_->closing) {
    const MemHandle h = handle_;
    (void)core_->Call([&](Engine& e) { return e.DeregisterMem(h); });
  }
  handle_ = 0;
  Drop();
  pyb::gil_scoped_release nogil;  // (the last holder of the Core finalizes the engine)
  core_.reset();
}

void PyRegion::Drop() {
  if (has_view_) PyBuffer_Release(&view_);
  has_view_ = false;
  keep_ = pyb::object();
}

void PyRegion::Deregister() {
  if (handle_ == 0) return;
  const MemHandle h = handle_;
  handle_ = 0;  // (with the GIL: another thread's deregister() now does nothing)
  const Status st = core_->Call([&](Engine& e) { return e.DeregisterMem(h); });
  if (!st.ok()) {
    if (!core_->closing) {
      handle_ = h;
      Raise(st);
    }
    if (!core_->closed) return;  // closing: Finalize releases the region; keep its memory till then
  }
  Drop();
}

std::unique_ptr<PyRegion> RegisterRange(const std::shared_ptr<Core>& core, uint64_t addr, uint64_t len,
                                        MemType type, const std::string& tag, PeerAccess access,
                                        pyb::object keep) {
  return std::make_unique<PyRegion>(core, addr, len, type, tag, access, std::move(keep), nullptr);
}

std::unique_ptr<PyRegion> RegisterBuffer(const std::shared_ptr<Core>& core, pyb::handle obj,
                                         const std::string& tag, PeerAccess access) {
  Py_buffer view;
  if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) != 0) {
    pyb::error_already_set why;  // e.g. "buffer is not writable", "not C-contiguous"
    RaiseInvalid("cannot register this buffer: " + std::string(pyb::str(why.value())) +
                 " (registered memory must be writable and contiguous)");
  }
  return std::make_unique<PyRegion>(core, reinterpret_cast<uint64_t>(view.buf),
                                    static_cast<uint64_t>(view.len), MemType::kHost, tag, access,
                                    pyb::reinterpret_borrow<pyb::object>(obj), &view);
}

std::unique_ptr<PyBuffer> Allocate(const std::shared_ptr<Core>& core, uint64_t len, MemType type,
                                   const std::string& tag, const AllocOptions& options) {
  void* addr = nullptr;
  MemHandle handle = 0;
  Check(core->Call([&](Engine& e) { return e.AllocMem(len, type, &addr, &handle, tag, options); }));
  return std::make_unique<PyBuffer>(core, addr, len, type, handle, tag, options.access);
}

PyBuffer::~PyBuffer() {
  if (handle_ != 0) {
    const MemHandle h = handle_;
    handle_ = 0;
    (void)core_->Call([&](Engine& e) { return e.FreeMem(h); });  // closed: Finalize freed it
  }
  pyb::gil_scoped_release nogil;  // (the last holder of the Core finalizes the engine)
  core_.reset();
}

void PyBuffer::Free() {
  if (handle_ == 0) return;
  if (views_ > 0) {
    throw pyb::buffer_error("cannot free a buffer while " + std::to_string(views_) +
                            " view(s) of it are alive (del them first)");
  }
  const MemHandle h = handle_;
  handle_ = 0;  // (with the GIL: from here on no view can be taken)
  const Status st = core_->Call([&](Engine& e) { return e.FreeMem(h); });
  if (!st.ok() && !core_->closing) Raise(st);  // (closed: Finalize freed it)
}

int PyBuffer::GetBuffer(PyObject* self, Py_buffer* view, int flags) {
  PyBuffer* b = nullptr;
  try {
    b = pyb::handle(self).cast<PyBuffer*>();
  } catch (const std::exception&) {
    PyErr_SetString(PyExc_BufferError, "not an xfer.Buffer");
    return -1;
  }
  if (b->handle_ == 0 || b->core_->closing) {
    PyErr_SetString(PyExc_BufferError, "this xfer.Buffer was freed (or its engine closed)");
    return -1;
  }
  if (b->type_ != MemType::kHost) {
    PyErr_SetString(PyExc_BufferError,
                    "GPU memory has no buffer protocol: use __cuda_array_interface__ (e.g. "
                    "cupy.asarray or torch.as_tensor)");
    return -1;
  }
  if (PyBuffer_FillInfo(view, self, b->addr_, static_cast<Py_ssize_t>(b->len_), 0, flags) != 0) {
    return -1;
  }
  ++b->views_;
  ++b->core_->buffer_views;
  return 0;
}

void PyBuffer::ReleaseBuffer(PyObject* self, Py_buffer*) {
  auto* b = pyb::handle(self).cast<PyBuffer*>();
  --b->views_;
  --b->core_->buffer_views;
}

std::string MemoryRepr(std::string_view cls, MemType type, uint64_t addr, uint64_t len,
                       const std::string& tag, std::string_view state) {
  char a[24];
  std::snprintf(a, sizeof a, "%llx", static_cast<unsigned long long>(addr));
  return "<xfer." + std::string(cls) + " " + std::string(MemTypeName(type)) + " addr=0x" + a +
         " len=" + std::to_string(len) + (tag.empty() ? "" : " tag=" + tag) +
         (state.empty() ? "" : " " + std::string(state)) + ">";
}

namespace {

// What a Region and a Buffer both show: addr, len, kind, tag, read_only, handle, len().
template <class T>
void DefMemoryFields(pyb::class_<T>& cls) {
  cls.def_property_readonly("addr", &T::addr)
      .def_property_readonly("len", &T::len)
      .def_property_readonly("kind", [](const T& t) { return std::string(MemTypeName(t.type())); })
      .def_property_readonly("tag", &T::tag)
      .def_property_readonly("read_only", &T::read_only, "peers may READ it but not WRITE it")
      .def_property_readonly("handle", &T::handle)
      .def("__len__", &T::len);
}

}  // namespace

void BindMemory(pyb::module_& m) {
  pyb::class_<PyRegion> region(m, "Region", R"(Memory the caller owns, registered with Engine.register.

Peers may READ [addr, addr + len), and WRITE it unless read_only, until deregister(). The Region
keeps the object that owns the memory alive until then.)");
  DefMemoryFields(region);
  region.def_property_readonly("registered", &PyRegion::registered)
      .def("deregister", &PyRegion::Deregister,
           "Waits until connected peers stopped using it, then forgets it (twice: nothing).")
      .def("__repr__", [](const PyRegion& r) {
        return MemoryRepr("Region", r.type(), r.addr(), r.len(), r.tag(),
                          !r.registered() ? "deregistered"
                          : r.read_only() ? "read-only"
                                          : "");
      });

  pyb::class_<PyBuffer> buffer(m, "Buffer", pyb::buffer_protocol(), R"(Memory allocated by Engine.alloc.

Host memory reads and writes as a numpy array without a copy: numpy.asarray(buf) (bytes) or
numpy.frombuffer(buf, dtype). Freed by free() or when the Buffer is collected.)");
  DefMemoryFields(buffer);
  buffer.def_property_readonly("freed", &PyBuffer::freed)
      .def("free", &PyBuffer::Free,
           "Deregisters and frees the memory (peers' transfers to it then fail). Refused "
           "(BufferError) while views of it are alive.")
      .def_property_readonly("__cuda_array_interface__",
                             [](const PyBuffer& b) -> pyb::object {
                               if (b.type() != MemType::kCuda)
                                 throw pyb::attribute_error("host memory: use the buffer protocol");
                               pyb::dict d;
                               d["shape"] = pyb::make_tuple(b.len());
                               d["typestr"] = "|u1";
                               d["data"] = pyb::make_tuple(b.addr(), false);
                               d["version"] = 3;
                               d["strides"] = pyb::none();
                               return std::move(d);
                             })
      .def("__repr__", [](const PyBuffer& b) {
        return MemoryRepr("Buffer", b.type(), b.addr(), b.len(), b.tag(),
                          b.freed()       ? "freed"
                          : b.read_only() ? "read-only"
                                          : "");
      });
  auto* type = reinterpret_cast<PyTypeObject*>(buffer.ptr());
  type->tp_as_buffer->bf_getbuffer = &PyBuffer::GetBuffer;
  type->tp_as_buffer->bf_releasebuffer = &PyBuffer::ReleaseBuffer;
}

}  // namespace xfer::py
