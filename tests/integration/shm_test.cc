// The shm path between two processes on this host: memory from the peer's AllocMem is mapped
// here and moved with memcpy; other memory of the same peer still goes through cma.
#include <sys/mman.h>

#include <csignal>

#include <fstream>
#include <random>
#include <thread>

#include "test_common.h"
#include "transport/common/cuda/cuda_api.h"

namespace xfer_test {
namespace {

using namespace std::chrono_literals;

class IntegrationShm : public PeerFixture {
 protected:
  xfer::PeerInfo Info() {
    xfer::PeerInfo info;
    EXPECT_TRUE(engine_.GetPeerInfo(peer_.name(), &info).ok());
    return info;
  }
};

TEST_F(IntegrationShm, RandomDataOfEverySizeAndBatchShape) {
  const xfer::PeerInfo before = Info();
  ASSERT_TRUE(before.Reaches("shm")) << "same-host peer without the shm path";
  EXPECT_EQ(before.transport, "cma");
  constexpr uint64_t kMax = 16 << 20;
  const PeerRegion r = peer_.ShmAlloc(kMax + 4096, "shm");
  LocalBuffer src(kMax), back(kMax);
  std::mt19937_64 rng(7);
  uint64_t moved = 0;
  for (uint64_t size : std::initializer_list<uint64_t>{1, 8, 4095, 65537, (1 << 20) + 3, kMax}) {
    SCOPED_TRACE(size);
    src.Fill(size);
    const uint64_t at = rng() % 4096;  // any alignment on the remote side
    XT_ASSERT_OK(Write({{src.addr(), r.addr + at, size}}));
    EXPECT_EQ(peer_.SumRange(r.addr + at, size), Hash64(src.data(), size));
    peer_.FillRange(r.addr + at, size, size + 1);
    XT_ASSERT_OK(Read({{back.addr(), r.addr + at, size}}));
    EXPECT_EQ(Hash64(back.data(), size), peer_.SumRange(r.addr + at, size));
    moved += 2 * size;
  }
  // 4,000 scattered 1 KiB descriptors in one request, both ways.
  constexpr uint64_t kN = 4000, kB = 1024;
  src.Fill(99);
  std::vector<TransferDesc> d;
  for (uint64_t i = 0; i < kN; ++i) d.push_back({src.addr() + i * kB, r.addr + 2 * i * kB + 5, kB});
  XT_ASSERT_OK(Write(d));
  for (auto& x : d) x.local_addr = back.addr() + (x.local_addr - src.addr());
  XT_ASSERT_OK(Read(d));
  EXPECT_EQ(Hash64(back.data(), kN * kB), Hash64(src.data(), kN * kB));
  moved += 2 * kN * kB;
  const xfer::PeerInfo after = Info();
  EXPECT_EQ(after.BytesVia("shm") - before.BytesVia("shm"), moved);
  EXPECT_EQ(after.BytesVia(after.transport), before.BytesVia(before.transport))
      << "shm memory went through cma";
}

TEST_F(IntegrationShm, RegisteredMemoryOfTheSamePeerStillGoesThroughCma) {
  const PeerRegion shared = peer_.ShmAlloc(1 << 20);
  const PeerRegion plain = peer_.Alloc(1 << 20);
  LocalBuffer src(2 << 20);
  src.Fill(3);
  // One request touching both: each descriptor takes its own path.
  XT_ASSERT_OK(Write({{src.addr(), shared.addr, 1 << 20}, {src.addr() + (1 << 20), plain.addr, 1 << 20}}));
  EXPECT_EQ(peer_.Sum(shared), Hash64(src.data(), 1 << 20));
  EXPECT_EQ(peer_.Sum(plain), Hash64(src.data() + (1 << 20), 1 << 20));
  const xfer::PeerInfo info = Info();
  EXPECT_EQ(info.BytesVia("shm"), 1u << 20);
  EXPECT_EQ(info.BytesVia(info.transport), 1u << 20);
}

TEST_F(IntegrationShm, OwnerFreesTheRegionWhilePeerHasItMapped) {
  const PeerRegion r = peer_.ShmAlloc(1 << 20);
  LocalBuffer src(1 << 20);
  src.Fill(4);
  XT_ASSERT_OK(Write({{src.addr(), r.addr, 1 << 20}}));  // mapped here now
  Reply f = peer_.Call("free " + std::to_string(r.handle));
  ASSERT_TRUE(f.ok) << f.line;
  const xfer::Status s = Write({{src.addr(), r.addr, 4096}});
  EXPECT_EQ(s.code(), StatusCode::kRemoteAccessDenied) << s.ToString();
  const xfer::Status rd = Read({{src.addr(), r.addr, 4096}});
  EXPECT_EQ(rd.code(), StatusCode::kRemoteAccessDenied) << rd.ToString();
  // A new allocation works (and may reuse the same address).
  const PeerRegion again = peer_.ShmAlloc(1 << 20);
  XT_ASSERT_OK(Write({{src.addr(), again.addr, 1 << 20}}));
  EXPECT_EQ(peer_.Sum(again), src.Hash());
}

TEST_F(IntegrationShm, SmallTransfersFromRegisteredMemoryRunInline) {
  // One small descriptor from registered memory is copied on the caller's thread without a
  // request object: the same data, counters and refusals as the planned path.
  const PeerRegion r = peer_.ShmAlloc(1 << 20);
  LocalBuffer mine(64 << 10), back(64 << 10);
  xfer::MemHandle h1 = 0, h2 = 0;
  XT_ASSERT_OK(engine_.RegisterMem(mine.data(), mine.len(), xfer::MemType::kHost, &h1));
  XT_ASSERT_OK(engine_.RegisterMem(back.data(), back.len(), xfer::MemType::kHost, &h2));
  const xfer::PeerInfo before = Info();
  std::mt19937_64 rng(11);
  uint64_t moved = 0;
  for (int i = 0; i < 500; ++i) {
    const uint64_t len = 1 + rng() % (64 << 10), at = rng() % ((1 << 20) - len + 1);
    mine.Fill(i);
    XT_ASSERT_OK(Write({{mine.addr(), r.addr + at, len}}));
    XT_ASSERT_OK(Read({{back.addr(), r.addr + at, len}}));
    ASSERT_EQ(Hash64(back.data(), len), Hash64(mine.data(), len)) << i;
    moved += 2 * len;
  }
  EXPECT_EQ(Info().BytesVia("shm") - before.BytesVia("shm"), moved);
  // Past the region's end: refused by the planned path, nothing written.
  EXPECT_EQ(Write({{mine.addr(), r.addr + (1 << 20) - 8, 16}}).code(), StatusCode::kRemoteAccessDenied);
  Reply f = peer_.Call("free " + std::to_string(r.handle));
  ASSERT_TRUE(f.ok) << f.line;
  EXPECT_EQ(Write({{mine.addr(), r.addr, 8}}).code(), StatusCode::kRemoteAccessDenied);
  EXPECT_EQ(Read({{back.addr(), r.addr, 8}}).code(), StatusCode::kRemoteAccessDenied);
  XT_EXPECT_OK(engine_.DeregisterMem(h1));
  XT_EXPECT_OK(engine_.DeregisterMem(h2));
}

TEST_F(IntegrationShm, SmallAsyncRequestsCompleteBeforeTransferAsyncReturns) {
  // A small memcpy runs on the caller's thread: the request is over when its handle comes
  // back. Larger ones go to the streams; both land whole.
  const PeerRegion r = peer_.ShmAlloc(4 << 20);
  LocalBuffer src(4 << 20), back(4 << 20);
  for (uint64_t len : {uint64_t{4096}, uint64_t{64} << 10, uint64_t{4} << 20}) {
    SCOPED_TRACE(len);
    src.Fill(len);
    xfer::RequestHandle h = 0;
    XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kWrite, {{src.addr(), r.addr, len}}, 10s, &h));
    if (len <= (64 << 10)) {
      xfer::RequestStatus st;
      XT_ASSERT_OK(engine_.GetTransferStatus(h, &st));
      EXPECT_EQ(st.state, xfer::RequestState::kCompleted) << "a small shm request was handed off";
    } else {
      XT_ASSERT_OK(engine_.Wait(h, 10s, nullptr));
    }
    EXPECT_EQ(peer_.SumRange(r.addr, len), Hash64(src.data(), len));
    XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kRead, {{back.addr(), r.addr, len}}, 10s, &h));
    XT_ASSERT_OK(engine_.Wait(h, 10s, nullptr));
    EXPECT_EQ(Hash64(back.data(), len), Hash64(src.data(), len));
  }
  // Several small descriptors that make one planned copy: also done on return.
  src.Fill(5);
  std::vector<TransferDesc> d;
  for (uint64_t i = 0; i < 8; ++i) d.push_back({src.addr() + i * 4096, r.addr + (7 - i) * 4096, 4096});
  xfer::RequestHandle h = 0;
  XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kWrite, d, 10s, &h));
  xfer::RequestStatus st;
  XT_ASSERT_OK(engine_.GetTransferStatus(h, &st));
  EXPECT_EQ(st.state, xfer::RequestState::kCompleted) << "a small planned shm copy was handed off";
  for (uint64_t i = 0; i < 8; ++i) {
    EXPECT_EQ(peer_.SumRange(r.addr + (7 - i) * 4096, 4096), Hash64(src.data() + i * 4096, 4096)) << i;
  }
  // A handle is reported once: asking again is an error, as for any request.
  EXPECT_EQ(engine_.GetTransferStatus(h, &st).code(), StatusCode::kInvalidArgument);
}

