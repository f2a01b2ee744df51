// The cuda transport's CUDA layer (transport/cuda/cuda_api.h), in both builds: with the toolkit
// (cuda_memory.cc, cuda_ipc.cc, cuda_copy.cc) and without (cuda_unavailable.cc). Tests that need a GPU skip
// themselves where there is none; opening a peer's region across processes is left to the integration tests
// (CUDA IPC refuses a handle of its own process).
#include "transport/common/cuda/cuda_api.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#ifdef XFER_HAVE_CUDA
#include <cuda.h>  // CUcontext, CUresult: the driver function comes through the runtime
#include <cuda_runtime.h>
#endif

namespace xfer::transport::cuda {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

#ifdef XFER_HAVE_CUDA
constexpr bool kBuiltWithCuda = true;
#else
constexpr bool kBuiltWithCuda = false;
#endif

#define SKIP_WITHOUT_GPU()                                     \
  do {                                                         \
    std::string why_;                                          \
    if (!Available(&why_)) GTEST_SKIP() << "no GPU: " << why_; \
  } while (0)

uint64_t U(const void* p) { return reinterpret_cast<uint64_t>(p); }

std::vector<uint8_t> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// A blob in the format cuda_ipc.cc writes (see its "Blob" comment): header fields only.
std::string Blob(uint8_t kind, int32_t device, int32_t fd, uint64_t offset, uint64_t alloc_size,
                 size_t total) {
  std::string b(total, '\0');
  auto put = [&](size_t at, uint64_t v, size_t n) {
    for (size_t i = 0; i < n && at + i < b.size(); ++i) b[at + i] = static_cast<char>(v >> (8 * i) & 0xff);
  };
  const char magic[4] = {'x', 'C', 'U', 'D'};
  for (size_t i = 0; i < 4 && i < b.size(); ++i) b[i] = magic[i];
  put(4, 1, 1);  // version
  put(5, kind, 1);
  put(8, static_cast<uint32_t>(device), 4);
  put(12, static_cast<uint32_t>(fd), 4);
  put(16, offset, 8);
  put(24, alloc_size, 8);
  return b;
}
constexpr uint8_t kIpc = 1, kVmm = 2;

// ---- Any machine -------------------------------------------------------------------------

TEST(CudaApi, AvailableSaysWhyNot) {
  std::string why;
  const bool ok = Available(&why);
  if (!ok) {
    EXPECT_FALSE(why.empty());
    if (!kBuiltWithCuda) {
      EXPECT_NE(why.find("no CUDA"), std::string::npos) << why;
    }
  }
  EXPECT_EQ(Available(nullptr), ok);  // cached, and a null reason is fine
  const std::string text = Describe();
  EXPECT_FALSE(text.empty());
  if (!ok) {
    EXPECT_NE(text.find(why), std::string::npos) << text;
  }
}

TEST(CudaApi, HostMemoryIsHost) {
  int on_stack = 0;
  auto on_heap = std::make_unique<std::vector<uint8_t>>(1 << 20);
  void* mapped = ::mmap(nullptr, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mapped, MAP_FAILED);
  static const char kStatic[] = "static";
  for (const void* p : {static_cast<const void*>(&on_stack), static_cast<const void*>(on_heap->data()),
                        static_cast<const void*>(mapped), static_cast<const void*>(kStatic),
                        static_cast<const void*>(nullptr)}) {
    MemType type = MemType::kCuda;
    int32_t device = 7;
    Classify(p, &type, &device);
    EXPECT_EQ(type, MemType::kHost) << p;
    EXPECT_EQ(device, -1) << p;
  }
  ::munmap(mapped, 1 << 16);
}

TEST(CudaApi, MalformedBlobsAreRefusedBeforeCuda) {
  int takes = 0;
  const TakeFd take = [&](int32_t, int*) {
    ++takes;
    return Status(StatusCode::kInternal, "must not be called");
  };
  // Without the toolkit nothing is parsed: every Open says the build has no CUDA.
  const StatusCode want = kBuiltWithCuda ? StatusCode::kInvalidArgument : StatusCode::kUnsupported;
  const std::string vmm = Blob(kVmm, 0, 3, 0, 1 << 20, 32);
  const std::string ipc = Blob(kIpc, 0, -1, 0, 1 << 20, 96);
  std::vector<std::pair<std::string, std::string>> cases = {
      {"empty", ""},
      {"one byte", "x"},
      {"bad magic", "yCUD" + vmm.substr(4)},
      {"wrong version",
       [&] {
         std::string b = vmm;
         b[4] = 9;
         return b;
       }()},
      {"unknown kind 0", Blob(0, 0, 3, 0, 1 << 20, 32)},
      {"unknown kind 3", Blob(3, 0, 3, 0, 1 << 20, 32)},
      {"vmm too long", vmm + "extra"},
      {"ipc without its handle", Blob(kIpc, 0, -1, 0, 1 << 20, 32)},
      {"vmm with an ipc length", Blob(kVmm, 0, 3, 0, 1 << 20, 96)},
      {"huge offset", Blob(kVmm, 0, 3, 1ull << 62, 1 << 20, 32)},
      {"offset at the end", Blob(kIpc, 0, -1, 1 << 20, 1 << 20, 96)},
      {"offset near 2^64", Blob(kVmm, 0, 3, ~0ull - 10, ~0ull, 32)},
      {"empty allocation", Blob(kVmm, 0, 3, 0, 0, 32)},
      {"negative device", Blob(kVmm, -1, 3, 0, 1 << 20, 32)},
      {"negative descriptor", Blob(kVmm, 0, -5, 0, 1 << 20, 32)},
  };
  for (size_t n = 0; n < ipc.size(); ++n)
    cases.emplace_back("ipc cut to " + std::to_string(n), ipc.substr(0, n));
  for (size_t n = 0; n < vmm.size(); ++n)
    cases.emplace_back("vmm cut to " + std::to_string(n), vmm.substr(0, n));
  std::mt19937 rng(42);
  for (int i = 0; i < 500; ++i) {
    std::string b(rng() % 128, '\0');
    for (auto& c : b) c = static_cast<char>(rng());
    cases.emplace_back("random " + std::to_string(i), b);
  }
  for (const auto& [name, blob] : cases) {
    std::shared_ptr<Mapping> m;
    const Status s = Open(blob, 4096, take, &m);
    EXPECT_EQ(s.code(), want) << name << ": " << s.ToString();
    EXPECT_FALSE(s.message().empty()) << name;
    EXPECT_EQ(m, nullptr) << name;
  }
  // Well formed, but the region is longer than the allocation, or empty.
  for (uint64_t len : {uint64_t{(1 << 20) + 1}, uint64_t{0}}) {
    std::shared_ptr<Mapping> m;
    EXPECT_EQ(Open(vmm, len, take, &m).code(), want) << len;
    EXPECT_EQ(Open(Blob(kIpc, 0, -1, 4096, 1 << 20, 96), len == 0 ? 0 : (1 << 20) - 4095, take, &m).code(),
              want)
        << len;
  }
  EXPECT_EQ(takes, 0);
}

TEST(CudaApi, WithoutGpuEverythingSaysWhy) {
  std::string why;
  if (Available(&why)) GTEST_SKIP() << "a GPU is here; the GPU tests cover these calls";
  std::vector<uint8_t> a(4096), b(4096);
  const Slice slice{U(a.data()), U(b.data()), 4096};
  const Status copy = Copy(Op::kWrite, std::span<const Slice>(&slice, 1), Clock::now() + 1s);
  EXPECT_EQ(copy.code(), StatusCode::kUnsupported) << copy.ToString();
  EXPECT_NE(copy.message().find(why), std::string::npos) << copy.ToString();

  void* p = reinterpret_cast<void*>(1);
  Status s = AllocDevice(1 << 20, -1, &p);
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(s.message().empty());
  EXPECT_EQ(p, nullptr);
  p = reinterpret_cast<void*>(1);
  s = AllocDevice(1 << 20, 0, &p);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(p, nullptr);
  p = reinterpret_cast<void*>(1);
  s = AllocPinned(1 << 20, &p);
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(s.message().empty());
  EXPECT_EQ(p, nullptr);
  s = PinHost(a.data(), a.size());
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(s.message().empty());
  UnpinHost(a.data());  // harmless
  std::unique_ptr<Export> e;
  s = Export::Create(U(a.data()), a.size(), &e);
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(s.message().empty());
  EXPECT_EQ(e, nullptr);
  FreeDevice(nullptr);
  FreePinned(nullptr);
  EXPECT_NE(Describe().find("CUDA"), std::string::npos);
}

// Argument checks come before CUDA is asked anything: the same answer in every build, with or
// without a GPU.
TEST(CudaApi, AllocDeviceRefusesBadArgumentsEverywhere) {
  for (int32_t device : {-5, -2, INT32_MIN}) {
    void* p = reinterpret_cast<void*>(1);
    const Status s = AllocDevice(4096, device, &p);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << device << ": " << s.ToString();
    EXPECT_NE(s.message().find(std::to_string(device)), std::string::npos) << s.ToString();
    EXPECT_EQ(p, nullptr) << device;
  }
  void* p = reinterpret_cast<void*>(1);
  EXPECT_EQ(AllocDevice(0, 0, &p).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(AllocDevice(4096, -1, nullptr).code(), StatusCode::kInvalidArgument);
}

// ---- With a GPU --------------------------------------------------------------------------

// Device memory freed at scope exit.
struct DeviceBuf {
  void* p = nullptr;
  ~DeviceBuf() { FreeDevice(p); }
};

TEST(CudaGpu, DeviceMemoryIsCuda) {
  SKIP_WITHOUT_GPU();
  DeviceBuf d;
  ASSERT_TRUE(AllocDevice(1 << 20, 0, &d.p).ok());
  ASSERT_NE(d.p, nullptr);
  MemType type = MemType::kHost;
  int32_t device = -1;
  Classify(static_cast<uint8_t*>(d.p) + 4096, &type, &device);
  EXPECT_EQ(type, MemType::kCuda);
  EXPECT_EQ(device, 0);
  DeviceBuf current;
  ASSERT_TRUE(AllocDevice(4096, -1, &current.p).ok());
  Classify(current.p, &type, &device);
  EXPECT_EQ(type, MemType::kCuda);
  EXPECT_GE(device, 0);
  // Pinned host memory is still host memory.
  void* pinned = nullptr;
  ASSERT_TRUE(AllocPinned(1 << 16, &pinned).ok());
  Classify(pinned, &type, &device);
  EXPECT_EQ(type, MemType::kHost);
  EXPECT_EQ(device, -1);
  FreePinned(pinned);
  // Refused: its own pointer (a refusal clears it), not one holding memory still to free.
  void* refused = reinterpret_cast<void*>(1);
  EXPECT_EQ(AllocDevice(4096, 1 << 20, &refused).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused, nullptr);
  EXPECT_NE(Describe().find("device 0: "), std::string::npos) << Describe();
}

TEST(CudaGpu, AllocDeviceIsZeroed) {
  SKIP_WITHOUT_GPU();
  constexpr size_t kLen = 8 << 20;
  const std::vector<uint8_t> zeros(kLen, 0);
  const std::vector<uint8_t> pattern = Random(kLen, 7);
  // Dirty memory, freed, then allocated again (the allocator hands the same pages back).
  for (int round = 0; round < 3; ++round) {
    DeviceBuf d;
    Status s = AllocDevice(kLen, round == 1 ? 0 : -1, &d.p);
    ASSERT_TRUE(s.ok()) << s.ToString();
    std::vector<uint8_t> back(kLen, 0xee);
    const Slice read{U(back.data()), U(d.p), kLen};
    s = Copy(Op::kRead, std::span<const Slice>(&read, 1), Clock::now() + 10s);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(back, zeros) << "round " << round;
    const Slice dirty{U(pattern.data()), U(d.p), kLen};
    s = Copy(Op::kWrite, std::span<const Slice>(&dirty, 1), Clock::now() + 10s);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
}

TEST(CudaGpu, CopyAlternatingAllocationsOnOneThread) {
  SKIP_WITHOUT_GPU();
  // Batch after batch, over one allocation then the other (the thread's remembered allocation
  // changes each time), the same stream of the thread serves them all; then one allocation is
  // freed and another takes its place.
  constexpr size_t kLen = 1 << 20, kSlice = 64 << 10;
  DeviceBuf a, b;
  ASSERT_TRUE(AllocDevice(kLen, -1, &a.p).ok());
  ASSERT_TRUE(AllocDevice(kLen, 0, &b.p).ok());
  const std::vector<uint8_t> src = Random(kLen, 11);
  for (int round = 0; round < 3; ++round) {
    for (size_t off = 0; off < kLen; off += kSlice) {
      for (void* dev : {a.p, b.p}) {
        const Slice sl{U(src.data()) + off, U(dev) + off, kSlice};
        const Status s = Copy(Op::kWrite, std::span<const Slice>(&sl, 1), Clock::now() + 10s);
        ASSERT_TRUE(s.ok()) << "round " << round << ", offset " << off << ": " << s.ToString();
      }
    }
    // Device to device, both sides known, then back to the host.
    const Slice d2d{U(a.p), U(b.p), kLen};
    ASSERT_TRUE(Copy(Op::kRead, std::span<const Slice>(&d2d, 1), Clock::now() + 10s).ok());
    std::vector<uint8_t> back(kLen, 0);
    const Slice read{U(back.data()), U(a.p), kLen};
    ASSERT_TRUE(Copy(Op::kRead, std::span<const Slice>(&read, 1), Clock::now() + 10s).ok());
    EXPECT_EQ(back, src) << "round " << round;
    if (round == 1) {  // a new allocation, perhaps at the address of the one freed
      FreeDevice(a.p);
      a.p = nullptr;
      ASSERT_TRUE(AllocDevice(kLen, -1, &a.p).ok());
    }
  }
  // And from another thread, which gets streams of its own.
  Status other;
  std::thread t([&] {
    std::vector<uint8_t> back(kLen, 0);
    const Slice read{U(back.data()), U(b.p), kLen};
    other = Copy(Op::kRead, std::span<const Slice>(&read, 1), Clock::now() + 10s);
    if (other.ok() && back != src) other = Status(StatusCode::kInternal, "data differs");
  });
  t.join();
  EXPECT_TRUE(other.ok()) << other.ToString();
}

#ifdef XFER_HAVE_CUDA
// The driver's current context of this thread (cuCtxGetCurrent, through the runtime: the tests
// do not link libcuda), or false if it cannot be had.
bool CurrentContext(CUcontext* ctx) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  const cudaError_t e = cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 4000, cudaEnableDefault, &q);
#else
  const cudaError_t e = cudaGetDriverEntryPoint("cuCtxGetCurrent", &fn, cudaEnableDefault, &q);
#endif
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || fn == nullptr) return false;
  return reinterpret_cast<CUresult (*)(CUcontext*)>(fn)(ctx) == CUDA_SUCCESS;
}

