// Two-process READ/WRITE correctness: sizes, batches, sync/async, threads, registration after
// connect, self-transfers, transport choice.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "test_common.h"

namespace xfer_test {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kMiB = 1ull << 20;

// Index of the first differing byte, or -1.
int64_t FirstDiff(const unsigned char* a, const unsigned char* b, uint64_t len) {
  if (std::memcmp(a, b, len) == 0) return -1;
  for (uint64_t i = 0; i < len; ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

// ---------------------------------------------------------------------------------------------
// One descriptor, sizes 1 B .. 64 MiB, remote and local addresses deliberately misaligned.

class IntegrationSizes : public PeerFixture, public ::testing::WithParamInterface<uint64_t> {};

TEST_P(IntegrationSizes, WriteThenReadBack) {
  const uint64_t size = GetParam();
  constexpr uint64_t kGuard = 61;  // bytes around the target range that must not change
  const PeerRegion r = peer_.Alloc(size + 2 * kGuard, "sizes");
  ASSERT_NE(r.addr, 0u);
  const uint64_t region_seed = 1000 + size;
  peer_.Fill(r, region_seed);
  LocalBuffer image(r.len);  // what the region holds before the write
  image.Fill(region_seed);

  LocalBuffer src(size);
  src.Fill(7 + size);
  XT_ASSERT_OK(Write({{src.addr(), r.addr + kGuard, size}}));

  EXPECT_EQ(peer_.SumRange(r.addr + kGuard, size), src.Hash()) << "written bytes differ";
  EXPECT_EQ(peer_.SumRange(r.addr, kGuard), Hash64(image.data(), kGuard))
      << "bytes before the target range changed";
  EXPECT_EQ(peer_.SumRange(r.addr + kGuard + size, kGuard), Hash64(image.data() + kGuard + size, kGuard))
      << "bytes after the target range changed";

  LocalBuffer back(size);
  XT_ASSERT_OK(Read({{back.addr(), r.addr + kGuard, size}}));
  EXPECT_EQ(FirstDiff(back.data(), src.data(), size), -1);
}

TEST_P(IntegrationSizes, ReadFreshRemoteData) {
  const uint64_t size = GetParam();
  const PeerRegion r = peer_.Alloc(size + 3, "sizes");
  ASSERT_NE(r.addr, 0u);
  const uint64_t seed = 555 + size;
  peer_.FillRange(r.addr + 3, size, seed);
  LocalBuffer want(size);
  want.Fill(seed);

  LocalBuffer dst(size + 2);  // read into dst+1: an odd local address, with a byte either side
  XT_ASSERT_OK(Read({{dst.addr() + 1, r.addr + 3, size}}));
  EXPECT_EQ(FirstDiff(dst.data() + 1, want.data(), size), -1);
  EXPECT_EQ(dst.data()[0], 0) << "READ wrote before the local range";
  EXPECT_EQ(dst.data()[size + 1], 0) << "READ wrote after the local range";
  EXPECT_EQ(peer_.SumRange(r.addr + 3, size), want.Hash()) << "READ changed the source";
}

INSTANTIATE_TEST_SUITE_P(Bytes, IntegrationSizes, ::testing::Values(1, 7, 4096, 65537, kMiB + 3, 64 * kMiB),
                         [](const ::testing::TestParamInfo<uint64_t>& i) {
                           return "B" + std::to_string(i.param);
                         });

// ---------------------------------------------------------------------------------------------
// Batches: many descriptors in one request, scattered or adjacent, in order or shuffled.

struct BatchCase {
  const char* name;
  uint64_t count;
  uint64_t len;
  uint64_t remote_stride;  // == len: remote pieces adjacent
  uint64_t local_stride;   // == len: local pieces adjacent
  bool shuffled;           // descriptors in random order of remote slot
};

void PrintTo(const BatchCase& c, std::ostream* os) { *os << c.name; }

class IntegrationBatch : public PeerFixture, public ::testing::WithParamInterface<BatchCase> {};

TEST_P(IntegrationBatch, WriteAndReadScattered) {
  const BatchCase c = GetParam();
  const uint64_t remote_len = c.count * c.remote_stride;
  const uint64_t local_len = c.count * c.local_stride;
  const PeerRegion r = peer_.Alloc(remote_len, "batch");
  ASSERT_NE(r.addr, 0u);
  peer_.Fill(r, 42);
  LocalBuffer expected(remote_len);  // the region as it must look after the WRITE
  expected.Fill(42);

  std::vector<uint64_t> slot(c.count);
  std::iota(slot.begin(), slot.end(), 0);
  if (c.shuffled) std::shuffle(slot.begin(), slot.end(), std::mt19937_64(c.count));

  LocalBuffer src(local_len);
  src.Fill(43);
  std::vector<TransferDesc> descs(c.count);
  for (uint64_t i = 0; i < c.count; ++i) {
    descs[i] = {src.addr() + i * c.local_stride, r.addr + slot[i] * c.remote_stride, c.len};
    std::memcpy(expected.data() + slot[i] * c.remote_stride, src.data() + i * c.local_stride, c.len);
  }
  const auto t0 = Clock::now();
  XT_ASSERT_OK(Write(descs));
  const double write_s = SecondsSince(t0);

  EXPECT_EQ(peer_.Sum(r), expected.Hash()) << "peer region differs from the expected image";
  LocalBuffer whole(remote_len);
  XT_ASSERT_OK(Read({{whole.addr(), r.addr, remote_len}}));
  EXPECT_EQ(FirstDiff(whole.data(), expected.data(), remote_len), -1);

  // READ the same scattered pieces back into a zeroed local buffer.
  LocalBuffer dst(local_len);
  LocalBuffer dst_expected(local_len);
  std::vector<TransferDesc> rdescs(c.count);
  for (uint64_t i = 0; i < c.count; ++i) {
    rdescs[i] = {dst.addr() + i * c.local_stride, r.addr + slot[i] * c.remote_stride, c.len};
    std::memcpy(dst_expected.data() + i * c.local_stride, expected.data() + slot[i] * c.remote_stride, c.len);
  }
  XT_ASSERT_OK(Read(rdescs));
  EXPECT_EQ(FirstDiff(dst.data(), dst_expected.data(), local_len), -1);
  RecordProperty("write_seconds", std::to_string(write_s));
}

INSTANTIATE_TEST_SUITE_P(Descs, IntegrationBatch,
                         ::testing::Values(BatchCase{"One1MiB", 1, kMiB, kMiB, kMiB, false},
                                           BatchCase{"K1x4KiB_gaps", 1000, 4096, 8192, 4096, false},
                                           BatchCase{"K1x16KiB_shuffled", 1000, 16384, 16384, 20000, true},
                                           BatchCase{"K100x64B_scattered", 100000, 64, 128, 96, false},
                                           BatchCase{"K100x64B_adjacent", 100000, 64, 64, 64, false},
                                           BatchCase{"K100x64B_shuffled", 100000, 64, 64, 64, true},
                                           BatchCase{"K100x1B_scattered", 100000, 1, 3, 2, false}),
                         [](const ::testing::TestParamInfo<BatchCase>& i) {
                           return std::string(i.param.name);
                         });

// ---------------------------------------------------------------------------------------------
// Async, concurrency.

class IntegrationTransfer : public PeerFixture {};

TEST_F(IntegrationTransfer, AsyncWriteWaitThenPollRead) {
  const uint64_t len = 8 * kMiB;
  const PeerRegion r = peer_.Alloc(len, "async");
  ASSERT_NE(r.addr, 0u);
  LocalBuffer src(len);
  src.Fill(9);
  std::vector<TransferDesc> descs;
  for (uint64_t off = 0; off < len; off += kMiB) descs.push_back({src.addr() + off, r.addr + off, kMiB});

  xfer::RequestHandle req = 0;
  XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kWrite, descs, 30s, &req));
  ASSERT_NE(req, 0u);
  Outcome o = WaitFor(engine_, req);
  XT_ASSERT_OK(o.wait);
  EXPECT_EQ(o.status.state, RequestState::kCompleted);
  EXPECT_EQ(peer_.Sum(r), src.Hash());
  // Wait reported the terminal status, so the handle is released.
  xfer::RequestStatus st;
  XT_EXPECT_CODE(engine_.GetTransferStatus(req, &st), StatusCode::kInvalidArgument);

  // READ, polled with GetTransferStatus.
  LocalBuffer dst(len);
  xfer::RequestHandle req2 = 0;
  XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kRead, {{dst.addr(), r.addr, len}}, 30s, &req2));
  ASSERT_NE(req2, 0u);
  EXPECT_NE(req2, req) << "request handles should not be reused at once";
  const auto t0 = Clock::now();
  xfer::RequestStatus polled;
  for (;;) {
    XT_ASSERT_OK(engine_.GetTransferStatus(req2, &polled));
    if (polled.state != RequestState::kWaiting) break;
    ASSERT_LT(SecondsSince(t0), 30.0) << "request never ended";
    std::this_thread::sleep_for(100us);
  }
  EXPECT_EQ(polled.state, RequestState::kCompleted) << polled.status.ToString();
  EXPECT_TRUE(polled.status.ok()) << polled.status.ToString();
  EXPECT_EQ(FirstDiff(dst.data(), src.data(), len), -1);
  // The terminal status was reported once; the handle is gone now.
  XT_EXPECT_CODE(engine_.GetTransferStatus(req2, &polled), StatusCode::kInvalidArgument);
  XT_EXPECT_CODE(engine_.Wait(req2, 10ms), StatusCode::kInvalidArgument);
}