// The number of this process's mappings of the peer's segments (memfd "xfer.*").
int MappedSegments() {
  std::ifstream in("/proc/self/maps");
  std::string line;
  int n = 0;
  while (std::getline(in, line)) n += line.find("/memfd:xfer.") != std::string::npos;
  return n;
}

TEST_F(IntegrationShm, PeerKilledWithItsMemoryMappedHere) {
  const PeerRegion r = peer_.ShmAlloc(4 << 20);
  LocalBuffer src(4 << 20);
  src.Fill(5);
  XT_ASSERT_OK(Write({{src.addr(), r.addr, 4 << 20}}));
  EXPECT_GE(MappedSegments(), 1);
  peer_.KillNow();
  // The next transfer fails cleanly (the session ends within the heartbeat timeout), and no
  // mapping of the dead peer's memory lingers.
  ASSERT_TRUE(PollUntil([&] { return !Write({{src.addr(), r.addr, 4096}}, 1s).ok(); }, 10s));
  ASSERT_TRUE(PollUntil([&] { return MappedSegments() == 0; }, 10s));
}

TEST_F(IntegrationShm, InlineCopiesLeaveNoMappingOfAKilledPeer) {
  // Inline copies remember the peer and region they copied to last (per execution slot): the
  // peer's end lets go of them, those of a thread that has stopped copying included.
  const PeerRegion r = peer_.ShmAlloc(1 << 20);
  LocalBuffer src(64 << 10);
  src.Fill(6);
  xfer::MemHandle h = 0;
  XT_ASSERT_OK(engine_.RegisterMem(src.data(), src.len(), xfer::MemType::kHost, &h));
  std::thread other([&] {
    for (uint64_t i = 0; i < 16; ++i) XT_EXPECT_OK(Write({{src.addr() + i * 4096, r.addr + i * 4096, 4096}}));
  });
  other.join();
  for (uint64_t i = 0; i < 16; ++i) XT_ASSERT_OK(Write({{src.addr() + i * 4096, r.addr + i * 4096, 4096}}));
  EXPECT_EQ(peer_.SumRange(r.addr, 64 << 10), src.Hash());
  EXPECT_GE(MappedSegments(), 1);
  peer_.KillNow();
  EXPECT_TRUE(PollUntil([&] { return MappedSegments() == 0; }, 10s)) << MappedSegments() << " mappings left";
  XT_EXPECT_OK(engine_.DeregisterMem(h));
}