// The calls that switch devices for a while (DeviceScope in cuda_common.h) leave the calling
// thread's device and context as they found them: on a thread that has used CUDA, on a fresh
// thread (which had no context: it may keep the primary context of its own device, as its own
// first runtime call would), and with two GPUs, across devices (the very same context back).
TEST(CudaGpu, DeviceAndContextAreLeftAsTheyWere) {
  SKIP_WITHOUT_GPU();
  constexpr size_t kLen = 1 << 20;
  const std::vector<uint8_t> src = Random(kLen, 5);
  // Every call that takes or finds a device; the failures collected, not asserted here (threads).
  auto exercise = [&](int32_t device, std::string* failed) {
    void* p = nullptr;
    Status s = AllocDevice(kLen, device, &p);
    if (!s.ok()) {
      *failed = "AllocDevice: " + s.ToString();
      return;
    }
    const Slice up{U(src.data()), U(p), kLen};
    s = Copy(Op::kWrite, std::span<const Slice>(&up, 1), Clock::now() + 10s);
    std::unique_ptr<Export> e;
    if (s.ok()) s = Export::Create(U(p), kLen, &e);
    if (!s.ok()) *failed = s.ToString();
    FreeDevice(p);
  };
  // What the thread has, read after cudaGetDevice (whatever that call itself sets up).
  struct State {
    int device = -1;
    CUcontext ctx = nullptr;
    bool ctx_known = false;
  };
  auto state = [] {
    State st;
    if (cudaGetDevice(&st.device) != cudaSuccess) cudaGetLastError();
    st.ctx_known = CurrentContext(&st.ctx);
    return st;
  };
  auto same = [](const State& before, const State& after) {
    return before.device == after.device &&
           (!before.ctx_known || !after.ctx_known || before.ctx == nullptr || before.ctx == after.ctx);
  };

  const State before = state();
  std::string failed;
  exercise(0, &failed);
  EXPECT_EQ(failed, "");
  exercise(-1, &failed);
  EXPECT_EQ(failed, "");
  EXPECT_TRUE(same(before, state())) << "device " << before.device << " -> " << state().device;

  std::string thread_failed;
  bool thread_same = false;
  std::thread t([&] {
    const State fresh = state();
    exercise(0, &thread_failed);
    thread_same = same(fresh, state());
  });
  t.join();
  EXPECT_EQ(thread_failed, "");
  EXPECT_TRUE(thread_same) << "a fresh thread's device or context changed";

  int n = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  if (n < 2) GTEST_SKIP() << "one GPU: the switch between devices needs two";
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  const State on1 = state();
  exercise(0, &failed);
  EXPECT_EQ(failed, "");
  EXPECT_TRUE(same(on1, state())) << "device 1 -> " << state().device;
  ASSERT_EQ(cudaSetDevice(before.device < 0 ? 0 : before.device), cudaSuccess);
}
#endif

