// Two hosts on one machine: each engine runs in its own network namespace, the two joined by
// a veth pair, with distinct host ids (namespaces.h).
#include <algorithm>
#include <vector>

#include "namespaces.h"

namespace xfer_test {
namespace {

using namespace std::chrono_literals;

class FaultTwoHosts : public TwoNamespaces {
 protected:
  void SetUp() override {
    if (std::string why; !Build(1, &why)) GTEST_SKIP() << why;
    std::string err;
    ASSERT_TRUE(a_.Start(PeerIn(ns_a_, ip_a_[0], HostId("host-a"), PeerArgs()), &err)) << err;
    ASSERT_TRUE(b_.Start(PeerIn(ns_b_, ip_b_[0], HostId("host-b"), PeerArgs()), &err)) << err;
    ASSERT_TRUE(PollUntil([&] { return a_.Call("connect " + b_.name() + " 2000").ok; }, 10s))
        << "host a cannot reach host b";
  }
  void TearDown() override {
    if (built_) Shell("ip -n " + ns_a_ + " link set " + dev_a_[0] + " up");  // let the peers say goodbye
    a_.KillNow();
    b_.KillNow();
    Remove();
  }
  // Distinct ids: two hosts. Empty: the engines' own (boot) id, so one host in two namespaces.
  virtual std::string HostId(const std::string& fake) { return fake; }
  // tcp: these tests are about it (ucx, preferred when built in, has its own below).
  virtual std::vector<std::string> PeerArgs() { return {"--transport", "tcp"}; }

  // a_ WRITEs each size into a region of b_, then READs it back; both sides compared.
  void MoveSizesBothWays(std::initializer_list<uint64_t> sizes, PeerRegion* region, uint64_t* local) {
    const uint64_t max = std::max(sizes);
    *region = b_.Alloc(max, "landing");
    *local = a_.Buf(max);
    ASSERT_NE(*local, 0u);
    for (uint64_t size : sizes) {
      SCOPED_TRACE(size);
      a_.FillRange(*local, size, size);
      Reply w = a_.Xfer("write", b_.name(), 30000, *local, region->addr, size);
      ASSERT_TRUE(w.ok) << w.line;
      EXPECT_EQ(b_.SumRange(region->addr, size), a_.SumRange(*local, size));
      b_.FillRange(region->addr, size, size + 1);
      Reply r = a_.Xfer("read", b_.name(), 30000, *local, region->addr, size);
      ASSERT_TRUE(r.ok) << r.line;
      EXPECT_EQ(a_.SumRange(*local, size), b_.SumRange(region->addr, size));
    }
  }