// A heartbeat timeout well past the test's 1.5 s batch: the stopped peer is not declared dead
// (which would end the batch early) on a slow machine.
class IntegrationShmPatient : public IntegrationShm {
 protected:
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o;
    o.heartbeat_timeout = std::chrono::seconds(10);
    return o;
  }
};

TEST_F(IntegrationShmPatient, InlineTargetOfASlotBusyWhenItsPeerDiesGoesOnceTheSlotIsFree) {
  // A thread copies inline to the peer, then waits in a tcp batch to a second, stopped peer,
  // holding its execution slot, when the first peer dies. The control thread does not wait for
  // the slot; once the batch has timed out and the thread is gone, the dead peer's mapping
  // goes too (the slot never copies inline again).
  PeerProcess stopped;
  PeerOptions o;
  o.host_id = "another-host";
  o.extra_args = {"--transport", "tcp"};
  std::string err;
  ASSERT_TRUE(stopped.Start(o, &err)) << err;
  XT_ASSERT_OK(engine_.Connect(stopped.name(), 10s));
  const PeerRegion far = stopped.Alloc(4096);
  const PeerRegion r = peer_.ShmAlloc(1 << 20);
  LocalBuffer src(4096);
  xfer::MemHandle h = 0;
  XT_ASSERT_OK(engine_.RegisterMem(src.data(), src.len(), xfer::MemType::kHost, &h));
  stopped.Signal(SIGSTOP);
  std::atomic<bool> inline_done{false};
  xfer::Status held;
  std::thread copier([&] {
    XT_EXPECT_OK(Write({{src.addr(), r.addr, 4096}}));
    inline_done = true;
    held = engine_.TransferSync(stopped.name(), Op::kWrite, {{src.addr(), far.addr, 4096}}, 1500ms);
  });
  EXPECT_TRUE(
      PollUntil([&] { return inline_done.load(); }, 10s));  // (not ASSERT: the copier is joined below)
  std::this_thread::sleep_for(300ms);                       // (the copier waits in its tcp batch now)
  EXPECT_GE(MappedSegments(), 1);
  peer_.KillNow();
  copier.join();
  stopped.Signal(SIGCONT);
  EXPECT_EQ(held.code(), StatusCode::kTimeout) << held.ToString();
  EXPECT_TRUE(PollUntil([&] { return MappedSegments() == 0; }, 5s)) << MappedSegments() << " mappings left";
  XT_EXPECT_OK(engine_.DeregisterMem(h));
}