TEST(CudaGpu, ExportSubRangeAndRefuseBeyond) {
  SKIP_WITHOUT_GPU();
  DeviceBuf d;
  constexpr uint64_t kLen = 4 << 20;
  ASSERT_TRUE(AllocDevice(kLen, -1, &d.p).ok());
  const uint64_t base = U(d.p);

  std::unique_ptr<Export> whole, part;
  Status s = Export::Create(base, kLen, &whole);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_FALSE(whole->blob().empty());
  s = Export::Create(base + 65536, 8192, &part);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_FALSE(part->blob().empty());
  EXPECT_NE(whole->blob(), part->blob());  // the offset differs

  // The blobs parse: a region longer than what they cover is refused before CUDA is asked.
  std::shared_ptr<Mapping> m;
  EXPECT_EQ(Open(whole->blob(), kLen + 1, nullptr, &m).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Open(part->blob(), kLen - 65536 + 1, nullptr, &m).code(), StatusCode::kInvalidArgument);

  std::unique_ptr<Export> bad;
  EXPECT_EQ(Export::Create(base + 4096, kLen, &bad).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Export::Create(base, kLen + 1, &bad).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Export::Create(base, 0, &bad).code(), StatusCode::kInvalidArgument);
  std::vector<uint8_t> host(4096);
  s = Export::Create(U(host.data()), host.size(), &bad);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_EQ(bad, nullptr);
}

