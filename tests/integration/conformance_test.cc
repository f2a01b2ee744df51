// The backend conformance suite: every backend of the registry (transport::BackendNames), forced
// between an initiator and a target, must move data of every size both ways, refuse ranges
// outside the target's regions without touching them, keep a deregistration's promise (nothing
// lands after DeregisterMem returns), end every request when the target dies or hangs, and
// leave the engine able to reach itself. A new backend
// is instantiated here by its registry line alone (docs/backends.md); one this machine cannot
// run skips itself with the reason.
//
// The target is another process (xfer_test_peer), except for "local", which reaches only its
// own process: there the target is a second engine in this process.
#include <csignal>
#include <thread>

#include "test_common.h"
#include "transport/backend.h"
#include "transport/common/cuda/cuda_api.h"

namespace xfer_test {
namespace {

using namespace std::chrono_literals;

constexpr int kHeartbeatMs = 100, kHeartbeatTimeoutMs = 1000;

// The target side, as the tests need it: regions of the memory its backend reaches, their
// contents, a deregistration that overwrites the region the moment it returns, and death.
class Target {
 public:
  virtual ~Target() = default;
  virtual std::string name() const = 0;
  virtual PeerRegion Alloc(uint64_t len, PeerAccess access = PeerAccess::kReadWrite) = 0;
  virtual void Fill(const PeerRegion& r, uint64_t seed) = 0;
  virtual uint64_t Sum(const PeerRegion& r) = 0;
  // Starts DeregisterMem(r) and, once it returned, fills r with seed's pattern; Finish waits.
  // AllocMem memory is released with FreeMem instead, which frees it: then there is nothing
  // left to look at (Observable() false), and the test checks what it still can.
  virtual void StartDeregisterThenFill(const PeerRegion& r, uint64_t seed) = 0;
  virtual bool Observable() const { return true; }
  virtual bool FinishDeregister() = 0;
  virtual void Die() = 0;  // SIGKILL; in this process, Finalize
};

// Another process.
class ProcessTarget final : public Target {
 public:
  ProcessTarget(std::string backend) : backend_(std::move(backend)) {}
  bool Start(std::string* err) {
    PeerOptions o;
    o.heartbeat_ms = kHeartbeatMs;
    o.heartbeat_timeout_ms = kHeartbeatTimeoutMs;
    if (backend_ == "ucx") o.extra_args = {"--ucx", "on"};  // no RDMA device here: offer it anyway
    return peer_.Start(o, err);
  }
  std::string name() const override { return peer_.name(); }
  PeerRegion Alloc(uint64_t len, PeerAccess access) override {
    if (backend_ == "shm") return peer_.ShmAlloc(len, "", false, access);         // AllocMem memory only
    if (backend_ == "cuda") return peer_.DeviceAlloc(len, -1, "", true, access);  // cudaMalloc'd
    return peer_.Alloc(len, "", access);
  }
  void Fill(const PeerRegion& r, uint64_t seed) override { peer_.Fill(r, seed); }
  uint64_t Sum(const PeerRegion& r) override { return peer_.Sum(r); }
  void StartDeregisterThenFill(const PeerRegion& r, uint64_t seed) override {
    dereg_sent_ = backend_ == "shm"
                      ? peer_.Send("free " + std::to_string(r.handle))
                      : peer_.Send("dereg " + std::to_string(r.handle) + " " + std::to_string(seed));
  }
  bool Observable() const override { return backend_ != "shm"; }
  bool FinishDeregister() override { return dereg_sent_ && peer_.ReadReply(30s).ok; }
  void Die() override { peer_.KillNow(); }
  void Hang(bool hung) { peer_.Signal(hung ? SIGSTOP : SIGCONT); }
  bool KnowsUs(const std::string& us) {
    return PollUntil([&] { return peer_.Call("info " + us).ok; }, 5s);
  }