TEST_F(IntegrationShm, InlineCopiesFollowARegionFreedAndAllocatedAgain) {
  // The region an inline copy remembers is checked on every copy: once it is freed, copies
  // into its range are refused, and they land in the region allocated there next.
  LocalBuffer src(4096);
  xfer::MemHandle h = 0;
  XT_ASSERT_OK(engine_.RegisterMem(src.data(), src.len(), xfer::MemType::kHost, &h));
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE(round);
    const PeerRegion r = peer_.ShmAlloc(1 << 20);
    for (int i = 0; i < 3; ++i) {
      src.Fill(round * 10 + i);
      XT_ASSERT_OK(Write({{src.addr(), r.addr + 8192, 4096}}));
      EXPECT_EQ(peer_.SumRange(r.addr + 8192, 4096), src.Hash());
    }
    Reply f = peer_.Call("free " + std::to_string(r.handle));
    ASSERT_TRUE(f.ok) << f.line;
    EXPECT_EQ(Write({{src.addr(), r.addr + 8192, 4096}}).code(), StatusCode::kRemoteAccessDenied);
  }
  XT_EXPECT_OK(engine_.DeregisterMem(h));
}

TEST_F(IntegrationShm, HugePagesRefusedFallBackToNormalPages) {
  // This machine reserves no huge pages unless someone set vm.nr_hugepages: either way the
  // allocation must work (with a log line when it fell back).
  const PeerRegion r = peer_.ShmAlloc(4 << 20, "huge", true);
  ASSERT_NE(r.addr, 0u);
  LocalBuffer src(4 << 20);
  src.Fill(6);
  XT_ASSERT_OK(Write({{src.addr(), r.addr, 4 << 20}}));
  EXPECT_EQ(peer_.Sum(r), src.Hash());
}

TEST_F(IntegrationShm, DeregisterMemRefusesAllocMemAndFreeMemRefusesRegistered) {
  void* p = nullptr;
  xfer::MemHandle h = 0;
  XT_ASSERT_OK(engine_.AllocMem(8192, xfer::MemType::kHost, &p, &h, "mine"));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(static_cast<unsigned char*>(p)[8191], 0) << "AllocMem memory starts zeroed";
  EXPECT_EQ(engine_.DeregisterMem(h).code(), StatusCode::kInvalidArgument);
  LocalBuffer mine(4096);
  xfer::MemHandle r = 0;
  XT_ASSERT_OK(engine_.RegisterMem(mine.data(), 4096, xfer::MemType::kHost, &r));
  EXPECT_EQ(engine_.FreeMem(r).code(), StatusCode::kInvalidArgument);
  XT_EXPECT_OK(engine_.DeregisterMem(r));
  XT_EXPECT_OK(engine_.FreeMem(h));
  EXPECT_EQ(engine_.FreeMem(h).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_.AllocMem(0, xfer::MemType::kHost, &p, &h).code(), StatusCode::kInvalidArgument);
  if (xfer::transport::cuda::Available(nullptr)) {  // (GPU memory is AllocMem's too, then)
    XT_EXPECT_OK(engine_.AllocMem(4096, xfer::MemType::kCuda, &p, &h));
    EXPECT_EQ(engine_.DeregisterMem(h).code(), StatusCode::kInvalidArgument);
    XT_EXPECT_OK(engine_.FreeMem(h));
  } else {
    EXPECT_EQ(engine_.AllocMem(4096, xfer::MemType::kCuda, &p, &h).code(), StatusCode::kUnsupported);
  }
}