TEST(CudaGpu, CopyRoundTripHostDeviceDevice) {
  SKIP_WITHOUT_GPU();
  constexpr size_t kSlices = 100, kSlice = 64 << 10, kTotal = kSlices * kSlice;
  DeviceBuf a, b;
  ASSERT_TRUE(AllocDevice(kTotal, -1, &a.p).ok());
  ASSERT_TRUE(AllocDevice(kTotal, -1, &b.p).ok());
  const std::vector<uint8_t> src = Random(kTotal, 1);
  std::vector<uint8_t> dst(kTotal, 0);

  // WRITE host -> A (H2D), slice i to place i.
  std::vector<Slice> h2d, d2d, d2h;
  for (size_t i = 0; i < kSlices; ++i)
    h2d.push_back({U(src.data()) + i * kSlice, U(a.p) + i * kSlice, kSlice});
  // WRITE A -> B (D2D), slice i to place kSlices-1-i.
  for (size_t i = 0; i < kSlices; ++i)
    d2d.push_back({U(a.p) + i * kSlice, U(b.p) + (kSlices - 1 - i) * kSlice, kSlice});
  // READ B -> host (D2H), straight.
  for (size_t i = 0; i < kSlices; ++i)
    d2h.push_back({U(dst.data()) + i * kSlice, U(b.p) + i * kSlice, kSlice});

  Status s = Copy(Op::kWrite, h2d, Clock::now() + 10s);
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = Copy(Op::kWrite, d2d, Clock::now() + 10s);
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = Copy(Op::kRead, d2h, Clock::now() + 10s);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t i = 0; i < kSlices; ++i) {
    ASSERT_EQ(std::memcmp(dst.data() + i * kSlice, src.data() + (kSlices - 1 - i) * kSlice, kSlice), 0) << i;
  }
  // READ device -> device the other way, then back to the host.
  std::vector<Slice> back;
  for (size_t i = 0; i < kSlices; ++i) back.push_back({U(a.p) + i * kSlice, U(b.p) + i * kSlice, kSlice});
  ASSERT_TRUE(Copy(Op::kRead, back, Clock::now() + 10s).ok());
  std::vector<uint8_t> dst2(kTotal, 0);
  const Slice all{U(dst2.data()), U(a.p), kTotal};
  ASSERT_TRUE(Copy(Op::kRead, std::span<const Slice>(&all, 1), Clock::now() + 10s).ok());
  EXPECT_EQ(dst2, dst);
  EXPECT_TRUE(Copy(Op::kWrite, {}, Clock::now()).ok());
}

