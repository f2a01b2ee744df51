// Little-endian fields in a byte string: the opaque blobs that backends put in hellos and
// region records. A reader checks every length before it reads.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

namespace xfer::bytes {

template <class T>
void Put(std::string* out, T v) {
  static_assert(std::is_trivially_copyable_v<T>);
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // x86-64 and aarch64 Linux are little-endian, as the format is
  out->append(b, sizeof(T));
}

// Reads a T from the front of *in and drops it; false (nothing read) when too short.
template <class T>
bool Take(std::string_view* in, T* v) {
  static_assert(std::is_trivially_copyable_v<T>);
  if (in->size() < sizeof(T)) return false;
  std::memcpy(v, in->data(), sizeof(T));
  in->remove_prefix(sizeof(T));
  return true;
}

}  // namespace xfer::bytes
