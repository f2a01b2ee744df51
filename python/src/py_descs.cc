#include "py_descs.h"

#include <cstring>
#include <optional>
#include <string>

#include "py_errors.h"

namespace xfer::py {
namespace pyb = pybind11;
namespace {

// A Python int (or anything with __index__, such as numpy.int64) as an unsigned 64-bit value.
uint64_t ToU64(PyObject* o, const char* what, size_t i) {
  PyObject* index = PyBool_Check(o) ? nullptr : PyLong_Check(o) ? (Py_INCREF(o), o) : PyNumber_Index(o);
  if (index == nullptr) {
    PyErr_Clear();
    RaiseInvalid(std::string(what) + "[" + std::to_string(i) + "] is not an integer");
  }
  const unsigned long long v = PyLong_AsUnsignedLongLong(index);
  Py_DECREF(index);
  if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    RaiseInvalid(std::string(what) + "[" + std::to_string(i) + "] is out of range (0 .. 2**64-1)");
  }
  return v;
}

// A held buffer of integers: 1-D (one column) or 2-D with 3 columns (triples).
class IntArray {
 public:
  ~IntArray() {
    if (held_) PyBuffer_Release(&view_);
  }
  // False (no error) when obj has no buffer protocol.
  bool Open(PyObject* obj, const char* what) {
    if (!PyObject_CheckBuffer(obj)) return false;
    if (PyObject_GetBuffer(obj, &view_, PyBUF_FORMAT | PyBUF_STRIDES) != 0) {
      PyErr_Clear();
      RaiseInvalid(std::string(what) + ": its buffer cannot be read");
    }
    held_ = true;
    what_ = what;
    const char* f = view_.format != nullptr ? view_.format : "B";
    if (*f == '@' || *f == '=' || *f == '<' || *f == '!' || *f == '>') {
      if (*f == '>' || *f == '!') RaiseInvalid(std::string(what) + ": big-endian integers");
      ++f;
    }
    if (f[0] == '\0' || f[1] != '\0' || std::strchr("bBhHiIlLqQnN", f[0]) == nullptr) {
      RaiseInvalid(std::string(what) + " must hold integers (got buffer format '" +
                   std::string(view_.format != nullptr ? view_.format : "") + "')");
    }
    signed_ = std::strchr("bhilqn", f[0]) != nullptr;
    return true;
  }
  int ndim() const { return view_.ndim; }
  // The values as contiguous 64-bit integers, when they are (numpy's uint64/int64 arrays, the
  // common case): the caller reads them directly (and checks the sign of signed ones).
  const uint64_t* Contiguous64() const {
    const bool contiguous = view_.ndim == 1 && view_.strides[0] == 8 && view_.itemsize == 8;
    return contiguous ? static_cast<const uint64_t*>(view_.buf) : nullptr;
  }
  bool is_signed() const { return signed_; }
  Py_ssize_t rows() const { return view_.ndim == 0 ? 1 : view_.shape[0]; }
  Py_ssize_t cols() const { return view_.ndim == 2 ? view_.shape[1] : 1; }
  uint64_t At(Py_ssize_t row, Py_ssize_t col = 0) const {
    const char* p = static_cast<const char*>(view_.buf);
    if (view_.ndim >= 1) p += row * view_.strides[0];
    if (view_.ndim == 2) p += col * view_.strides[1];
    int64_t s = 0;
    uint64_t u = 0;
    switch (view_.itemsize) {
      case 1:
        signed_ ? s = *reinterpret_cast<const int8_t*>(p) : u = *reinterpret_cast<const uint8_t*>(p);
        break;
      case 2:
        signed_ ? s = *reinterpret_cast<const int16_t*>(p) : u = *reinterpret_cast<const uint16_t*>(p);
        break;
      case 4:
        signed_ ? s = *reinterpret_cast<const int32_t*>(p) : u = *reinterpret_cast<const uint32_t*>(p);
        break;
      case 8:
        signed_ ? s = *reinterpret_cast<const int64_t*>(p) : u = *reinterpret_cast<const uint64_t*>(p);
        break;
      default:
        RaiseInvalid(std::string(what_) + ": integers of " + std::to_string(view_.itemsize) + " bytes");
    }
    if (!signed_) return u;
    if (s < 0) RaiseInvalid(std::string(what_) + "[" + std::to_string(row) + "] is negative");
    return static_cast<uint64_t>(s);
  }