TEST_F(IntegrationTransfer, ManyAsyncRequestsInFlight) {
  constexpr int kRequests = 64;
  constexpr uint64_t kPiece = 256 * 1024;
  const PeerRegion r = peer_.Alloc(kRequests * kPiece, "many");
  ASSERT_NE(r.addr, 0u);
  LocalBuffer src(kRequests * kPiece);
  src.Fill(77);
  std::vector<xfer::RequestHandle> reqs(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    XT_ASSERT_OK(engine_.TransferAsync(
        peer_.name(), Op::kWrite, {{src.addr() + i * kPiece, r.addr + i * kPiece, kPiece}}, 30s, &reqs[i]));
  }
  // Wait in reverse order of issue.
  for (int i = kRequests - 1; i >= 0; --i) {
    Outcome o = WaitFor(engine_, reqs[i]);
    EXPECT_TRUE(o.wait.ok()) << "request " << i << ": " << o.wait.ToString();
    EXPECT_EQ(o.status.state, RequestState::kCompleted);
  }
  EXPECT_EQ(peer_.Sum(r), src.Hash());
}

TEST_F(IntegrationTransfer, ConcurrentThreadsSamePeer) {
  constexpr int kThreads = 8;
  constexpr int kIters = 25;
  constexpr uint64_t kSlice = 512 * 1024 + 17;
  const PeerRegion r = peer_.Alloc(kThreads * kSlice, "threads");
  ASSERT_NE(r.addr, 0u);
  std::atomic<int> failures{0};
  std::mutex mu;
  std::string first_failure;
  auto fail = [&](const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    if (failures++ == 0) first_failure = what;
  };
  std::vector<std::unique_ptr<LocalBuffer>> finals;
  for (int t = 0; t < kThreads; ++t) finals.push_back(std::make_unique<LocalBuffer>(kSlice));

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      LocalBuffer& src = *finals[t];
      LocalBuffer dst(kSlice);
      const uint64_t remote = r.addr + t * kSlice;
      for (int it = 0; it < kIters; ++it) {
        src.Fill(t * 1000 + it);
        // Half the writes sync, half async; the read splits the slice into 3 descriptors.
        xfer::Status s;
        if (it % 2 == 0) {
          s = engine_.TransferSync(peer_.name(), Op::kWrite, {{src.addr(), remote, kSlice}}, 30s);
        } else {
          xfer::RequestHandle req = 0;
          s = engine_.TransferAsync(peer_.name(), Op::kWrite, {{src.addr(), remote, kSlice}}, 30s, &req);
          if (s.ok()) s = engine_.Wait(req, 30s);
        }
        if (!s.ok()) return fail("thread " + std::to_string(t) + " write: " + s.ToString());
        std::memset(dst.data(), 0, kSlice);
        const uint64_t a = 1000, b = 300000;
        s = engine_.TransferSync(peer_.name(), Op::kRead,
                                 {{dst.addr() + b, remote + b, kSlice - b},
                                  {dst.addr(), remote, a},
                                  {dst.addr() + a, remote + a, b - a}},
                                 30s);
        if (!s.ok()) return fail("thread " + std::to_string(t) + " read: " + s.ToString());
        if (std::memcmp(dst.data(), src.data(), kSlice) != 0) {
          return fail("thread " + std::to_string(t) + " iteration " + std::to_string(it) +
                      ": data read back differs from data written");
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0) << first_failure;
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(peer_.SumRange(r.addr + t * kSlice, kSlice), finals[t]->Hash()) << "slice " << t;
  }
}

