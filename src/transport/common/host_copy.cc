#include "transport/common/host_copy.h"

#include <algorithm>
#include <cstring>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace xfer::transport {

void StreamingCopy(void* dst, const void* src, uint64_t n) {
#if defined(__x86_64__)
  auto* d = static_cast<uint8_t*>(dst);
  auto* s = static_cast<const uint8_t*>(src);
  const uint64_t head = std::min<uint64_t>(n, (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15);
  std::memcpy(d, s, head);  // up to the first 16-byte aligned destination address
  d += head;
  s += head;
  n -= head;
  uint64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  _mm_sfence();  // streaming stores are weakly ordered: complete before the request does
  std::memcpy(d + i, s + i, n - i);
#else
  std::memcpy(dst, src, n);
#endif
}

void CopyInProcess(Op op, std::span<const Slice> batch, bool streaming) {
  for (const Slice& s : batch) {
    void* local = reinterpret_cast<void*>(s.local);
    void* remote = reinterpret_cast<void*>(s.remote);
    void* dst = op == Op::kWrite ? remote : local;
    const void* src = op == Op::kWrite ? local : remote;
    // Ranges may overlap only within one process (local transport): memmove then.
    const bool overlap = static_cast<const uint8_t*>(src) < static_cast<uint8_t*>(dst) + s.len &&
                         static_cast<uint8_t*>(dst) < static_cast<const uint8_t*>(src) + s.len;
    if (overlap) {
      MoveHost(dst, src, s.len);
    } else if (streaming) {
      StreamingCopy(dst, src, s.len);
    } else {
      CopyHost(dst, src, s.len);
    }
  }
}

}  // namespace xfer::transport
