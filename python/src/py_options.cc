#include "py_options.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "py_errors.h"

namespace xfer::py {
namespace pyb = pybind11;
namespace {

using Setter = std::function<void(EngineOptions&, pyb::handle)>;

double Seconds(pyb::handle v, const std::string& name) {
  // Any real number (int, float, numpy scalars), not a bool.
  if (PyBool_Check(v.ptr())) RaiseInvalid(name + " must be a number of seconds, not a bool");
  const double s = PyFloat_AsDouble(v.ptr());
  if (s == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    RaiseInvalid(name + " must be a number of seconds");
  }
  if (!(s >= 0) || !std::isfinite(s)) RaiseInvalid(name + " must be a finite number of seconds >= 0");
  return s;
}

template <class Int>
Int Integer(pyb::handle v, const std::string& name) {
  // An int or anything with __index__ (numpy integers), not a bool.
  auto index = PyBool_Check(v.ptr()) ? pyb::object() : pyb::reinterpret_steal<pyb::object>(PyNumber_Index(v.ptr()));
  if (!index) {
    PyErr_Clear();
    RaiseInvalid(name + " must be an integer");
  }
  try {
    return index.cast<Int>();
  } catch (const pyb::cast_error&) {
    RaiseInvalid(name + " is out of range");
  }
}

bool Bool(pyb::handle v, const std::string& name) {
  if (!PyBool_Check(v.ptr())) RaiseInvalid(name + " must be True or False");
  return v.cast<bool>();
}

std::string Text(pyb::handle v, const std::string& name) {
  if (!PyUnicode_Check(v.ptr())) RaiseInvalid(name + " must be a string");
  return v.cast<std::string>();
}

// A list of strings: a list or tuple of str, or one str of comma-separated items.
std::vector<std::string> TextList(pyb::handle v, const std::string& name) {
  std::vector<std::string> out;
  if (PyUnicode_Check(v.ptr())) return SplitList(v.cast<std::string>());
  if (!PyList_Check(v.ptr()) && !PyTuple_Check(v.ptr())) RaiseInvalid(name + " must be a list of strings");
  for (pyb::handle item : v) out.push_back(Text(item, name + " items"));
  return out;
}

template <class Rep, class Period>
std::chrono::duration<Rep, Period> Duration(pyb::handle v, const std::string& name) {
  return std::chrono::duration_cast<std::chrono::duration<Rep, Period>>(
      std::chrono::duration<double>(Seconds(v, name)));
}

#define XFER_SECONDS(key, field) \
  {key, [](EngineOptions& o, pyb::handle v) { o.field = Duration<decltype(o.field)::rep, decltype(o.field)::period>(v, key); }}
#define XFER_INT(key, field) \
  {key, [](EngineOptions& o, pyb::handle v) { o.field = Integer<decltype(o.field)>(v, key); }}
#define XFER_BOOL(key, field) {key, [](EngineOptions& o, pyb::handle v) { o.field = Bool(v, key); }}
#define XFER_TEXT(key, field) {key, [](EngineOptions& o, pyb::handle v) { o.field = Text(v, key); }}

const std::map<std::string, Setter>& Setters() {
  static const std::map<std::string, Setter> setters = {
      XFER_SECONDS("heartbeat_interval", heartbeat_interval),
      XFER_SECONDS("heartbeat_timeout", heartbeat_timeout),
      XFER_BOOL("auto_connect", auto_connect),
      XFER_SECONDS("auto_connect_timeout", auto_connect_timeout),
      XFER_INT("streams", streams),
      XFER_INT("slice_bytes", slice_bytes),
      XFER_INT("batch_bytes", batch_bytes),
      XFER_SECONDS("spin", spin),
      {"staging",
       [](EngineOptions& o, pyb::handle v) {
         if (!ParseStaging(Text(v, "staging"), &o.staging)) {
           RaiseInvalid("staging must be \"auto\", \"always\" or \"off\"");
         }
       }},
      XFER_INT("staging_buffers", staging_buffers),
      XFER_INT("staging_buffer_bytes", staging_buffer_bytes),
      XFER_TEXT("transport", transport),
      XFER_TEXT("host_id", host_id),
      {"secret",
       [](EngineOptions& o, pyb::handle v) {
         if (!PyBytes_Check(v.ptr()) && !PyUnicode_Check(v.ptr())) RaiseInvalid("secret must be bytes or str");
         o.secret = v.cast<std::string>();
       }},
      XFER_TEXT("secret_file", secret_file),
      XFER_TEXT("metadata", metadata),
      XFER_TEXT("cluster_name", cluster_name),
      XFER_BOOL("start_without_metadata", start_without_metadata),
      XFER_INT("notify_max_message_bytes", notify.max_message_bytes),
      XFER_INT("notify_queue_messages", notify.queue_messages),
      XFER_INT("max_peer_regions", max_peer_regions),
      XFER_INT("max_unsent_bytes", max_unsent_bytes),
      XFER_INT("max_sessions", max_sessions),
      XFER_INT("notify_queue_bytes", notify.queue_bytes),
      XFER_INT("notify_ring_bytes", notify.ring_bytes),
      XFER_INT("tcp_links", tcp.links),
      XFER_BOOL("tcp_least_loaded", tcp.least_loaded),
      XFER_BOOL("tcp_checksum", tcp.checksum),
      {"tcp_nics", [](EngineOptions& o, pyb::handle v) { o.tcp.nics = TextList(v, "tcp_nics"); }},
      {"ucx_mode",
       [](EngineOptions& o, pyb::handle v) {
         if (!ParseUcxMode(Text(v, "ucx_mode"), &o.ucx.mode)) {
           RaiseInvalid("ucx_mode must be \"auto\", \"on\" or \"off\"");
         }
       }},
      XFER_INT("ucx_endpoints", ucx.endpoints),
      XFER_INT("shm_streaming_copy_bytes", shm.streaming_copy_bytes),
      XFER_BOOL("cuda_pin_host_memory", cuda.pin_host_memory),
      XFER_BOOL("metrics", metrics),
      XFER_TEXT("metrics_listen", metrics_listen),
      XFER_INT("metrics_max_peers", metrics_max_peers),
  };
  return setters;
}

}  // namespace

std::string OptionNames() {
  std::string names = "timeout";
  for (const auto& [name, setter] : Setters()) names += ", " + name;
  return names;
}

EngineOptions ParseOptions(const pyb::dict& options, std::chrono::milliseconds* default_timeout) {
  EngineOptions o;
  for (const auto& [key, value] : options) {
    const auto name = key.cast<std::string>();
    if (name == "timeout") {
      *default_timeout = ToTimeout(value, *default_timeout);
      continue;
    }
    const auto it = Setters().find(name);
    if (it == Setters().end()) {
      RaiseInvalid("unknown engine option \"" + name + "\" (known: " + OptionNames() + ")");
    }
    it->second(o, value);
  }
  return o;
}

std::chrono::milliseconds ToTimeout(pyb::handle seconds, std::chrono::milliseconds fallback) {
  if (seconds.is_none()) return fallback;
  // Rounded up (a timeout of 0.0001 s is 1 ms, not 0, which would fail at once), and at most
  // 30 days (a deadline far enough away to mean "no deadline" without overflowing the clock).
  constexpr double kMaxMs = 30.0 * 24 * 3600 * 1000;
  return std::chrono::milliseconds(
      static_cast<int64_t>(std::min(kMaxMs, std::ceil(Seconds(seconds, "timeout") * 1000))));
}

}  // namespace xfer::py