TEST_F(IntegrationShm, PeerWritesIntoOurAllocMemThroughShm) {
  void* p = nullptr;
  xfer::MemHandle h = 0;
  XT_ASSERT_OK(engine_.AllocMem(1 << 20, xfer::MemType::kHost, &p, &h, "landing"));
  const uint64_t src = peer_.Buf(1 << 20);
  peer_.FillRange(src, 1 << 20, 11);
  Reply w = peer_.Xfer("write", engine_.LocalName(), 10000, src, reinterpret_cast<uint64_t>(p), 1 << 20);
  ASSERT_TRUE(w.ok) << w.line;
  EXPECT_EQ(Hash64(p, 1 << 20), peer_.SumRange(src, 1 << 20));
  Reply info = peer_.Call("info " + engine_.LocalName());
  ASSERT_TRUE(info.ok) << info.line;
  EXPECT_EQ(info.words.at(5), "1") << "the peer did not map our memory: " << info.line;
  EXPECT_EQ(info.u64(6), 1u << 20) << info.line;
  XT_EXPECT_OK(engine_.FreeMem(h));
}

class IntegrationShmStreaming : public IntegrationShm {
 protected:
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o;
    o.shm.streaming_copy_bytes = 4096;  // every descriptor of a page or more streams
    o.slice_bytes = 64 << 10;           // and is cut into pieces several streams share
    return o;
  }
};

TEST_F(IntegrationShmStreaming, NonTemporalCopiesMoveTheSameBytes) {
  constexpr uint64_t kLen = 8 << 20;
  const PeerRegion r = peer_.ShmAlloc(kLen + 64);
  LocalBuffer src(kLen), back(kLen);
  for (uint64_t at : {0ull, 1ull, 17ull, 63ull}) {
    SCOPED_TRACE(at);
    src.Fill(at + 1);
    XT_ASSERT_OK(Write({{src.addr(), r.addr + at, kLen - at}}));
    EXPECT_EQ(peer_.SumRange(r.addr + at, kLen - at), Hash64(src.data(), kLen - at));
    XT_ASSERT_OK(Read({{back.addr() + at, r.addr + at, kLen - at}}));
    EXPECT_EQ(Hash64(back.data() + at, kLen - at), Hash64(src.data(), kLen - at));
  }
}

class IntegrationShmForced : public IntegrationShm {
 protected:
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o;
    o.transport = "shm";
    return o;
  }
};

TEST_F(IntegrationShmForced, OnlyAllocMemMemoryIsReachable) {
  EXPECT_EQ(Info().transport, "shm");
  const PeerRegion shared = peer_.ShmAlloc(4096);
  const PeerRegion plain = peer_.Alloc(4096);
  LocalBuffer src(4096);
  src.Fill(8);
  XT_ASSERT_OK(Write({{src.addr(), shared.addr, 4096}}));
  const xfer::Status s = Write({{src.addr(), plain.addr, 4096}});
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.ToString();
  EXPECT_NE(s.message().find("AllocMem"), std::string::npos) << s.message();
}

class IntegrationShmOff : public IntegrationShm {
 protected:
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o;
    o.transport = "cma";
    return o;
  }
};

TEST_F(IntegrationShmOff, ForcingCmaLeavesAllocMemToCma) {
  const PeerRegion shared = peer_.ShmAlloc(1 << 20);
  LocalBuffer src(1 << 20);
  src.Fill(9);
  XT_ASSERT_OK(Write({{src.addr(), shared.addr, 1 << 20}}));
  EXPECT_EQ(peer_.Sum(shared), src.Hash());
  const xfer::PeerInfo info = Info();
  EXPECT_FALSE(info.Reaches("shm"));
  EXPECT_EQ(info.BytesVia("shm"), 0u);
  EXPECT_EQ(info.BytesVia(info.transport), 1u << 20);
}

}  // namespace
}  // namespace xfer_test