 private:
  const std::string backend_;
  PeerProcess peer_;
  bool dereg_sent_ = false;
};

// A second engine in this process (the local backend's only peer).
class InProcessTarget final : public Target {
 public:
  bool Start(std::string* err) {
    xfer::EngineOptions o;
    o.heartbeat_interval = std::chrono::milliseconds(kHeartbeatMs);
    o.heartbeat_timeout = std::chrono::milliseconds(kHeartbeatTimeoutMs);
    const xfer::Status s = engine_.Initialize("127.0.0.1:0", o);
    *err = s.ToString();
    return s.ok();
  }
  ~InProcessTarget() override {
    if (dereg_.joinable()) dereg_.join();
    engine_.Finalize();
  }
  std::string name() const override { return engine_.LocalName(); }
  PeerRegion Alloc(uint64_t len, PeerAccess access) override {
    buffers_.push_back(std::make_unique<LocalBuffer>(len));
    PeerRegion r{0, buffers_.back()->addr(), len};
    const xfer::Status s =
        engine_.RegisterMem(buffers_.back()->data(), len, xfer::MemType::kHost, &r.handle, "", access);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return r;
  }
  void Fill(const PeerRegion& r, uint64_t seed) override {
    FillPattern(reinterpret_cast<unsigned char*>(r.addr), r.len, seed);
  }
  uint64_t Sum(const PeerRegion& r) override {
    return Hash64(reinterpret_cast<const unsigned char*>(r.addr), r.len);
  }
  void StartDeregisterThenFill(const PeerRegion& r, uint64_t seed) override {
    dereg_ = std::thread([this, r, seed] {
      dereg_ok_ = engine_.DeregisterMem(r.handle).ok();
      Fill(r, seed);
    });
  }
  bool FinishDeregister() override {
    dereg_.join();
    return dereg_ok_;
  }
  void Die() override { engine_.Finalize(); }

 private:
  xfer::Engine engine_;
  std::vector<std::unique_ptr<LocalBuffer>> buffers_;
  std::thread dereg_;
  bool dereg_ok_ = false;
};

class Conformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string& backend = GetParam();
    std::string why;
    if (backend == "cuda" && !xfer::transport::cuda::Available(&why)) {
      GTEST_SKIP() << "no GPU: " << why;
    }
#ifndef XFER_TEST_UCX
    if (backend == "ucx") GTEST_SKIP() << "this build has no UCX";
#endif
    std::string err;
    if (backend == "local") {
      auto t = std::make_unique<InProcessTarget>();
      ASSERT_TRUE(t->Start(&err)) << err;
      target_ = std::move(t);
    } else {
      auto t = std::make_unique<ProcessTarget>(backend);
      ASSERT_TRUE(t->Start(&err)) << err;
      target_ = std::move(t);
    }
    xfer::EngineOptions o;
    o.transport = backend;
    o.heartbeat_interval = std::chrono::milliseconds(kHeartbeatMs);
    o.heartbeat_timeout = std::chrono::milliseconds(kHeartbeatTimeoutMs);
    XT_ASSERT_OK(engine_.Initialize("127.0.0.1:0", o));
    XT_ASSERT_OK(engine_.Connect(target_->name(), 10s));
    if (auto* p = dynamic_cast<ProcessTarget*>(target_.get())) {
      ASSERT_TRUE(p->KnowsUs(engine_.LocalName())) << "the target never listed our session";
    }
  }
  void TearDown() override { engine_.Finalize(); }

  xfer::Status Move(Op op, const std::vector<TransferDesc>& d, std::chrono::milliseconds t = 30s) {
    return engine_.TransferSync(target_->name(), op, d, t);
  }

  std::unique_ptr<Target> target_;  // destroyed after engine_ is finalized
  xfer::Engine engine_;
};