 private:
  Py_buffer view_{};
  bool held_ = false;
  bool signed_ = false;
  const char* what_ = "";
};

// One column: an int array, a sequence of ints, or (for length) one int for all.
class Column {
 public:
  Column(pyb::handle obj, const char* what, bool scalar_ok) : what_(what) {
    if (scalar_ok && (PyLong_Check(obj.ptr()) || PyIndex_Check(obj.ptr()) || PyBool_Check(obj.ptr())) &&
        !PyObject_CheckBuffer(obj.ptr())) {
      scalar_ = ToU64(obj.ptr(), what, 0);
      return;
    }
    if (array_.Open(obj.ptr(), what)) {
      if (scalar_ok && array_.ndim() == 0) {  // a numpy integer scalar
        scalar_ = array_.At(0);
        return;
      }
      if (array_.ndim() != 1) RaiseInvalid(std::string(what) + " must be 1-D");
      size_ = array_.rows();
      is_array_ = true;
      return;
    }
    seq_ = pyb::reinterpret_steal<pyb::object>(PySequence_Fast(obj.ptr(), ""));
    if (!seq_) {
      PyErr_Clear();
      RaiseInvalid(std::string(what) + " must be an integer array or a sequence of integers");
    }
    size_ = PySequence_Fast_GET_SIZE(seq_.ptr());
  }
  std::optional<Py_ssize_t> size() const { return scalar_ ? std::nullopt : std::optional<Py_ssize_t>(size_); }
  // Contiguous 64-bit values (IntArray::Contiguous64), or null.
  const uint64_t* contiguous() const { return is_array_ ? array_.Contiguous64() : nullptr; }
  bool is_signed() const { return array_.is_signed(); }
  const char* what() const { return what_; }
  uint64_t operator[](Py_ssize_t i) const {
    if (scalar_) return *scalar_;
    if (is_array_) return array_.At(i);
    return ToU64(PySequence_Fast_GET_ITEM(seq_.ptr(), i), what_, i);
  }

 private:
  const char* what_;
  std::optional<uint64_t> scalar_;
  IntArray array_;
  bool is_array_ = false;
  pyb::object seq_;
  Py_ssize_t size_ = 0;
};

std::vector<TransferDesc> FromTriples(pyb::handle descs) {
  std::vector<TransferDesc> out;
  IntArray array;
  if (array.Open(descs.ptr(), "descs")) {
    if (array.ndim() != 2 || array.cols() != 3) RaiseInvalid("a descs array must have shape (N, 3)");
    out.resize(array.rows());
    for (Py_ssize_t i = 0; i < array.rows(); ++i) {
      out[i] = {array.At(i, 0), array.At(i, 1), array.At(i, 2)};
    }
    return out;
  }
  pyb::object seq = pyb::reinterpret_steal<pyb::object>(PySequence_Fast(descs.ptr(), ""));
  if (!seq) {
    PyErr_Clear();
    RaiseInvalid("descs must be a sequence of (local_addr, remote_addr, len) or an (N, 3) array");
  }
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
  out.resize(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PySequence_Fast_GET_ITEM(seq.ptr(), i);
    PyObject* a[3];
    if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 3) {
      for (int k = 0; k < 3; ++k) a[k] = PyTuple_GET_ITEM(item, k);
    } else if (PyList_Check(item) && PyList_GET_SIZE(item) == 3) {
      for (int k = 0; k < 3; ++k) a[k] = PyList_GET_ITEM(item, k);
    } else {
      RaiseInvalid("descs[" + std::to_string(i) + "] is not a (local_addr, remote_addr, len) triple");
    }
    out[i] = {ToU64(a[0], "local_addr of descs", i), ToU64(a[1], "remote_addr of descs", i),
              ToU64(a[2], "len of descs", i)};
  }
  return out;
}

