// xfer._xfer: the extension module behind the Python package xfer (python/xfer/__init__.py
// adds the Pythonic layer: register() of numpy arrays and tensors, context manager, asyncio).
#include <pybind11/pybind11.h>

#include "py_engine.h"
#include "py_errors.h"
#include "py_memory.h"
#include "py_options.h"

PYBIND11_MODULE(_xfer, m) {
  namespace pyb = pybind11;
  m.doc() = "xfer's C++ engine (use the package xfer, not this module)";
  m.def("_set_error_classes", &xfer::py::SetErrorClasses);
  m.def(
      "option_names", [] { return xfer::py::OptionNames(); },
      "The keyword options Engine(name, **options) accepts.");
  xfer::py::BindMemory(m);
  xfer::py::BindEngine(m);
}
