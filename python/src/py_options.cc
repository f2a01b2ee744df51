#include "py_options.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "py_errors.h"

namespace xfer::py {
namespace pyb = pybind11;
namespace {

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
  auto index =
      PyBool_Check(v.ptr()) ? pyb::object() : pyb::reinterpret_steal<pyb::object>(PyNumber_Index(v.ptr()));
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

// Python's name of an option: its key with '_' for '.' ("tcp_links" for "tcp.links").
std::string PythonName(std::string_view key) {
  std::string n(key);
  std::replace(n.begin(), n.end(), '.', '_');
  return n;
}

// A number of seconds as text SetOption reads ("0.000050000 s": to the nanosecond, no
// exponent), which takes it to the field's own unit (to the nearest).
std::string SecondsText(double s) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9f s", s);
  return b;
}

// The text SetOption takes for a Python value of an option of that kind; raises
// InvalidArgumentError naming the option when the value is of another type.
std::string TextOf(OptionKind kind, pyb::handle v, const std::string& name) {
  switch (kind) {
    case OptionKind::kBool:
      return Bool(v, name) ? "true" : "false";
    case OptionKind::kCount:
    case OptionKind::kBytes:
      return std::to_string(Integer<int64_t>(v, name));
    case OptionKind::kDuration:
      return SecondsText(Seconds(v, name));
    case OptionKind::kList: {
      std::string joined;
      for (const std::string& item : TextList(v, name)) joined += (joined.empty() ? "" : ",") + item;
      return joined;
    }
    case OptionKind::kSecret:
      if (!PyBytes_Check(v.ptr()) && !PyUnicode_Check(v.ptr())) RaiseInvalid(name + " must be bytes or str");
      return v.cast<std::string>();
    case OptionKind::kText:
    case OptionKind::kChoice:
      return Text(v, name);
  }
  RaiseInvalid(name + ": an option of an unknown kind");
}

// The engine's options by their Python names (DescribeOptions: one row each).
const std::map<std::string, OptionInfo>& Options() {
  static const std::map<std::string, OptionInfo> options = [] {
    std::map<std::string, OptionInfo> m;
    for (OptionInfo& info : DescribeOptions()) m.emplace(PythonName(info.key), std::move(info));
    return m;
  }();
  return options;
}

}  // namespace

std::string OptionNames() {
  std::string names = "timeout";
  for (const auto& [name, info] : Options()) names += ", " + name;
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
    const auto it = Options().find(name);
    if (it == Options().end()) {
      RaiseInvalid("unknown engine option \"" + name + "\" (known: " + OptionNames() + ")");
    }
    const Status set = SetOption(&o, it->second.key, TextOf(it->second.kind, value, name));
    if (!set.ok()) {
      // (The option's Python name in place of its key: the text is the caller's value.)
      std::string why = set.message();
      if (why.rfind(it->second.key, 0) == 0) why = name + why.substr(it->second.key.size());
      RaiseInvalid(why);
    }
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