std::vector<TransferDesc> FromColumns(pyb::handle local, pyb::handle remote, pyb::handle length) {
  const Column l(local, "local", false), r(remote, "remote", false), n(length, "length", true);
  if (*l.size() != *r.size() || (n.size() && *n.size() != *l.size())) {
    RaiseInvalid("local, remote and length differ in length (" + std::to_string(*l.size()) + ", " +
                 std::to_string(*r.size()) + ", " +
                 (n.size() ? std::to_string(*n.size()) : std::string("one int")) + ")");
  }
  std::vector<TransferDesc> out(*l.size());
  const uint64_t *lp = l.contiguous(), *rp = r.contiguous(), *np = n.contiguous();
  if (lp != nullptr && rp != nullptr && (np != nullptr || !n.size())) {  // the fast path
    const uint64_t len = np == nullptr ? n[0] : 0;
    uint64_t top = 0;  // the sign bits of signed columns, or-ed
    for (Py_ssize_t i = 0; i < *l.size(); ++i) {
      out[i] = {lp[i], rp[i], np != nullptr ? np[i] : len};
      top |= (l.is_signed() ? lp[i] : 0) | (r.is_signed() ? rp[i] : 0) |
             (np != nullptr && n.is_signed() ? np[i] : 0);
    }
    if ((top >> 63) == 0) return out;
    // A negative value somewhere: the slow path names it.
  }
  for (Py_ssize_t i = 0; i < *l.size(); ++i) out[i] = {l[i], r[i], n[i]};
  return out;
}

}  // namespace

std::vector<MemRange> ToRanges(pyb::handle addr, pyb::handle length) {
  const Column a(addr, "addr", false), n(length, "length", true);
  if (n.size() && *n.size() != *a.size()) {
    RaiseInvalid("addr and length differ in length (" + std::to_string(*a.size()) + ", " +
                 std::to_string(*n.size()) + ")");
  }
  std::vector<MemRange> out(*a.size());
  for (Py_ssize_t i = 0; i < *a.size(); ++i) out[i] = {a[i], n[i]};
  return out;
}

std::vector<uint32_t> ToIndices(pyb::handle index, const char* what) {
  const Column c(index, what, false);
  std::vector<uint32_t> out(*c.size());
  const uint64_t* p = c.contiguous();
  uint64_t top = 0;    // every value or-ed: past 2**32-1 (or negative) when its top half is set
  if (p != nullptr) {  // the fast path: numpy int64/uint64
    for (Py_ssize_t i = 0; i < *c.size(); ++i) {
      out[i] = static_cast<uint32_t>(p[i]);
      top |= p[i];
    }
    if ((top >> 32) == 0) return out;
  }
  for (Py_ssize_t i = 0; i < *c.size(); ++i) {  // (names the bad value)
    const uint64_t v = c[i];
    if (v > UINT32_MAX) {
      RaiseInvalid(std::string(what) + "[" + std::to_string(i) + "] = " + std::to_string(v) +
                   " is past the largest list index (2**32-1)");
    }
    out[i] = static_cast<uint32_t>(v);
  }
  return out;
}

std::vector<TransferDesc> ToDescs(pyb::handle descs, pyb::handle local, pyb::handle remote,
                                  pyb::handle length) {
  const bool columns = !local.is_none() || !remote.is_none() || !length.is_none();
  if (!descs.is_none()) {
    if (columns) RaiseInvalid("give descs, or local=, remote= and length=, not both");
    return FromTriples(descs);
  }
  if (local.is_none() || remote.is_none() || length.is_none()) {
    RaiseInvalid("give descs, or all three of local=, remote= and length=");
  }
  return FromColumns(local, remote, length);
}

}  // namespace xfer::py
