#include "py_errors.h"

#include <pybind11/stl.h>

#include <array>

namespace xfer::py {
namespace pyb = pybind11;
namespace {

constexpr int kCodes = static_cast<int>(kLastStatusCode) + 1;
// Owned references, set once at import and never released (they live as long as the module).
std::array<PyObject*, kCodes> g_classes{};

PyObject* ClassOf(StatusCode code) {
  const int i = static_cast<int>(code);
  PyObject* cls = i >= 0 && i < kCodes ? g_classes[i] : nullptr;
  return cls != nullptr ? cls : PyExc_RuntimeError;
}

}  // namespace

void SetErrorClasses(const pyb::dict& by_name) {
  for (int i = 1; i < kCodes; ++i) {
    const auto name = std::string(StatusCodeName(static_cast<StatusCode>(i)));
    if (!by_name.contains(name)) throw pyb::key_error("no exception class for status " + name);
    pyb::object cls = by_name[pyb::str(name)];
    Py_XDECREF(g_classes[i]);
    g_classes[i] = cls.release().ptr();
  }
}

void Raise(const Status& st, const std::vector<uint64_t>* landed) {
  pyb::handle cls = ClassOf(st.code());
  pyb::object error = cls(st.message(), std::string(StatusCodeName(st.code())),
                          landed != nullptr ? pyb::cast(*landed) : pyb::list());
  PyErr_SetObject(cls.ptr(), error.ptr());
  throw pyb::error_already_set();
}

void RaiseInvalid(const std::string& why) { Raise(Status(StatusCode::kInvalidArgument, why)); }

}  // namespace xfer::py