// utime + stime of a process, in clock ticks, from /proc/<pid>/stat.
uint64_t CpuTicks(pid_t pid) {
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (f == nullptr) return 0;
  char buf[4096];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* p = std::strrchr(buf, ')');  // the command name may contain spaces
  if (p == nullptr) return 0;
  unsigned long long utime = 0, stime = 0;
  // Fields after ')': state(3) ... utime is field 14, stime 15.
  if (std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime, &stime) != 2) {
    return 0;
  }
  return utime + stime;
}

TEST_F(IntegrationTransfer, IdleEnginesUseNoCpu) {
  // Wake every stream and waiter first, then stay idle for a second: both engines must sleep
  // (bounded spinning), costing no more than heartbeats.
  const PeerRegion r = peer_.Alloc(16 * kMiB);
  LocalBuffer src(16 * kMiB);
  src.Fill(1);
  XT_ASSERT_OK(Write({{src.addr(), r.addr, r.len}}));
  xfer::RequestHandle req = 0;
  XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kRead, {{src.addr(), r.addr, r.len}}, 10s, &req));
  XT_ASSERT_OK(engine_.Wait(req, 10s));
  std::this_thread::sleep_for(100ms);
  const long hz = sysconf(_SC_CLK_TCK);
  const uint64_t ours0 = CpuTicks(getpid()), theirs0 = CpuTicks(peer_.pid());
  std::this_thread::sleep_for(1s);
  const uint64_t ours = CpuTicks(getpid()) - ours0, theirs = CpuTicks(peer_.pid()) - theirs0;
  EXPECT_LE(ours * 1000 / hz, 50u) << "this (idle) process used " << ours * 1000 / hz << " ms of CPU in 1 s";
  EXPECT_LE(theirs * 1000 / hz, 50u) << "the idle peer used " << theirs * 1000 / hz << " ms of CPU in 1 s";
}

// ---------------------------------------------------------------------------------------------
// Regions: registration after connect, listing, re-registration.