TEST_P(Conformance, MovesEverySizeBothWaysOverThisBackendAlone) {
  constexpr uint64_t kMax = 8 << 20;
  const PeerRegion r = target_->Alloc(kMax);
  ASSERT_NE(r.addr, 0u);
  LocalBuffer src(kMax), back(kMax);
  uint64_t moved = 0;
  for (uint64_t size : std::initializer_list<uint64_t>{1, 7, 4096, 65537, (1 << 20) + 3, kMax}) {
    SCOPED_TRACE(size);
    const PeerRegion part{r.handle, r.addr, size};
    src.Fill(size);
    XT_ASSERT_OK(Move(Op::kWrite, {{src.addr(), r.addr, size}}));
    EXPECT_EQ(target_->Sum(part), Hash64(src.data(), size));
    target_->Fill(part, size + 1);
    XT_ASSERT_OK(Move(Op::kRead, {{back.addr(), r.addr, size}}));
    EXPECT_EQ(Hash64(back.data(), size), target_->Sum(part));
    moved += 2 * size;
  }
  xfer::PeerInfo info;
  XT_ASSERT_OK(engine_.GetPeerInfo(target_->name(), &info));
  EXPECT_EQ(info.routes, std::vector<std::string>{GetParam()}) << "the transport was forced";
  EXPECT_EQ(info.BytesVia(GetParam()), moved);
}

// (The initiator's own check refuses these before the backend sees them: one-sided backends
// rely on it. tcp's target checks every range again: tests/unit/tcp_transport_test.cc.)
TEST_P(Conformance, RefusesRangesOutsideTheRegionsAndMovesNothing) {
  const PeerRegion r = target_->Alloc(8192);
  ASSERT_NE(r.addr, 0u);
  target_->Fill(r, 5);
  const uint64_t before = target_->Sum(r);
  LocalBuffer buf(16384);
  buf.Fill(6);
  const uint64_t mine = buf.Hash();
  XT_EXPECT_CODE(Move(Op::kWrite, {{buf.addr(), r.addr + 8000, 200}}), StatusCode::kRemoteAccessDenied);
  XT_EXPECT_CODE(Move(Op::kWrite, {{buf.addr(), r.addr, 100}, {buf.addr(), r.addr - 4096, 100}}),
                 StatusCode::kRemoteAccessDenied);
  XT_EXPECT_CODE(Move(Op::kRead, {{buf.addr(), r.addr + 4096, 8192}}), StatusCode::kRemoteAccessDenied);
  EXPECT_EQ(target_->Sum(r), before) << "a refused WRITE touched the target";
  EXPECT_EQ(buf.Hash(), mine) << "a refused READ touched our memory";
  XT_EXPECT_OK(Move(Op::kWrite, {{buf.addr(), r.addr, 8192}}));  // and the backend goes on
  EXPECT_EQ(target_->Sum(r), Hash64(buf.data(), 8192));
}