TEST(CudaGpu, CopyPastTheDeadlineFinishesThenSaysTimeout) {
  SKIP_WITHOUT_GPU();
  // From page-locked memory the copy is asynchronous: 256 MiB take milliseconds, so it is
  // still running when Copy first looks.
  constexpr size_t kLen = 256 << 20;
  DeviceBuf d;
  ASSERT_TRUE(AllocDevice(kLen, -1, &d.p).ok());
  void* pinned = nullptr;
  ASSERT_TRUE(AllocPinned(kLen, &pinned).ok());
  auto* src = static_cast<uint8_t*>(pinned);
  for (size_t i = 0; i < kLen; ++i) src[i] = static_cast<uint8_t>(i * 131 + (i >> 20));
  const Slice slice{U(src), U(d.p), kLen};
  const Status s = Copy(Op::kWrite, std::span<const Slice>(&slice, 1), Clock::now() - 1s);
  EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.ToString();
  // The copy was waited out: the data is all there.
  std::vector<uint8_t> back(kLen, 0);
  const Slice read{U(back.data()), U(d.p), kLen};
  ASSERT_TRUE(Copy(Op::kRead, std::span<const Slice>(&read, 1), Clock::now() + 10s).ok());
  EXPECT_EQ(std::memcmp(back.data(), src, kLen), 0);
  FreePinned(pinned);
}

