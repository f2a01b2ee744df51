// The library's version, as "major.minor.patch". It is written in one place, CMakeLists.txt's
// project(VERSION); xfer-info, xfer-bench and the Python package (xfer.__version__) report it.
#pragma once

#include <string_view>

namespace xfer {

std::string_view Version();

}  // namespace xfer