TEST_F(IntegrationTransfer, RegistrationAfterConnectIsUsableAtOnce) {
  std::vector<xfer::RegionInfo> before;
  XT_ASSERT_OK(engine_.GetRemoteRegions(peer_.name(), &before));
  EXPECT_TRUE(before.empty()) << "the fresh peer registered nothing yet";

  const PeerRegion r = peer_.Alloc(kMiB + 1, "late_region");
  ASSERT_NE(r.addr, 0u);
  // No reconnect, no sleep: the transfer right after the peer's RegisterMem returned.
  LocalBuffer src(r.len);
  src.Fill(5);
  XT_ASSERT_OK(Write({{src.addr(), r.addr, r.len}}));
  EXPECT_EQ(peer_.Sum(r), src.Hash());

  std::vector<xfer::RegionInfo> after;
  XT_ASSERT_OK(engine_.GetRemoteRegions(peer_.name(), &after));
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].addr, r.addr);
  EXPECT_EQ(after[0].len, r.len);
  EXPECT_EQ(after[0].tag, "late_region");
  EXPECT_EQ(after[0].type, xfer::MemType::kHost);
  EXPECT_EQ(after[0].device, -1);

  // A second one, then deregister the first: the listing follows.
  const PeerRegion r2 = peer_.Alloc(4096, "second");
  ASSERT_NE(r2.addr, 0u);
  ASSERT_TRUE(peer_.Call("dereg " + std::to_string(r.handle)).ok);
  XT_ASSERT_OK(engine_.GetRemoteRegions(peer_.name(), &after));
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].addr, r2.addr);
  EXPECT_EQ(after[0].tag, "second");
}

TEST_F(IntegrationTransfer, ReRegisteringSameRangeReturnsSameHandle) {
  LocalBuffer mem(64 * 1024);
  xfer::MemHandle h1 = 0, h2 = 0, h3 = 0;
  XT_ASSERT_OK(engine_.RegisterMem(mem.data(), mem.len(), xfer::MemType::kHost, &h1, "a"));
  XT_ASSERT_OK(engine_.RegisterMem(mem.data(), mem.len(), xfer::MemType::kHost, &h2, "a"));
  EXPECT_NE(h1, 0u);
  EXPECT_EQ(h1, h2);
  // A different range (a sub-range) is a different registration.
  XT_ASSERT_OK(engine_.RegisterMem(mem.data(), 4096, xfer::MemType::kHost, &h3, "b"));
  EXPECT_NE(h3, h1);
  XT_EXPECT_OK(engine_.DeregisterMem(h3));
  // Registered twice: two deregistrations, the third is an unknown handle.
  XT_EXPECT_OK(engine_.DeregisterMem(h1));
  XT_EXPECT_OK(engine_.DeregisterMem(h1));
  XT_EXPECT_CODE(engine_.DeregisterMem(h1), StatusCode::kInvalidArgument);

  // Same on the peer side, through a real process.
  const uint64_t addr = peer_.Buf(8192);
  const std::string reg = "reg " + std::to_string(addr) + " 8192 t";
  Reply a = peer_.Call(reg), b = peer_.Call(reg);
  ASSERT_TRUE(a.ok && b.ok) << a.line << " / " << b.line;
  EXPECT_EQ(a.u64(0), b.u64(0));
  // Still registered after one deregistration: a transfer into it works.
  ASSERT_TRUE(peer_.Call("dereg " + a.words[0]).ok);
  LocalBuffer src(8192);
  src.Fill(3);
  XT_EXPECT_OK(Write({{src.addr(), addr, 8192}}));
  EXPECT_EQ(peer_.SumRange(addr, 8192), src.Hash());
}

TEST_F(IntegrationTransfer, NestedRegionsEachCoverTheirOwnRange) {
  // outer = [a, a+1 MiB); inner = [a+256 KiB, a+512 KiB), registered separately. A range that
  // starts inside inner and runs past its end still lies within outer: it is allowed.
  const PeerRegion outer = peer_.Alloc(kMiB, "outer");
  ASSERT_NE(outer.addr, 0u);
  const uint64_t in_addr = outer.addr + 256 * 1024, in_len = 256 * 1024;
  Reply inner = peer_.Call("reg " + std::to_string(in_addr) + " " + std::to_string(in_len) + " inner");
  ASSERT_TRUE(inner.ok) << inner.line;
  LocalBuffer src(kMiB);
  src.Fill(12);
  const uint64_t start = in_addr + 4096, len = 512 * 1024;  // ends 252 KiB past inner's end
  XT_EXPECT_OK(Write({{src.addr(), start, len}}));
  EXPECT_EQ(peer_.SumRange(start, len), Hash64(src.data(), len));
  XT_EXPECT_OK(Write({{src.addr(), in_addr - 8, 16}}));  // across inner's start
  // Deregistering inner leaves outer's coverage intact.
  ASSERT_TRUE(peer_.Call("dereg " + inner.words[0]).ok);
  src.Fill(13);
  XT_EXPECT_OK(Write({{src.addr(), in_addr, in_len}}));
  EXPECT_EQ(peer_.SumRange(in_addr, in_len), Hash64(src.data(), in_len));
  // Deregistering outer too: now nothing covers it.
  ASSERT_TRUE(peer_.Call("dereg " + std::to_string(outer.handle)).ok);
  XT_EXPECT_CODE(Write({{src.addr(), in_addr, 64}}), StatusCode::kRemoteAccessDenied);
}

TEST_F(IntegrationTransfer, ReRegisteringAfterDeregistrationIsUsableAtOnce) {
  const uint64_t addr = peer_.Buf(65536);
  LocalBuffer src(65536);
  for (int round = 0; round < 20; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    Reply reg = peer_.Call("reg " + std::to_string(addr) + " 65536 again");
    ASSERT_TRUE(reg.ok) << reg.line;
    src.Fill(round);
    XT_ASSERT_OK(Write({{src.addr(), addr, 65536}}));
    EXPECT_EQ(peer_.SumRange(addr, 65536), src.Hash());
    ASSERT_TRUE(peer_.Call("dereg " + reg.words[0]).ok);
    XT_EXPECT_CODE(Write({{src.addr(), addr, 65536}}), StatusCode::kRemoteAccessDenied);
  }
}

