// Address ranges.
#pragma once

#include <cstdint>

namespace xfer {

// Whether [addr, addr + len) lies inside [begin, begin + size), checked without computing an
// end that could wrap past the end of the address space.
constexpr bool RangeInside(uint64_t addr, uint64_t len, uint64_t begin, uint64_t size) {
  return addr >= begin && addr - begin <= size && len <= size - (addr - begin);
}

}  // namespace xfer
