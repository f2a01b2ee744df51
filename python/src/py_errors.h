// Status → Python exception. The classes live in xfer/_errors.py (one per StatusCode, with the
// builtin base a Python user expects); the package hands them over at import.
#pragma once
#include <pybind11/pybind11.h>
#include <string>
#include <vector>
#include "xfer/status.h"

namespace xfer::py {

// by_name: StatusCode name (e.g. "TIMEOUT") → exception class.
void SetErrorClasses(const pybind11::dict& by_name);
// Raises the exception of st's code (st must not be ok) with st's message; landed, when given,
// becomes the exception's .landed (the descriptors that landed whole). Needs the GIL.
[[noreturn]] void Raise(const Status& st, const std::vector<uint64_t>* landed = nullptr);
inline void Check(const Status& st) {
  if (!st.ok()) Raise(st);
}
// Bad input caught by the binding itself: InvalidArgumentError(why).
[[noreturn]] void RaiseInvalid(const std::string& why);

}  // namespace xfer::py