TEST_F(IntegrationTransfer, FiveHundredRegionsOneBatch) {
  // Many registrations after connect; one request touching the last bytes of every region.
  constexpr int kRegions = 500;
  std::vector<PeerRegion> regions;
  for (int i = 0; i < kRegions; ++i) {
    regions.push_back(peer_.Alloc(4096 + i, "r" + std::to_string(i)));
    ASSERT_NE(regions.back().addr, 0u);
  }
  std::vector<xfer::RegionInfo> listed;
  XT_ASSERT_OK(engine_.GetRemoteRegions(peer_.name(), &listed));
  EXPECT_EQ(listed.size(), static_cast<size_t>(kRegions));
  LocalBuffer src(kRegions * 16);
  src.Fill(44);
  std::vector<TransferDesc> d;
  for (int i = 0; i < kRegions; ++i) {
    d.push_back({src.addr() + i * 16, regions[i].addr + regions[i].len - 16, 16});
  }
  XT_ASSERT_OK(Write(d));
  for (int i = 0; i < kRegions; i += 97) {
    EXPECT_EQ(peer_.SumRange(regions[i].addr + regions[i].len - 16, 16), Hash64(src.data() + i * 16, 16))
        << "region " << i;
  }
  LocalBuffer back(kRegions * 16);
  std::vector<TransferDesc> rd = d;
  for (auto& x : rd) x.local_addr = x.local_addr - src.addr() + back.addr();
  XT_ASSERT_OK(Read(rd));
  EXPECT_EQ(FirstDiff(back.data(), src.data(), src.len()), -1);
}

