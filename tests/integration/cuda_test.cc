// GPU memory between two real processes: the "cuda" path (same host: CUDA IPC + the copy
// engines) for D2D, H2D and D2H, and the buffer pool (a peer on another host id: device memory
// staged through pinned host buffers, then tcp). Every test that needs a GPU skips itself with
// "no GPU: <why>" where cuda::Available() is false (no device, or a build without CUDA); the
// last suite runs everywhere else and checks that GPU memory is refused there with the reason.
//
// Direction names below are local (this process) memory to remote (xfer_test_peer) memory:
// D2H = a buffer on our GPU and a host region of the peer, for WRITE and READ alike.
#include <algorithm>
#include <cctype>
#include <random>
#include <thread>

#include "test_common.h"
#include "transport/common/cuda/cuda_api.h"

namespace xfer_test {
namespace {

using namespace std::chrono_literals;
namespace cuda = xfer::transport::cuda;
using xfer::MemType;

#define XT_SKIP_WITHOUT_GPU()                                              \
  do {                                                                     \
    std::string xt_why_;                                                   \
    if (!cuda::Available(&xt_why_)) GTEST_SKIP() << "no GPU: " << xt_why_; \
  } while (0)

// Host memory <-> GPU memory of this process, through cuda::Copy (a host slice side makes it an
// H2D or D2H copy).
xfer::Status ToDevice(uint64_t dev, const void* host, uint64_t len) {
  const xfer::transport::Slice s{reinterpret_cast<uintptr_t>(host), dev, len};
  return cuda::Copy(Op::kWrite, {&s, 1}, Clock::now() + 60s);
}
xfer::Status FromDevice(void* host, uint64_t dev, uint64_t len) {
  const xfer::transport::Slice s{reinterpret_cast<uintptr_t>(host), dev, len};
  return cuda::Copy(Op::kRead, {&s, 1}, Clock::now() + 60s);
}

// One local buffer of this process: GPU memory from Engine::AllocMem(kCuda), or registered host
// memory. Fill and Hash work on either (GPU memory through a host copy).
class Mem {
 public:
  Mem(xfer::Engine& e, bool device, uint64_t len) : e_(e), device_(device), len_(len) {
    if (device_) {
      void* p = nullptr;
      status_ = e_.AllocMem(len, MemType::kCuda, &p, &handle_, "test-device", xfer::AllocOptions{});
      addr_ = reinterpret_cast<uintptr_t>(p);
    } else {
      host_ = std::make_unique<LocalBuffer>(len);
      addr_ = host_->addr();
      status_ = e_.RegisterMem(host_->data(), len, MemType::kHost, &handle_, "test-host");
    }
  }
  ~Mem() {
    if (handle_ == 0) return;
    const xfer::Status s = device_ ? e_.FreeMem(handle_) : e_.DeregisterMem(handle_);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  Mem(const Mem&) = delete;
  Mem& operator=(const Mem&) = delete;

  const xfer::Status& status() const { return status_; }
  uint64_t addr() const { return addr_; }
  void FillRange(uint64_t off, uint64_t len, uint64_t seed) {
    if (!device_) {
      FillPattern(host_->data() + off, len, seed);
      return;
    }
    std::vector<unsigned char> h(len);
    FillPattern(h.data(), len, seed);
    const xfer::Status s = ToDevice(addr_ + off, h.data(), len);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  uint64_t HashRange(uint64_t off, uint64_t len) {
    if (!device_) return Hash64(host_->data() + off, len);
    std::vector<unsigned char> h(len);
    const xfer::Status s = FromDevice(h.data(), addr_ + off, len);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return Hash64(h.data(), len);
  }

 private:
  xfer::Engine& e_;
  bool device_;
  uint64_t len_;
  uint64_t addr_ = 0;
  xfer::MemHandle handle_ = 0;
  xfer::Status status_;
  std::unique_ptr<LocalBuffer> host_;
};

// "D2H" -> local device, remote host.
struct Direction {
  const char* name;
  bool local_device;
  bool remote_device;
};
const Direction kDirections[] = {{"D2D", true, true}, {"H2D", false, true}, {"D2H", true, false}};
void PrintTo(const Direction& d, std::ostream* os) { *os << d.name; }

// Bytes moved so far by path, as GetPeerInfo reports them.
struct Counters {
  uint64_t shm = 0, cuda = 0, staged = 0, transport = 0;
  bool cuda_path = false;
};

class CudaFixture : public PeerFixture {
 protected:
  void SetUp() override {
    XT_SKIP_WITHOUT_GPU();
    PeerFixture::SetUp();
  }
  Counters Info() {
    xfer::PeerInfo info;
    const xfer::Status s = engine_.GetPeerInfo(peer_.name(), &info);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return {info.BytesVia("shm"), info.BytesVia("cuda"), info.BytesVia("staged"),
            info.BytesVia(info.transport), info.Reaches("cuda")};
  }
  // The peer's memory: GPU memory from its AllocMem(kCuda), or host memory. On one host the copy
  // engines reach the peer's host memory only when it comes from AllocMem (mapped here, as
  // shm); the staged suites use plain registered memory (another host: no mapping anyway).
  virtual bool SharedHostRegions() { return true; }
  PeerRegion RemoteAlloc(bool device, uint64_t len) {
    if (device) return peer_.DeviceAlloc(len);
    return SharedHostRegions() ? peer_.ShmAlloc(len) : peer_.Alloc(len);
  }

  // Ranges past the end of the peer's region, before its start, and one bad descriptor in a
  // request are refused without touching the region; the path works afterwards.
  void RefusalMovesNothing(const Direction& d) {
    Mem mine(engine_, d.local_device, 1 << 20);
    XT_ASSERT_OK(mine.status());
    const PeerRegion r = RemoteAlloc(d.remote_device, 64 << 10);
    ASSERT_NE(r.addr, 0u);
    peer_.Fill(r, 9);
    const uint64_t before = peer_.Sum(r);
    XT_EXPECT_CODE(Write({{mine.addr(), r.addr + (64 << 10) - 100, 200}}), StatusCode::kRemoteAccessDenied);
    XT_EXPECT_CODE(Write({{mine.addr(), r.addr - 4096, 8192}}), StatusCode::kRemoteAccessDenied);
    XT_EXPECT_CODE(Write({{mine.addr(), r.addr, 4096}, {mine.addr(), r.addr + (1 << 20), 4096}}),
                   StatusCode::kRemoteAccessDenied);
    XT_EXPECT_CODE(Read({{mine.addr(), r.addr + (64 << 10), 1}}), StatusCode::kRemoteAccessDenied);
    EXPECT_EQ(peer_.Sum(r), before);
    XT_EXPECT_OK(Write({{mine.addr(), r.addr, 64 << 10}}));
  }

  // WRITE and READ of random data at every size 1 B .. 64 MiB, at random offsets; each checked
  // on the other side. Returns the bytes moved.
  uint64_t EverySize(const Direction& d) {
    constexpr uint64_t kMax = 64ull << 20, kSlack = 4096;
    Mem mine(engine_, d.local_device, kMax + kSlack);
    EXPECT_TRUE(mine.status().ok()) << mine.status().ToString();
    if (!mine.status().ok()) return 0;
    const PeerRegion r = RemoteAlloc(d.remote_device, kMax + kSlack);
    if (r.addr == 0) return 0;
    std::mt19937_64 rng(d.name[0] * 131 + d.name[2]);
    uint64_t moved = 0;
    for (uint64_t size :
         std::initializer_list<uint64_t>{1, 8, 4095, 65537, (1 << 20) + 3, 16ull << 20, kMax}) {
      SCOPED_TRACE(std::string(d.name) + " " + std::to_string(size) + " B");
      const uint64_t lo = rng() % kSlack, ro = rng() % kSlack;
      mine.FillRange(lo, size, size);
      XT_EXPECT_OK(Write({{mine.addr() + lo, r.addr + ro, size}}));
      EXPECT_EQ(peer_.SumRange(r.addr + ro, size), mine.HashRange(lo, size));
      peer_.FillRange(r.addr + ro, size, size + 1);
      XT_EXPECT_OK(Read({{mine.addr() + lo, r.addr + ro, size}}));
      EXPECT_EQ(mine.HashRange(lo, size), peer_.SumRange(r.addr + ro, size));
      moved += 2 * size;
    }
    return moved;
  }

  // 1000 scattered 16 KiB descriptors in one request: WRITE, then READ back into another place.
  uint64_t Batch(const Direction& d) {
    constexpr uint64_t kN = 1000, kB = 16 << 10;
    Mem mine(engine_, d.local_device, 2 * kN * kB);
    EXPECT_TRUE(mine.status().ok()) << mine.status().ToString();
    if (!mine.status().ok()) return 0;
    const PeerRegion r = RemoteAlloc(d.remote_device, 2 * kN * kB);
    if (r.addr == 0) return 0;
    mine.FillRange(0, kN * kB, 77);
    std::vector<TransferDesc> w;
    for (uint64_t i = 0; i < kN; ++i) w.push_back({mine.addr() + i * kB, r.addr + 2 * i * kB + 64, kB});
    XT_EXPECT_OK(Write(w));
    std::vector<TransferDesc> rd = w;
    for (auto& x : rd) x.local_addr += kN * kB;  // the second half of our buffer
    XT_EXPECT_OK(Read(rd));
    EXPECT_EQ(mine.HashRange(kN * kB, kN * kB), mine.HashRange(0, kN * kB)) << d.name;
    // Spot-check the scatter on the peer: block 0 and block kN-1.
    for (uint64_t i : {uint64_t(0), kN - 1})
      EXPECT_EQ(peer_.SumRange(r.addr + 2 * i * kB + 64, kB), mine.HashRange(i * kB, kB)) << i;
    return 2 * kN * kB;
  }
};

// ------------------------------------------------------------------ same host: the cuda path

class IntegrationCudaHost : public CudaFixture {};

class IntegrationCuda : public CudaFixture, public ::testing::WithParamInterface<Direction> {};

TEST_P(IntegrationCuda, RandomDataOfEverySizeGoesThroughCuda) {
  const Direction d = GetParam();
  const Counters before = Info();
  const uint64_t moved = EverySize(d);
  const Counters after = Info();
  EXPECT_TRUE(after.cuda_path) << "same-host peer with GPUs on both sides, but no cuda path";
  EXPECT_EQ(after.cuda - before.cuda, moved) << d.name << " did not go through cuda";
  EXPECT_EQ(after.transport - before.transport, 0u);
  EXPECT_EQ(after.staged - before.staged, 0u);
}

TEST_P(IntegrationCuda, BatchOf1000Descriptors) {
  const Direction d = GetParam();
  const Counters before = Info();
  const uint64_t moved = Batch(d);
  EXPECT_EQ(Info().cuda - before.cuda, moved);
}

TEST_P(IntegrationCuda, RemoteRangeRefusedAndTargetUnchanged) { RefusalMovesNothing(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Directions, IntegrationCuda, ::testing::ValuesIn(kDirections),
                         [](const auto& p) { return std::string(p.param.name); });

// Our GPU memory and the peer's registered (not AllocMem) host memory on one host: the copy
// engines cannot reach that memory, so the bytes are staged through our buffer pool and cma.
TEST_F(IntegrationCudaHost, D2HIntoRegisteredHostMemoryIsStaged) {
  constexpr uint64_t kLen = 4 << 20;
  Mem mine(engine_, true, kLen);
  XT_ASSERT_OK(mine.status());
  const PeerRegion r = peer_.Alloc(kLen);
  const Counters before = Info();
  mine.FillRange(0, kLen, 21);
  XT_EXPECT_OK(Write({{mine.addr(), r.addr, kLen}}));
  EXPECT_EQ(peer_.Sum(r), mine.HashRange(0, kLen));
  peer_.Fill(r, 22);
  XT_EXPECT_OK(Read({{mine.addr(), r.addr, kLen}}));
  EXPECT_EQ(mine.HashRange(0, kLen), peer_.Sum(r));
  const Counters after = Info();
  EXPECT_EQ(after.staged - before.staged, 2 * kLen);
  EXPECT_EQ(after.cuda - before.cuda, 0u);
}

// Device memory registered with RegisterMem (cudaMalloc'd by the application), not AllocMem:
// the peer's region and ours, at an offset inside the allocation.
TEST_F(IntegrationCudaHost, RegisteredDeviceMemoryBothSides) {
  constexpr uint64_t kLen = 8 << 20;
  void* p = nullptr;
  XT_ASSERT_OK(cuda::AllocDevice(kLen, -1, &p));
  xfer::MemHandle h = 0;
  const uint64_t a = reinterpret_cast<uintptr_t>(p);
  // A sub-range of the allocation: the device id comes from the pointer.
  XT_ASSERT_OK(engine_.RegisterMem(reinterpret_cast<void*>(a + 4096), kLen - 4096, MemType::kCuda, &h));
  const PeerRegion r = peer_.DeviceAlloc(kLen, -1, "", /*registered=*/true);
  ASSERT_NE(r.addr, 0u);
  std::vector<unsigned char> src(kLen - 8192);
  FillPattern(src.data(), src.size(), 5);
  XT_ASSERT_OK(ToDevice(a + 4096, src.data(), src.size()));
  XT_EXPECT_OK(Write({{a + 4096, r.addr + 100, src.size()}}));
  EXPECT_EQ(peer_.SumRange(r.addr + 100, src.size()), Hash64(src.data(), src.size()));
  peer_.FillRange(r.addr, kLen, 6);
  XT_EXPECT_OK(Read({{a + 4096, r.addr + 100, src.size()}}));
  std::vector<unsigned char> back(src.size());
  XT_ASSERT_OK(FromDevice(back.data(), a + 4096, back.size()));
  EXPECT_EQ(Hash64(back.data(), back.size()), peer_.SumRange(r.addr + 100, src.size()));
  XT_EXPECT_OK(engine_.DeregisterMem(h));
  cuda::FreeDevice(p);
}

// The owner frees GPU memory that this process has open through CUDA IPC: its FreeMem waits
// for our acknowledgement, which comes only after we closed the region (CUDA forbids freeing
// memory another process still has open). Later transfers are refused; new memory, perhaps at
// the same address, works.
TEST_F(IntegrationCudaHost, PeerFreesARegionOpenHereThenAllocatesAgain) {
  constexpr uint64_t kLen = 4 << 20;
  Mem mine(engine_, true, kLen);
  XT_ASSERT_OK(mine.status());
  mine.FillRange(0, kLen, 21);
  const PeerRegion r = peer_.DeviceAlloc(kLen);
  ASSERT_NE(r.addr, 0u);
  XT_ASSERT_OK(Write({{mine.addr(), r.addr, kLen}}));  // opens it here
  const Reply freed = peer_.Call("free " + std::to_string(r.handle));
  ASSERT_TRUE(freed.ok) << freed.line;
  XT_EXPECT_CODE(Write({{mine.addr(), r.addr, 4096}}), StatusCode::kRemoteAccessDenied);
  const PeerRegion again = peer_.DeviceAlloc(kLen);
  ASSERT_NE(again.addr, 0u);
  XT_EXPECT_OK(Write({{mine.addr(), again.addr, kLen}}));
  EXPECT_EQ(peer_.SumRange(again.addr, kLen), mine.HashRange(0, kLen));
}

TEST_F(IntegrationCudaHost, HostPointerRegisteredAsCudaIsRefused) {
  LocalBuffer host(1 << 20);
  xfer::MemHandle h = 0;
  const xfer::Status s = engine_.RegisterMem(host.data(), host.len(), MemType::kCuda, &h);
  EXPECT_FALSE(s.ok()) << "host memory accepted as GPU memory";
  EXPECT_FALSE(s.message().empty());
  // Nothing became visible to the peer.
  Reply regions = peer_.Call("regions " + engine_.LocalName());
  ASSERT_TRUE(regions.ok) << regions.line;
  EXPECT_EQ(regions.u64(0), 0u) << regions.line;
  // A device that does not exist.
  void* p = nullptr;
  xfer::AllocOptions ao;
  ao.device = 4096;
  EXPECT_FALSE(engine_.AllocMem(1 << 20, MemType::kCuda, &p, &h, "", ao).ok());
}

// ------------------------------------------------------------------ peer death

class IntegrationCudaKill : public CudaFixture {
 protected:
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o;
    o.heartbeat_interval = 100ms;
    o.heartbeat_timeout = 1000ms;
    return o;
  }
};

TEST_F(IntegrationCudaKill, PeerKilledDuringLargeD2DFailsConnectionLost) {
  constexpr uint64_t kLen = 64 << 20;
  Mem mine(engine_, true, kLen);
  XT_ASSERT_OK(mine.status());
  const PeerRegion r = peer_.DeviceAlloc(kLen);
  ASSERT_NE(r.addr, 0u);
  // 2 TiB in one request: seconds even at D2D IPC speed (about 1.2 TB/s on an H200).
  std::vector<TransferDesc> d(32768, TransferDesc{mine.addr(), r.addr, kLen});
  xfer::RequestHandle h = 0;
  XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kWrite, d, 120s, &h));
  std::this_thread::sleep_for(50ms);
  peer_.KillNow();
  const auto killed = Clock::now();
  const Outcome o = WaitFor(engine_, h, 30s);
  EXPECT_EQ(o.status.state, RequestState::kFailed) << xfer::RequestStateName(o.status.state);
  EXPECT_EQ(o.status.status.code(), StatusCode::kConnectionLost) << o.status.status.ToString();
  EXPECT_LT(SecondsSince(killed), 5.0) << "the request outlived its peer";
  // The engine is still usable: its GPU memory can be freed and allocated again.
  Mem again(engine_, true, 1 << 20);
  XT_EXPECT_OK(again.status());
}

// ------------------------------------------------------------------ another host: buffer pool

// The peer claims another host id: no same-host path, so the initiator stages its GPU memory
// through the buffer pool (D2H into a pinned buffer, then tcp), and the target's tcp threads
// stage a GPU region of their own.
class IntegrationCudaStaged : public CudaFixture, public ::testing::WithParamInterface<Direction> {
 protected:
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o;
    o.host_id = "cuda-test-host-a";
    o.ucx.mode = xfer::UcxMode::kOff;  // tcp between the two "hosts", whatever this machine has
    return o;
  }
  PeerOptions RemoteOptions() override {
    PeerOptions o;
    o.host_id = "cuda-test-host-b";
    o.extra_args = {"--ucx", "off"};
    return o;
  }
  bool SharedHostRegions() override { return false; }
};

TEST_P(IntegrationCudaStaged, RandomDataOfEverySizeThroughTheBufferPool) {
  const Direction d = GetParam();
  const Counters before = Info();
  const uint64_t moved = EverySize(d);
  const Counters after = Info();
  EXPECT_FALSE(after.cuda_path) << "cuda path to a peer on another host";
  EXPECT_EQ(after.cuda - before.cuda, 0u);
  EXPECT_EQ(after.shm - before.shm, 0u);
  // Everything went over tcp; our GPU memory went through our buffer pool first.
  EXPECT_EQ((after.staged - before.staged) + (after.transport - before.transport), moved);
  if (d.local_device) {
    EXPECT_EQ(after.staged - before.staged, moved) << d.name;
  }
}

TEST_P(IntegrationCudaStaged, BatchOf1000Descriptors) {
  const Direction d = GetParam();
  const Counters before = Info();
  const uint64_t moved = Batch(d);
  const Counters after = Info();
  EXPECT_EQ((after.staged - before.staged) + (after.transport - before.transport), moved);
  if (d.local_device) {
    EXPECT_GT(after.staged, before.staged);
  }
}

TEST_P(IntegrationCudaStaged, RemoteRangeRefusedAndTargetUnchanged) { RefusalMovesNothing(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Directions, IntegrationCudaStaged, ::testing::ValuesIn(kDirections),
                         [](const auto& p) { return std::string(p.param.name); });

// staging = "off": local GPU memory to another host has no path; refused with the reason.
class IntegrationCudaStagingOff : public IntegrationCudaStaged {
 protected:
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o = IntegrationCudaStaged::LocalOptions();
    o.staging = xfer::Staging::kOff;
    return o;
  }
};

TEST_F(IntegrationCudaStagingOff, LocalDeviceMemoryToAnotherHostIsUnsupported) {
  Mem mine(engine_, true, 1 << 20);
  XT_ASSERT_OK(mine.status());
  const PeerRegion r = peer_.Alloc(1 << 20);
  peer_.Fill(r, 11);
  const uint64_t before = peer_.Sum(r);
  const xfer::Status s = Write({{mine.addr(), r.addr, 1 << 20}});
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.ToString();
  EXPECT_NE(s.message().find("staging"), std::string::npos) << s.ToString();
  EXPECT_EQ(peer_.Sum(r), before);
}

// ------------------------------------------------------------------ without a GPU

bool MentionsGpu(std::string m) {
  std::transform(m.begin(), m.end(), m.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return m.find("cuda") != std::string::npos || m.find("gpu") != std::string::npos;
}

// Runs on every machine without a usable GPU (the CI machine): GPU memory is refused with
// UNSUPPORTED and a message that says why, and nothing is registered.
TEST(IntegrationCudaNoGpu, RegisterAndAllocRefusedWithTheReason) {
  std::string why;
  if (cuda::Available(&why)) GTEST_SKIP() << "a GPU is available here: the other suites cover it";
  EXPECT_FALSE(why.empty()) << "cuda::Available gave no reason";
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0"));
  LocalBuffer buf(1 << 20);
  xfer::MemHandle h = 0;
  const xfer::Status reg = e.RegisterMem(buf.data(), buf.len(), MemType::kCuda, &h);
  EXPECT_EQ(reg.code(), StatusCode::kUnsupported) << reg.ToString();
  EXPECT_TRUE(MentionsGpu(reg.message())) << reg.ToString();
  void* p = nullptr;
  xfer::AllocOptions ao;
  ao.device = 0;
  const xfer::Status al = e.AllocMem(1 << 20, MemType::kCuda, &p, &h, "x", ao);
  EXPECT_EQ(al.code(), StatusCode::kUnsupported) << al.ToString();
  EXPECT_TRUE(MentionsGpu(al.message())) << al.ToString();
  EXPECT_EQ(p, nullptr);
  // The reason cuda::Available gives is in both messages (at least its first words).
  const std::string head = why.substr(0, std::min<size_t>(why.size(), 16));
  EXPECT_NE(reg.message().find(head), std::string::npos) << "no reason (" << why << "): " << reg.ToString();
  EXPECT_NE(al.message().find(head), std::string::npos) << "no reason (" << why << "): " << al.ToString();
  // Host memory is unaffected.
  XT_EXPECT_OK(e.RegisterMem(buf.data(), buf.len(), MemType::kHost, &h));
}

// The peer's "info" reply ends with the cuda flag and the cuda and staged byte counters (after
// the fields older tests parse). Runs everywhere.
class IntegrationCudaInfo : public PeerFixture {};

TEST_F(IntegrationCudaInfo, InfoReplyCarriesCudaCounters) {
  Reply r = peer_.Call("info " + engine_.LocalName());
  ASSERT_TRUE(r.ok) << r.line;
  ASSERT_EQ(r.words.size(), 11u) << r.line;
  EXPECT_TRUE(r.words[8] == "0" || r.words[8] == "1") << r.line;
  std::string why;
  if (!cuda::Available(&why)) {
    EXPECT_EQ(r.words[8], "0") << r.line;
    EXPECT_EQ(r.u64(9), 0u) << r.line;
  }
  EXPECT_EQ(r.u64(10), 0u) << r.line;  // nothing staged yet
}

}  // namespace
}  // namespace xfer_test
