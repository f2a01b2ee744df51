// The in-process copies behind the local transport and shm: every alignment and length.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "transport/common/host_copy.h"

namespace xfer::transport {
namespace {

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 131 + seed);
  return v;
}

TEST(StreamingCopy, EveryAlignmentAndTailLeavesNeighboursAlone) {
  const std::vector<uint8_t> src = Pattern(70000, 3);
  for (size_t dst_off = 0; dst_off < 32; ++dst_off) {
    for (size_t src_off : {size_t{0}, size_t{1}, size_t{15}, size_t{64}}) {
      for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{63}, size_t{64}, size_t{65},
                       size_t{4096 + 17}, size_t{65536}}) {
        std::vector<uint8_t> dst(n + 64, 0xee);
        StreamingCopy(dst.data() + dst_off, src.data() + src_off, n);
        ASSERT_EQ(std::memcmp(dst.data() + dst_off, src.data() + src_off, n), 0)
            << dst_off << " " << src_off << " " << n;
        for (size_t i = 0; i < dst_off; ++i) ASSERT_EQ(dst[i], 0xee);
        for (size_t i = dst_off + n; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xee);
      }
    }
  }
}

TEST(CopyInProcess, BothDirectionsStreamingOrNotAndOverlap) {
  for (bool streaming : {false, true}) {
    std::vector<uint8_t> local = Pattern(10000, 1), remote(10000, 0);
    const auto L = reinterpret_cast<uint64_t>(local.data());
    const auto R = reinterpret_cast<uint64_t>(remote.data());
    CopyInProcess(Op::kWrite, std::vector<Slice>{{L, R + 5, 3000}, {L + 3000, R + 4000, 5000}}, streaming);
    EXPECT_EQ(std::memcmp(remote.data() + 5, local.data(), 3000), 0);
    EXPECT_EQ(std::memcmp(remote.data() + 4000, local.data() + 3000, 5000), 0);
    std::vector<uint8_t> back(10000, 0);
    CopyInProcess(Op::kRead, std::vector<Slice>{{reinterpret_cast<uint64_t>(back.data()), R + 5, 3000}},
                  streaming);
    EXPECT_EQ(std::memcmp(back.data(), local.data(), 3000), 0);
    // Overlapping ranges (one process) behave as memmove.
    std::vector<uint8_t> buf = Pattern(4096, 9), want = buf;
    std::memmove(want.data() + 100, want.data(), 2000);
    const auto B = reinterpret_cast<uint64_t>(buf.data());
    CopyInProcess(Op::kWrite, std::vector<Slice>{{B, B + 100, 2000}}, streaming);
    EXPECT_EQ(buf, want);
  }
}

}  // namespace
}  // namespace xfer::transport