TEST_P(Conformance, ReadOnlyRegionsServeReadsAndRefuseWrites) {
  constexpr uint64_t kLen = 1 << 20;
  const PeerRegion r = target_->Alloc(kLen, PeerAccess::kReadOnly);
  ASSERT_NE(r.addr, 0u);
  target_->Fill(r, 8);
  const uint64_t before = target_->Sum(r);
  std::vector<xfer::RegionInfo> regions;
  XT_ASSERT_OK(engine_.GetRemoteRegions(target_->name(), &regions));
  const auto it =
      std::find_if(regions.begin(), regions.end(), [&](const auto& i) { return i.addr == r.addr; });
  ASSERT_NE(it, regions.end());
  EXPECT_EQ(it->access, PeerAccess::kReadOnly);
  LocalBuffer buf(kLen);
  buf.Fill(9);
  const uint64_t mine = buf.Hash();
  xfer::MemHandle local = 0;  // registered: small copies to shm then run inline
  XT_ASSERT_OK(engine_.RegisterMem(buf.data(), kLen, xfer::MemType::kHost, &local));
  // 8 bytes and 4 KiB: shm's inline copies; 1 MiB: planned batches.
  for (uint64_t size : std::initializer_list<uint64_t>{8, 4096, kLen}) {
    SCOPED_TRACE(size);
    const xfer::Status s = Move(Op::kWrite, {{buf.addr(), r.addr, size}});
    XT_EXPECT_CODE(s, StatusCode::kRemoteAccessDenied);
    EXPECT_NE(s.message().find("read-only"), std::string::npos) << s.message();
    xfer::RequestHandle req = 0;
    XT_EXPECT_CODE(
        engine_.TransferAsync(target_->name(), Op::kWrite, {{buf.addr(), r.addr, size}}, 10s, &req),
        StatusCode::kRemoteAccessDenied);
  }
  EXPECT_EQ(target_->Sum(r), before) << "a WRITE landed in a read-only region";
  EXPECT_EQ(buf.Hash(), mine);
  XT_ASSERT_OK(Move(Op::kRead, {{buf.addr(), r.addr, kLen}}));
  EXPECT_EQ(buf.Hash(), before);
  XT_ASSERT_OK(Move(Op::kRead, {{buf.addr(), r.addr + 3, 5}}));  // small READs too
  XT_EXPECT_OK(engine_.DeregisterMem(local));
}

TEST_P(Conformance, NothingLandsAfterADeregistrationReturns) {
  // The target overwrites the region the moment DeregisterMem returns; a batch of ours that
  // landed later would show. The window is a batch long: five rounds, at varied moments, of a
  // request long enough (1 GiB) that the deregistration comes in the middle of it in some.
  constexpr uint64_t kRegion = 4 << 20;
  LocalBuffer a(kRegion), b(kRegion), want(kRegion);
  a.Fill(30);
  b.Fill(31);
  want.Fill(32);
  int overlapped = 0;  // rounds whose request the deregistration cut short
  for (int round = 0; round < 5 && !HasFailure(); ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const PeerRegion r = target_->Alloc(kRegion);
    ASSERT_NE(r.addr, 0u);
    std::vector<TransferDesc> d;
    for (int i = 0; i < 256; ++i) d.push_back({(i % 2 ? b : a).addr(), r.addr, kRegion});
    xfer::RequestHandle req = 0;
    XT_ASSERT_OK(engine_.TransferAsync(target_->name(), Op::kWrite, d, 60s, &req));
    std::this_thread::sleep_for(std::chrono::milliseconds(1 + round));
    target_->StartDeregisterThenFill(r, 32);
    ASSERT_TRUE(target_->FinishDeregister());
    const Outcome o = WaitFor(engine_, req, 30s);
    ASSERT_NE(o.status.state, RequestState::kWaiting);
    if (o.status.state != RequestState::kCompleted) {
      EXPECT_EQ(o.wait.code(), StatusCode::kRemoteAccessDenied) << o.wait.ToString();
      ++overlapped;
    }
    XT_EXPECT_CODE(Move(Op::kWrite, {{a.addr(), r.addr, 4096}}), StatusCode::kRemoteAccessDenied);
    if (!target_->Observable()) continue;
    std::this_thread::sleep_for(20ms);
    EXPECT_EQ(target_->Sum(r), want.Hash())
        << "bytes landed after DeregisterMem returned (the request ended "
        << xfer::RequestStateName(o.status.state) << ": " << o.wait.ToString() << ")";
  }
  EXPECT_GT(overlapped, 0) << "every request ended before its deregistration: the test proved nothing";
}

