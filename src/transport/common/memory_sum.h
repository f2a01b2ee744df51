// Checksums (util/checksum.h) of memory this process can address, host or GPU memory alike,
// for end-to-end checksums (docs/notifications.md, "Checksums"). Host memory is summed where
// it is. GPU memory cannot be read by the CPU: it is copied to host memory in chunks of 1 MiB
// through two page-locked buffers of the calling thread (made on its first such sum, kept until
// it exits), each chunk summed while the copy engines copy the next, so that it costs a pass of
// the copy engines and one of the CPU over the bytes. The copies go on the thread's side lane
// (cuda::StartSideCopy): a batch's copy the thread has started may still run meanwhile.
#pragma once

#include <cstdint>

#include "util/checksum.h"
#include "xfer/status.h"

namespace xfer::transport {

// Whether addr is GPU memory (never in a build without CUDA, nor on a machine without a GPU).
bool IsGpuMemory(uint64_t addr);

// Adds the n bytes at addr (gpu: GPU memory, IsGpuMemory's answer) to sum; with GPU memory,
// fails when a copy fails (then sum is of no use). Copies are waited out, however long they take
// (as every copy of this engine's: memory must not go while one runs).
Status SumMemory(uint64_t addr, uint64_t n, bool gpu, checksum::Running* sum);
// The checksum of the n bytes at addr, as SumMemory gives it.
Status ChecksumOf(uint64_t addr, uint64_t n, bool gpu, uint64_t* out);

// The checksum tests' hook (LocalEngine::corrupt_landed): flips the bits of the byte at addr.
Status FlipByte(uint64_t addr, bool gpu);

}  // namespace xfer::transport