TEST_F(IntegrationTransfer, ThreeTargetsConcurrently) {
  constexpr int kPeers = 3;
  constexpr uint64_t kLen = 8 * kMiB;
  std::vector<std::unique_ptr<PeerProcess>> peers;
  std::vector<PeerRegion> regions;
  for (int i = 0; i < kPeers; ++i) {
    peers.push_back(std::make_unique<PeerProcess>());
    std::string err;
    ASSERT_TRUE(peers.back()->Start({}, &err)) << err;
    XT_ASSERT_OK(engine_.Connect(peers.back()->name(), 10s));
    regions.push_back(peers.back()->Alloc(kLen, "p" + std::to_string(i)));
  }
  std::vector<std::unique_ptr<LocalBuffer>> srcs;
  for (int i = 0; i < kPeers; ++i) {
    srcs.push_back(std::make_unique<LocalBuffer>(kLen));
    srcs.back()->Fill(500 + i);
  }
  std::vector<std::thread> threads;
  std::vector<xfer::Status> results(kPeers);
  for (int i = 0; i < kPeers; ++i) {
    threads.emplace_back([&, i] {
      std::vector<TransferDesc> d;
      for (uint64_t off = 0; off < kLen; off += 64 * 1024) {
        d.push_back({srcs[i]->addr() + off, regions[i].addr + off, 64 * 1024});
      }
      results[i] = engine_.TransferSync(peers[i]->name(), Op::kWrite, d, 30s);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kPeers; ++i) {
    XT_EXPECT_OK(results[i]);
    EXPECT_EQ(peers[i]->Sum(regions[i]), srcs[i]->Hash()) << "peer " << i;
  }
}

TEST_F(IntegrationTransfer, SimultaneousConnectBothWays) {
  // Both sides Connect to each other at the same moment: one session must result, usable
  // both ways, whichever Connect "wins".
  for (int round = 0; round < 5; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    xfer::Engine e;
    XT_ASSERT_OK(e.Initialize("127.0.0.1:0"));
    LocalBuffer mine(4096);
    xfer::MemHandle h = 0;
    XT_ASSERT_OK(e.RegisterMem(mine.data(), 4096, xfer::MemType::kHost, &h, "mine"));
    ASSERT_TRUE(peer_.Send("connect " + e.LocalName() + " 5000"));
    const xfer::Status ours = e.Connect(peer_.name(), 5s);
    const Reply theirs = peer_.ReadReply(10s);
    EXPECT_TRUE(ours.ok() || ours.code() == StatusCode::kAlreadyConnected) << ours.ToString();
    EXPECT_TRUE(theirs.ok || theirs.code() == "ALREADY_CONNECTED") << theirs.line;
    EXPECT_TRUE(ours.ok() || theirs.ok) << "neither Connect succeeded";
    xfer::PeerInfo info;
    ASSERT_TRUE(PollUntil([&] { return e.GetPeerInfo(peer_.name(), &info).ok(); }, 5s));
    ASSERT_TRUE(PollUntil([&] { return peer_.Call("info " + e.LocalName()).ok; }, 5s));

    // Usable both ways.
    const PeerRegion r = peer_.Alloc(4096);
    LocalBuffer src(4096);
    src.Fill(round);
    XT_EXPECT_OK(e.TransferSync(peer_.name(), Op::kWrite, {{src.addr(), r.addr, 4096}}, 10s));
    EXPECT_EQ(peer_.Sum(r), src.Hash());
    const Reply w = peer_.Xfer("write", e.LocalName(), 10000, r.addr, mine.addr(), 4096);
    EXPECT_TRUE(w.ok) << w.line;
    EXPECT_EQ(mine.Hash(), src.Hash());
    XT_EXPECT_OK(e.DeregisterMem(h));
  }
}

// ---------------------------------------------------------------------------------------------
// Transport choice and identity.

TEST_F(IntegrationTransfer, PeerInfoShowsCmaBothWays) {
  xfer::PeerInfo info;
  XT_ASSERT_OK(engine_.GetPeerInfo(peer_.name(), &info));
  EXPECT_EQ(info.transport, "cma");
  EXPECT_EQ(info.name, peer_.name());
  EXPECT_EQ(info.pid, peer_.pid());
  EXPECT_TRUE(info.outbound);
  EXPECT_NE(info.incarnation, 0u);
  EXPECT_FALSE(info.host_id.empty());

  // The target sees us as an inbound peer under our listen name.
  Reply r = peer_.Call("info " + engine_.LocalName());
  ASSERT_TRUE(r.ok) << r.line;
  ASSERT_GE(r.words.size(), 5u);
  EXPECT_EQ(r.words[0], "cma");
  EXPECT_EQ(r.u64(2), static_cast<uint64_t>(getpid()));
  EXPECT_EQ(r.words[3], "0") << "inbound session reported as outbound";
  EXPECT_EQ(r.words[4], engine_.LocalName());
}

TEST_F(IntegrationTransfer, TargetWritesAndReadsInitiatorOverSameSession) {
  // The peer uses the session we opened to move data into and out of our memory.
  LocalBuffer mine(3 * kMiB + 5);
  mine.Fill(11);
  xfer::MemHandle h = 0;
  XT_ASSERT_OK(engine_.RegisterMem(mine.data(), mine.len(), xfer::MemType::kHost, &h, "test_side"));

  Reply regions = peer_.Call("regions " + engine_.LocalName());
  ASSERT_TRUE(regions.ok) << regions.line;
  ASSERT_EQ(regions.u64(0), 1u) << regions.line;
  EXPECT_EQ(regions.words[1], std::to_string(mine.addr()) + ":" + std::to_string(mine.len()) + ":test_side");

  const uint64_t pbuf = peer_.Buf(mine.len());
  peer_.FillRange(pbuf, mine.len(), 12);
  Reply w = peer_.Xfer("write", engine_.LocalName(), 30000, pbuf, mine.addr(), mine.len());
  ASSERT_TRUE(w.ok) << w.line;
  LocalBuffer want(mine.len());
  want.Fill(12);
  EXPECT_EQ(FirstDiff(mine.data(), want.data(), mine.len()), -1);

  mine.Fill(13);
  Reply rd = peer_.Xfer("read", engine_.LocalName(), 30000, pbuf, mine.addr(), mine.len());
  ASSERT_TRUE(rd.ok) << rd.line;
  EXPECT_EQ(peer_.SumRange(pbuf, mine.len()), mine.Hash());
  XT_EXPECT_OK(engine_.DeregisterMem(h));
}

class IntegrationConnect : public PeerFixture {
 protected:
  bool ConnectInSetUp() override { return false; }
};

TEST_F(IntegrationConnect, DifferentHostIdsPickTcpNeverCma) {
  std::string err;
  PeerProcess other;
  PeerOptions po;
  po.host_id = "fake-host-B";
  ASSERT_TRUE(other.Start(po, &err)) << err;
  xfer::EngineOptions eo;
  eo.host_id = "fake-host-A";
  eo.ucx.mode = xfer::UcxMode::kOff;  // (with ucx, it is preferred over tcp: tests/integration/ucx_test.cc)
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0", eo));
  XT_ASSERT_OK(e.Connect(other.name(), 10s));
  xfer::PeerInfo info;
  XT_ASSERT_OK(e.GetPeerInfo(other.name(), &info));
  EXPECT_EQ(info.transport, "tcp") << "a peer on another host must get tcp, never cma";
  EXPECT_EQ(info.host_id, "fake-host-B");
  const PeerRegion r = other.Alloc(1 << 20);
  LocalBuffer src(1 << 20);
  src.Fill(77);
  XT_ASSERT_OK(e.TransferSync(other.name(), Op::kWrite, {{src.addr(), r.addr, src.len()}}, 10s));
  EXPECT_EQ(other.Sum(r), src.Hash());
}

TEST_F(IntegrationConnect, SameOverriddenHostIdUsesCma) {
  std::string err;
  PeerProcess other;
  PeerOptions po;
  po.host_id = "fake-host-same";
  ASSERT_TRUE(other.Start(po, &err)) << err;
  xfer::EngineOptions eo;
  eo.host_id = "fake-host-same";
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0", eo));
  XT_ASSERT_OK(e.Connect(other.name(), 10s));
  xfer::PeerInfo info;
  XT_ASSERT_OK(e.GetPeerInfo(other.name(), &info));
  EXPECT_EQ(info.transport, "cma");
  EXPECT_EQ(info.host_id, "fake-host-same");
  const PeerRegion r = other.Alloc(4096);
  LocalBuffer src(4096);
  src.Fill(1);
  XT_EXPECT_OK(e.TransferSync(other.name(), Op::kWrite, {{src.addr(), r.addr, 4096}}, 10s));
  EXPECT_EQ(other.Sum(r), src.Hash());
}

TEST_F(IntegrationConnect, ClientOnlyEngineCanWriteAndRead) {
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1"));
  XT_ASSERT_OK(e.Connect(peer_.name(), 10s));
  const PeerRegion r = peer_.Alloc(kMiB);
  LocalBuffer src(kMiB), dst(kMiB);
  src.Fill(21);
  XT_ASSERT_OK(e.TransferSync(peer_.name(), Op::kWrite, {{src.addr(), r.addr, kMiB}}, 10s));
  XT_ASSERT_OK(e.TransferSync(peer_.name(), Op::kRead, {{dst.addr(), r.addr, kMiB}}, 10s));
  EXPECT_EQ(peer_.Sum(r), src.Hash());
  EXPECT_EQ(FirstDiff(dst.data(), src.data(), kMiB), -1);
}

TEST_F(IntegrationConnect, AutoConnectOnFirstTransfer) {
  xfer::EngineOptions eo;
  eo.auto_connect = true;
  eo.auto_connect_timeout = 10s;
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0", eo));
  const PeerRegion r = peer_.Alloc(65536);
  LocalBuffer src(65536);
  src.Fill(8);
  // No Connect: the first transfer connects. The region is found on the fresh session.
  XT_ASSERT_OK(e.TransferSync(peer_.name(), Op::kWrite, {{src.addr(), r.addr, 65536}}, 10s));
  EXPECT_EQ(peer_.Sum(r), src.Hash());
  xfer::PeerInfo info;
  XT_EXPECT_OK(e.GetPeerInfo(peer_.name(), &info));
  EXPECT_TRUE(info.outbound);
}

TEST_F(IntegrationTransfer, DisconnectThenReconnect) {
  const PeerRegion r = peer_.Alloc(4096);
  LocalBuffer src(4096);
  src.Fill(31);
  XT_ASSERT_OK(engine_.Disconnect(peer_.name()));
  XT_EXPECT_CODE(Write({{src.addr(), r.addr, 4096}}), StatusCode::kNotConnected);
  xfer::PeerInfo info;
  XT_EXPECT_CODE(engine_.GetPeerInfo(peer_.name(), &info), StatusCode::kNotConnected);
  XT_EXPECT_CODE(engine_.Disconnect(peer_.name()), StatusCode::kNotConnected);
  // The peer notices the goodbye.
  EXPECT_TRUE(PollUntil([&] { return !peer_.Call("info " + engine_.LocalName()).ok; }, 5s))
      << "the target still lists a session after our Disconnect";
  XT_ASSERT_OK(engine_.Connect(peer_.name(), 10s));
  XT_EXPECT_OK(Write({{src.addr(), r.addr, 4096}}));
  EXPECT_EQ(peer_.Sum(r), src.Hash());
}

// ---------------------------------------------------------------------------------------------
// Self-transfers: one engine to its own name, two engines in one process.

TEST(IntegrationSelf, EngineToItsOwnName) {
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0"));
  const std::string self = e.LocalName();
  ASSERT_NE(self.find(':'), std::string::npos) << self;
  ASSERT_NE(self, "127.0.0.1:0") << "LocalName must report the bound port";
  const xfer::Status c = e.Connect(self, 10s);
  ASSERT_TRUE(c.ok() || c.code() == StatusCode::kAlreadyConnected) << c.ToString();
  xfer::PeerInfo info;
  XT_ASSERT_OK(e.GetPeerInfo(self, &info));
  EXPECT_EQ(info.transport, "local");
  EXPECT_EQ(info.pid, getpid());

  const uint64_t len = 4 * kMiB + 3;
  LocalBuffer target(len), src(len), back(len);
  xfer::MemHandle h = 0;
  XT_ASSERT_OK(e.RegisterMem(target.data(), len, xfer::MemType::kHost, &h, "self"));
  src.Fill(17);
  XT_ASSERT_OK(e.TransferSync(self, Op::kWrite, {{src.addr(), target.addr(), len}}, 10s));
  EXPECT_EQ(FirstDiff(target.data(), src.data(), len), -1);
  // Batch READ in two pieces, reversed.
  XT_ASSERT_OK(e.TransferSync(
      self, Op::kRead,
      {{back.addr() + 4096, target.addr() + 4096, len - 4096}, {back.addr(), target.addr(), 4096}}, 10s));
  EXPECT_EQ(FirstDiff(back.data(), src.data(), len), -1);
  // Async too.
  xfer::RequestHandle req = 0;
  src.Fill(18);
  XT_ASSERT_OK(e.TransferAsync(self, Op::kWrite, {{src.addr(), target.addr(), len}}, 10s, &req));
  XT_EXPECT_OK(e.Wait(req, 10s));
  EXPECT_EQ(FirstDiff(target.data(), src.data(), len), -1);
  // The unregistered buffer `back` is not a valid target, even in our own process.
  const uint64_t before = back.Hash();
  XT_EXPECT_CODE(e.TransferSync(self, Op::kWrite, {{src.addr(), back.addr(), 64}}, 10s),
                 StatusCode::kRemoteAccessDenied);
  EXPECT_EQ(back.Hash(), before);
  XT_EXPECT_OK(e.DeregisterMem(h));
}

TEST(IntegrationSelf, TwoEnginesInOneProcess) {
  xfer::Engine a, b;
  XT_ASSERT_OK(a.Initialize("127.0.0.1:0"));
  XT_ASSERT_OK(b.Initialize("127.0.0.1:0"));
  ASSERT_NE(a.LocalName(), b.LocalName());
  const uint64_t len = 2 * kMiB + 1;
  LocalBuffer a_mem(len), b_mem(len), src(len);
  xfer::MemHandle ha = 0, hb = 0;
  XT_ASSERT_OK(a.RegisterMem(a_mem.data(), len, xfer::MemType::kHost, &ha, "a"));
  XT_ASSERT_OK(b.RegisterMem(b_mem.data(), len, xfer::MemType::kHost, &hb, "b"));

  XT_ASSERT_OK(a.Connect(b.LocalName(), 10s));
  xfer::PeerInfo info;
  XT_ASSERT_OK(a.GetPeerInfo(b.LocalName(), &info));
  EXPECT_EQ(info.transport, "local");
  EXPECT_TRUE(info.outbound);
  src.Fill(71);
  XT_ASSERT_OK(a.TransferSync(b.LocalName(), Op::kWrite, {{src.addr(), b_mem.addr(), len}}, 10s));
  EXPECT_EQ(FirstDiff(b_mem.data(), src.data(), len), -1);

  // b sees a as an inbound peer and can use that session without its own Connect.
  ASSERT_TRUE(PollUntil([&] { return b.GetPeerInfo(a.LocalName(), &info).ok(); }, 5s));
  EXPECT_FALSE(info.outbound);
  EXPECT_EQ(info.transport, "local");
  XT_EXPECT_CODE(b.Connect(a.LocalName(), 5s), StatusCode::kAlreadyConnected);
  XT_ASSERT_OK(b.TransferSync(a.LocalName(), Op::kWrite, {{b_mem.addr(), a_mem.addr(), len}}, 10s));
  EXPECT_EQ(FirstDiff(a_mem.data(), src.data(), len), -1);
  std::vector<xfer::RegionInfo> regions;
  XT_ASSERT_OK(b.GetRemoteRegions(a.LocalName(), &regions));
  ASSERT_EQ(regions.size(), 1u);
  EXPECT_EQ(regions[0].tag, "a");
}

TEST(IntegrationSelf, AcceptorKnowsThePeerWhenConnectReturns) {
  // Once a.Connect(b) returned, b must be able to use the session at once (b's application
  // may be told "a is connected" through a side channel and start transferring).
  for (int round = 0; round < 200; ++round) {
    xfer::Engine a, b;
    XT_ASSERT_OK(a.Initialize("127.0.0.1:0"));
    XT_ASSERT_OK(b.Initialize("127.0.0.1:0"));
    XT_ASSERT_OK(a.Connect(b.LocalName(), 5s));
    xfer::PeerInfo info;
    const xfer::Status s = b.GetPeerInfo(a.LocalName(), &info);
    ASSERT_TRUE(s.ok()) << "round " << round << ": the acceptor does not know the peer yet "
                        << "although Connect returned: " << s.ToString();
  }
}

TEST(IntegrationSelf, SimultaneousConnectLeavesOneCleanSession) {
  // Two engines Connect to each other at the same moment, 60 times. Whatever wins, the pair
  // must end with one session that Disconnect fully tears down on both sides, so that a later
  // Connect works.
  for (int round = 0; round < 60; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    xfer::Engine a, b;
    XT_ASSERT_OK(a.Initialize("127.0.0.1:0"));
    XT_ASSERT_OK(b.Initialize("127.0.0.1:0"));
    const std::string an = a.LocalName(), bn = b.LocalName();
    std::atomic<int> ready{0};
    xfer::Status sa, sb;
    std::thread ta([&] {
      ready++;
      while (ready.load() < 2) {
      }
      sa = a.Connect(bn, 5s);
    });
    std::thread tb([&] {
      ready++;
      while (ready.load() < 2) {
      }
      sb = b.Connect(an, 5s);
    });
    ta.join();
    tb.join();
    EXPECT_TRUE(sa.ok() || sa.code() == StatusCode::kAlreadyConnected) << sa.ToString();
    EXPECT_TRUE(sb.ok() || sb.code() == StatusCode::kAlreadyConnected) << sb.ToString();
    EXPECT_TRUE(sa.ok() || sb.ok()) << "neither side connected";
    xfer::PeerInfo info;
    ASSERT_TRUE(PollUntil([&] { return a.GetPeerInfo(bn, &info).ok(); }, 5s));
    ASSERT_TRUE(PollUntil([&] { return b.GetPeerInfo(an, &info).ok(); }, 5s));

    XT_ASSERT_OK(a.Disconnect(bn));
    EXPECT_TRUE(PollUntil([&] { return !b.GetPeerInfo(an, &info).ok(); }, 5s))
        << "b still has a session with a after a.Disconnect (sa=" << sa.ToString() << ", sb=" << sb.ToString()
        << ")";
    const xfer::Status again = a.Connect(bn, 5s);
    EXPECT_TRUE(again.ok()) << "reconnect after Disconnect: " << again.ToString() << " (sa=" << sa.ToString()
                            << ", sb=" << sb.ToString() << ")";
    if (HasFailure()) break;
  }
}

}  // namespace
}  // namespace xfer_test
