// Python keyword options → EngineOptions, and Python timeouts (seconds) → milliseconds.
#pragma once
#include <pybind11/pybind11.h>
#include <chrono>
#include "xfer/options.h"

namespace xfer::py {

// The engine's options from Engine(name, **options): flat names, times in seconds, e.g.
// heartbeat_timeout=3.0, tcp_links=4, ucx_mode="on", notify_max_message_bytes=65536.
// "timeout" (not an EngineOptions field) sets *default_timeout, the timeout of calls that are
// given none. An unknown name or a wrong type raises InvalidArgumentError naming it.
EngineOptions ParseOptions(const pybind11::dict& options, std::chrono::milliseconds* default_timeout);
// seconds (int or float, >= 0) or None (→ fallback).
std::chrono::milliseconds ToTimeout(pybind11::handle seconds, std::chrono::milliseconds fallback);
// The names ParseOptions accepts, for help text and errors.
std::string OptionNames();

}  // namespace xfer::py