TEST_P(Conformance, TheTargetsDeathEndsEveryRequest) {
  constexpr uint64_t kLen = 16 << 20;
  const PeerRegion r = target_->Alloc(kLen);
  ASSERT_NE(r.addr, 0u);
  LocalBuffer src(kLen);
  std::vector<TransferDesc> d(16, TransferDesc{src.addr(), r.addr, kLen});
  std::vector<xfer::RequestHandle> reqs(4);
  for (auto& h : reqs) {
    XT_ASSERT_OK(engine_.TransferAsync(target_->name(), Op::kWrite, d, 60s, &h));
  }
  std::this_thread::sleep_for(20ms);
  const auto t0 = Clock::now();
  target_->Die();
  for (auto h : reqs) {
    const Outcome o = WaitFor(engine_, h, 10s);
    // A mapping outlives its owner (shm, cuda): a request may still complete. Otherwise the
    // peer's loss.
    ASSERT_NE(o.status.state, RequestState::kWaiting) << "a request outlived its target";
    if (o.status.state != RequestState::kCompleted) {
      EXPECT_EQ(o.wait.code(), StatusCode::kConnectionLost) << o.wait.ToString();
    }
  }
  // Detected within the heartbeat timeout (with slack for two shared cores): then nothing
  // more goes to the dead target.
  ASSERT_TRUE(PollUntil(
      [&] {
        xfer::PeerInfo info;
        return !engine_.GetPeerInfo(target_->name(), &info).ok();
      },
      5s))
      << "the dead target was never dropped";
  EXPECT_LT(SecondsSince(t0), 6.0);
  const xfer::Status after = Move(Op::kWrite, {{src.addr(), r.addr, 4096}}, 5s);
  EXPECT_FALSE(after.ok());
}

TEST_P(Conformance, AHungTargetIsDroppedByTheHeartbeat) {
  auto* target = dynamic_cast<ProcessTarget*>(target_.get());
  if (target == nullptr) GTEST_SKIP() << "a target in this process cannot hang apart from it";
  constexpr uint64_t kLen = 16 << 20;
  const PeerRegion r = target_->Alloc(kLen);
  ASSERT_NE(r.addr, 0u);
  LocalBuffer src(kLen);
  std::vector<TransferDesc> d(16, TransferDesc{src.addr(), r.addr, kLen});
  std::vector<xfer::RegionInfo> known;  // the region is known here before the target hangs
  XT_ASSERT_OK(engine_.GetRemoteRegions(target_->name(), &known));
  xfer::RequestHandle h = 0;
  target->Hang(true);  // SIGSTOP: its threads answer nothing, its heartbeats stop
  XT_ASSERT_OK(engine_.TransferAsync(target_->name(), Op::kWrite, d, 60s, &h));
  const Outcome o = WaitFor(engine_, h, 10s);
  // One-sided backends may still complete into a stopped process's memory.
  EXPECT_NE(o.status.state, RequestState::kWaiting) << "a request outlived its hung target";
  if (o.status.state != RequestState::kCompleted && o.status.state != RequestState::kWaiting) {
    EXPECT_EQ(o.wait.code(), StatusCode::kConnectionLost) << o.wait.ToString();
  }
  EXPECT_TRUE(PollUntil(
      [&] {
        xfer::PeerInfo info;
        return !engine_.GetPeerInfo(target_->name(), &info).ok();
      },
      5s))
      << "the hung target was never dropped";
  target->Hang(false);
}

TEST_P(Conformance, TransfersToItsOwnNameWhateverIsForced) {
  // A forced backend says how to reach peers; the engine reaches itself in-process all the same.
  LocalBuffer src(1 << 20), dst(1 << 20);
  src.Fill(77);
  xfer::MemHandle h = 0;
  XT_ASSERT_OK(engine_.RegisterMem(dst.data(), dst.len(), xfer::MemType::kHost, &h));
  XT_ASSERT_OK(
      engine_.TransferSync(engine_.LocalName(), Op::kWrite, {{src.addr(), dst.addr(), dst.len()}}, 10s));
  EXPECT_EQ(dst.Hash(), src.Hash());
  XT_EXPECT_OK(engine_.DeregisterMem(h));
}

INSTANTIATE_TEST_SUITE_P(Backends, Conformance, ::testing::ValuesIn(xfer::transport::BackendNames()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace xfer_test
