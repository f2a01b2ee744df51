// Python descriptors → std::vector<TransferDesc>, without a Python-level loop.
#pragma once
#include <pybind11/pybind11.h>
#include <vector>
#include "xfer/types.h"

namespace xfer::py {

// Either descs: a sequence of (local_addr, remote_addr, len) triples, or an integer array of
// shape (N, 3); or three columns local, remote, length: each a 1-D integer array (numpy or
// anything with the buffer protocol) or a sequence of ints, of one length N; length may also be
// one int for every descriptor. Bad input raises InvalidArgumentError naming the element.
std::vector<TransferDesc> ToDescs(pybind11::handle descs, pybind11::handle local, pybind11::handle remote,
                                  pybind11::handle length);

// Ranges of a prepared list: addr a 1-D integer array or a sequence of ints; length the same,
// or one int for every range.
std::vector<MemRange> ToRanges(pybind11::handle addr, pybind11::handle length);
// Indices into a prepared list: a 1-D integer array or a sequence of ints (what: its name in
// errors); a value past 2**32-1 raises InvalidArgumentError.
std::vector<uint32_t> ToIndices(pybind11::handle index, const char* what);

}  // namespace xfer::py
