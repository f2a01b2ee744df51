// The checksum's digests are part of the wire (wire::Digest answers, tcp.checksum's frames):
// every build must give the same ones, whichever code libxxhash runs (scalar, SSE2, the AVX2
// its x86 dispatch picks: AVX2, AVX-512). The expected values come from XXH3-64's scalar reference code.
#include "util/checksum.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace {

std::vector<unsigned char> Pattern(size_t n) {
  std::vector<unsigned char> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>(i * 7 % 251);
  return b;
}

TEST(Checksum, DigestsAreXxh3OnEveryBuild) {
  if (!xfer::checksum::Available()) GTEST_SKIP() << "built without libxxhash";
  const std::pair<size_t, uint64_t> known[] = {{0, 0x2d06800538d394c2ull},
                                               {3, 0xc3489259e968ad9eull},
                                               {200, 0xd12016b53c9565baull},
                                               {4096, 0x5d9027c84d5f33f7ull},
                                               {1048581, 0x07941fe6707594e6ull}};
  for (const auto& [n, digest] : known) {
    const auto bytes = Pattern(n);
    EXPECT_EQ(xfer::checksum::Of(bytes.data(), n), digest) << n << " bytes";
    xfer::checksum::Running running;  // the same digest from pieces of uneven sizes
    for (size_t at = 0, step = 1; at < n; at += step, step = step * 3 + 1)
      running.Add(bytes.data() + at, std::min(step, n - at));
    EXPECT_EQ(running.Value(), digest) << n << " bytes in pieces";
  }
}

}  // namespace
