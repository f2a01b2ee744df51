// xfer._xfer: the extension module behind the Python package xfer (python/xfer/__init__.py
// adds the Pythonic layer: register() of numpy arrays and tensors, context manager, asyncio).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "py_engine.h"
#include "py_errors.h"
#include "py_memory.h"
#include "py_options.h"
#include "xfer/engine.h"
#include "xfer/version.h"

PYBIND11_MODULE(_xfer, m) {
  namespace pyb = pybind11;
  m.doc() = "xfer's C++ engine (use the package xfer, not this module)";
  m.attr("version") = std::string(xfer::Version());
  m.def("_set_error_classes", &xfer::py::SetErrorClasses);
  m.def(
      "option_names", [] { return xfer::py::OptionNames(); },
      "The keyword options Engine(name, **options) accepts.");
  pyb::class_<xfer::TransportState>(m, "TransportState", "A backend as an engine here would start it.")
      .def_readonly("name", &xfer::TransportState::name)
      .def_readonly("available", &xfer::TransportState::available)
      .def_readonly("why_not", &xfer::TransportState::why_not, "why it is not available")
      .def_readonly("about", &xfer::TransportState::about, "what it moves and what it found")
      .def("__repr__", [](const xfer::TransportState& t) {
        return "TransportState(" + t.name +
               (t.available ? ", available)" : ", unavailable: " + t.why_not + ")");
      });
  m.def(
      "transports",
      [](const pyb::kwargs& options) {
        std::chrono::milliseconds unused_timeout{};
        const xfer::EngineOptions o = xfer::py::ParseOptions(options, &unused_timeout);
        std::vector<xfer::TransportState> out;
        pyb::gil_scoped_release unlocked;  // (starting the backends probes devices: CUDA, UCX)
        // (Its status says whether an Engine would start; each state says why not already.)
        xfer::DescribeTransports(o, &out);
        return out;
      },
      "Every transport of this build as an Engine(**options) here would start it (best first).");
  xfer::py::BindMemory(m);
  xfer::py::BindEngine(m);
}