TEST(CudaGpu, PinnedHostMemory) {
  SKIP_WITHOUT_GPU();
  constexpr size_t kLen = 1 << 20;
  std::vector<uint8_t> host = Random(kLen, 3);
  Status s = PinHost(host.data(), kLen);
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = PinHost(host.data(), kLen);  // twice: counted
  ASSERT_TRUE(s.ok()) << s.ToString();
  DeviceBuf d;
  ASSERT_TRUE(AllocDevice(kLen, -1, &d.p).ok());
  const Slice up{U(host.data()), U(d.p), kLen};
  ASSERT_TRUE(Copy(Op::kWrite, std::span<const Slice>(&up, 1), Clock::now() + 10s).ok());
  UnpinHost(host.data());
  UnpinHost(host.data());
  UnpinHost(host.data());  // one too many: ignored

  void* pinned = nullptr;
  ASSERT_TRUE(AllocPinned(kLen, &pinned).ok());
  const Slice down{U(pinned), U(d.p), kLen};
  ASSERT_TRUE(Copy(Op::kRead, std::span<const Slice>(&down, 1), Clock::now() + 10s).ok());
  EXPECT_EQ(std::memcmp(pinned, host.data(), kLen), 0);
  FreePinned(pinned);
#ifdef XFER_HAVE_CUDA
  // Memory page-locked by its owner: PinHost accepts it and UnpinHost leaves it locked.
  std::vector<uint8_t> owned(kLen);
  ASSERT_EQ(cudaHostRegister(owned.data(), kLen, cudaHostRegisterDefault), cudaSuccess);
  s = PinHost(owned.data(), kLen);
  EXPECT_TRUE(s.ok()) << s.ToString();
  UnpinHost(owned.data());
  EXPECT_EQ(cudaHostUnregister(owned.data()), cudaSuccess);  // still registered: ours to undo
#endif
  EXPECT_EQ(PinHost(nullptr, kLen).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace xfer::transport::cuda