  PeerProcess a_, b_;
};

TEST_F(FaultTwoHosts, TcpIsChosenAndMovesDataBothWays) {
  Reply info = a_.Call("info " + b_.name());
  ASSERT_TRUE(info.ok) << info.line;
  EXPECT_EQ(info.words.at(0), "tcp") << "engines on two hosts must use tcp, never cma";
  PeerRegion region;
  uint64_t local = 0;
  MoveSizesBothWays({1, 4097, (1 << 20) + 1, 64 << 20}, &region, &local);
  if (HasFatalFailure()) return;
  // A batch of 5,000 descriptors in one request.
  Reply batch = a_.Xfer("write", b_.name(), 30000, local, region.addr, 1024, 5000);
  EXPECT_TRUE(batch.ok) << batch.line;
  EXPECT_EQ(b_.SumRange(region.addr, 1024), a_.SumRange(local, 1024));
}

// 10,000 notified WRITEs, then 10,000 notified READs, from one host to the other: each
// notification finds its data in place (WRITE) or finds the READ done (the target overwrites
// the block at once).
TEST_F(FaultTwoHosts, EveryNotificationComesAfterItsData) {
  constexpr uint64_t kN = 10000, kB = 4096;
  const PeerRegion r = b_.Alloc(kN * kB);
  const uint64_t local = a_.Buf(kN * kB);
  ASSERT_TRUE(b_.Call("watch").ok);
  const std::string tail = " " + std::to_string(local) + " " + std::to_string(r.addr) + " " +
                           std::to_string(kB) + " " + std::to_string(kN) + " 8";
  Reply w = a_.Call("nstream write " + b_.name() + tail, 120s);
  ASSERT_TRUE(w.ok) << w.line;
  EXPECT_EQ(w.u64(0), kN) << w.line;
  Reply seen = b_.Call("watched " + std::to_string(kN) + " 60000", 90s);
  EXPECT_EQ(seen.u64(0), kN) << seen.line;
  EXPECT_EQ(seen.u64(1), 0u) << "data missing at notification time: " << seen.line;
  EXPECT_EQ(seen.u64(2), 0u) << "out of order: " << seen.line;
  b_.Fill(r, 7);
  Reply rd = a_.Call("nstream read " + b_.name() + tail + " 7", 120s);
  ASSERT_TRUE(rd.ok) << rd.line;
  EXPECT_EQ(rd.u64(0), kN) << rd.line;
  EXPECT_EQ(rd.u64(2), 0u) << "a block was overwritten before its READ finished: " << rd.line;
  seen = b_.Call("watched " + std::to_string(2 * kN) + " 60000", 90s);
  EXPECT_EQ(seen.u64(0), 2 * kN) << seen.line;
}

// One host, two network namespaces: same-host paths still apply. The descriptor of the
// peer's AllocMem memory crosses the namespaces (pidfd_getfd needs no network).
class FaultOneHostTwoNamespaces : public FaultTwoHosts {
 protected:
  std::string HostId(const std::string&) override { return ""; }
  std::vector<std::string> PeerArgs() override { return {}; }
};

TEST_F(FaultOneHostTwoNamespaces, AllocMemMemoryIsMappedAcrossNamespaces) {
  constexpr uint64_t kLen = 8 << 20;
  const PeerRegion region = b_.ShmAlloc(kLen, "landing");
  const uint64_t local = a_.Buf(kLen);
  ASSERT_NE(local, 0u);
  a_.FillRange(local, kLen, 21);
  Reply w = a_.Xfer("write", b_.name(), 30000, local, region.addr, kLen);
  ASSERT_TRUE(w.ok) << w.line;
  EXPECT_EQ(b_.SumRange(region.addr, kLen), a_.SumRange(local, kLen));
  Reply info = a_.Call("info " + b_.name());
  ASSERT_TRUE(info.ok) << info.line;
  EXPECT_EQ(info.words.at(0), "cma") << info.line;
  EXPECT_EQ(info.words.at(5), "1") << "no shm path across namespaces: " << info.line;
  EXPECT_EQ(info.u64(6), kLen) << info.line;
}

#if XFER_HAVE_UCX
// Two hosts, the ucx transport forced on both (UCX over its tcp transport across the veth).
class FaultTwoHostsUcx : public FaultTwoHosts {
 protected:
  std::vector<std::string> PeerArgs() override { return {"--transport", "ucx"}; }
};

TEST_F(FaultTwoHostsUcx, UcxMovesDataBothWaysAcrossTheLink) {
  Reply info = a_.Call("info " + b_.name());
  ASSERT_TRUE(info.ok) << info.line;
  EXPECT_EQ(info.words.at(0), "ucx") << info.line;
  PeerRegion region;
  uint64_t local = 0;
  MoveSizesBothWays({1, (1 << 20) + 1, 16 << 20}, &region, &local);
}
#endif

TEST_F(FaultTwoHosts, CuttingTheLinkFailsTheRequestThenNewTransfersWork) {
  const CutWrite cut = StartWriteThenCut(a_, b_, ns_a_, {dev_a_[0]}, 100ms);
  ASSERT_FALSE(cut.req.empty());
  ASSERT_FALSE(HasFailure());
  ExpectLostWithinHeartbeat(a_, cut.req, Clock::now());
  if (HasFatalFailure()) return;
  const PeerRegion& region = cut.region;
  const uint64_t local = cut.local;

  ASSERT_TRUE(Shell("ip -n " + ns_a_ + " link set " + dev_a_[0] + " up"));
  // Both sides have dropped the dead session; a new one works.
  ASSERT_TRUE(PollUntil([&] { return a_.Call("connect " + b_.name() + " 1000").ok; }, 10s));
  a_.FillRange(local, 4096, 3);
  Reply w = a_.Xfer("write", b_.name(), 10000, local, region.addr, 4096);
  ASSERT_TRUE(w.ok) << w.line;
  EXPECT_EQ(b_.SumRange(region.addr, 4096), a_.SumRange(local, 4096));
}

}  // namespace
}  // namespace xfer_test
