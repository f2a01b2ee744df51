// Bad input against a real peer: each case checks the exact StatusCode and that the target
// memory is unchanged.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "test_common.h"
#include "transport/common/cuda/cuda_api.h"

namespace xfer_test {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kMiB = 1ull << 20;

class IntegrationBadInput : public PeerFixture {
 protected:
  void SetUp() override {
    PeerFixture::SetUp();
    if (HasFatalFailure()) return;
    r_ = peer_.Alloc(kMiB, "target");
    ASSERT_NE(r_.addr, 0u);
    peer_.Fill(r_, 99);
    sum0_ = peer_.Sum(r_);
    src_ = std::make_unique<LocalBuffer>(kMiB);
    src_->Fill(100);
  }

  void ExpectTargetUnchanged() {
    EXPECT_EQ(peer_.Sum(r_), sum0_) << "the target region changed although the call failed";
  }

  // Expects code for TransferSync and TransferAsync in both directions; for READ the local
  // buffer must stay as it was.
  void ExpectRejected(const std::vector<TransferDesc>& d, StatusCode want, const char* what) {
    SCOPED_TRACE(what);
    XT_EXPECT_CODE(Write(d, 10s), want);
    xfer::RequestHandle req = 0;
    const xfer::Status a = engine_.TransferAsync(peer_.name(), Op::kWrite, d, 10s, &req);
    if (a.ok()) {
      // Validation errors must return at once, but accept a request that fails the same way.
      const Outcome o = WaitFor(engine_, req, 10s);
      EXPECT_EQ(o.wait.code(), want) << "TransferAsync accepted a bad request: " << o.wait.ToString();
      EXPECT_EQ(o.status.state, RequestState::kFailed);
    } else {
      EXPECT_EQ(a.code(), want) << a.ToString();
    }
    const uint64_t local_before = src_->Hash();
    XT_EXPECT_CODE(Read(d, 10s), want);
    EXPECT_EQ(src_->Hash(), local_before) << "a rejected READ changed local memory";
    ExpectTargetUnchanged();
  }

  PeerRegion r_;
  uint64_t sum0_ = 0;
  std::unique_ptr<LocalBuffer> src_;
};

TEST_F(IntegrationBadInput, NullLocalAddress) {
  ExpectRejected({{0, r_.addr, 64}}, StatusCode::kInvalidArgument, "null local");
  ExpectRejected({{src_->addr(), r_.addr, 64}, {0, r_.addr + 64, 64}}, StatusCode::kInvalidArgument,
                 "valid + null local");
}

TEST_F(IntegrationBadInput, ZeroLengthDescriptor) {
  ExpectRejected({{src_->addr(), r_.addr, 0}}, StatusCode::kInvalidArgument, "zero length");
  ExpectRejected({{src_->addr(), r_.addr, 4096}, {src_->addr() + 4096, r_.addr + 4096, 0}},
                 StatusCode::kInvalidArgument, "valid + zero length");
}

TEST_F(IntegrationBadInput, NullRemoteAddress) {
  for (Op op : {Op::kWrite, Op::kRead}) {
    const xfer::Status s = engine_.TransferSync(peer_.name(), op, {{src_->addr(), 0, 64}}, 10s);
    EXPECT_TRUE(s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kRemoteAccessDenied)
        << s.ToString();
  }
  ExpectTargetUnchanged();
}

TEST_F(IntegrationBadInput, EmptyDescriptorListDoesNotCrash) {
  const xfer::Status s = Write({}, 10s);
  EXPECT_TRUE(s.ok() || s.code() == StatusCode::kInvalidArgument) << s.ToString();
  ExpectTargetUnchanged();
}

TEST_F(IntegrationBadInput, RemoteRangeOutsideAnyRegion) {
  ExpectRejected({{src_->addr(), r_.addr + r_.len - 63, 64}}, StatusCode::kRemoteAccessDenied,
                 "one byte past the end");
  ExpectRejected({{src_->addr(), r_.addr + r_.len, 1}}, StatusCode::kRemoteAccessDenied, "just past the end");
  ExpectRejected({{src_->addr(), r_.addr - 1, 2}}, StatusCode::kRemoteAccessDenied,
                 "one byte before the start");
  ExpectRejected({{src_->addr(), 4096, 64}}, StatusCode::kRemoteAccessDenied, "unrelated address");
  ExpectRejected({{src_->addr(), r_.addr, r_.len + 1}}, StatusCode::kRemoteAccessDenied,
                 "whole region plus one");
  // All earlier descriptors valid, the last one bad: nothing at all may move.
  std::vector<TransferDesc> d;
  for (uint64_t i = 0; i < 1000; ++i) d.push_back({src_->addr() + i * 64, r_.addr + i * 64, 64});
  d.push_back({src_->addr(), r_.addr + r_.len - 8, 16});
  ExpectRejected(d, StatusCode::kRemoteAccessDenied, "1000 valid then one bad");
}

TEST_F(IntegrationBadInput, RemoteRangeThatWrapsAround) {
  const uint64_t top = std::numeric_limits<uint64_t>::max();
  const std::vector<TransferDesc> d = {{src_->addr(), top - 10, 64}};
  const xfer::Status s = Write(d, 10s);
  EXPECT_TRUE(s.code() == StatusCode::kRemoteAccessDenied || s.code() == StatusCode::kInvalidArgument)
      << s.ToString();
  // A length so large that addr+len wraps back into the region.
  const xfer::Status s2 = Write({{src_->addr(), r_.addr + 8, top - 4}}, 10s);
  EXPECT_TRUE(s2.code() == StatusCode::kRemoteAccessDenied || s2.code() == StatusCode::kInvalidArgument)
      << s2.ToString();
  ExpectTargetUnchanged();
}

TEST_F(IntegrationBadInput, RemoteRangeStraddlingTwoAdjacentRegions) {
  constexpr uint64_t kHalf = 64 * 1024;
  const uint64_t base = peer_.Buf(2 * kHalf);
  ASSERT_NE(base, 0u);
  Reply a = peer_.Call("reg " + std::to_string(base) + " " + std::to_string(kHalf) + " lo");
  Reply b = peer_.Call("reg " + std::to_string(base + kHalf) + " " + std::to_string(kHalf) + " hi");
  ASSERT_TRUE(a.ok && b.ok) << a.line << " / " << b.line;
  peer_.FillRange(base, 2 * kHalf, 7);
  const uint64_t before = peer_.SumRange(base, 2 * kHalf);

  XT_EXPECT_CODE(Write({{src_->addr(), base + kHalf - 32, 64}}, 10s), StatusCode::kRemoteAccessDenied);
  XT_EXPECT_CODE(Write({{src_->addr(), base, 2 * kHalf}}, 10s), StatusCode::kRemoteAccessDenied);
  XT_EXPECT_CODE(Read({{src_->addr(), base + kHalf - 1, 2}}, 10s), StatusCode::kRemoteAccessDenied);
  EXPECT_EQ(peer_.SumRange(base, 2 * kHalf), before) << "straddling write changed memory";

  // Control: the same bytes as two descriptors, one per region, are fine.
  XT_EXPECT_OK(Write({{src_->addr(), base + kHalf - 32, 32}, {src_->addr() + 32, base + kHalf, 32}}, 10s));
  EXPECT_EQ(peer_.SumRange(base + kHalf - 32, 64), Hash64(src_->data(), 64));
}

TEST_F(IntegrationBadInput, LocalRangeNotMapped) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  void* p = mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  const uint64_t base = reinterpret_cast<uintptr_t>(p);
  std::memset(p, 1, 2 * page);
  // The third page becomes inaccessible, in one step (a hole left by munmap could be filled at
  // once by another thread's mmap): a range starting in it, and one running into it.
  ASSERT_NE(mmap(reinterpret_cast<void*>(base + 2 * page), page, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0),
            MAP_FAILED);
  ExpectRejected({{base + 2 * page, r_.addr, 64}}, StatusCode::kInvalidArgument, "inaccessible local");
  ExpectRejected({{base + page, r_.addr, page + 64}}, StatusCode::kInvalidArgument,
                 "local range running off its readable mapping");
  munmap(p, 3 * page);
}

TEST_F(IntegrationBadInput, ReadIntoReadOnlyLocalMemory) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  void* p = mmap(nullptr, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  const uint64_t ro = reinterpret_cast<uintptr_t>(p);
  XT_EXPECT_CODE(Read({{ro, r_.addr, 64}}, 10s), StatusCode::kInvalidArgument);
  // Reading memory is all a WRITE needs from its source.
  XT_EXPECT_OK(Write({{ro, r_.addr, 64}}, 10s));
  EXPECT_EQ(peer_.SumRange(r_.addr, 64), Hash64(p, 64));
  munmap(p, page);
}

TEST_F(IntegrationBadInput, RegisteredButUnmappedRemoteMemoryIsNeverReportedDone) {
  // The target registered 1 MiB and then unmapped one page in the middle: the kernel moves
  // bytes up to the hole and stops. "Returns ok only when all data landed" must still hold.
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const PeerRegion holey = peer_.Alloc(kMiB, "holey");
  ASSERT_NE(holey.addr, 0u);
  const uint64_t hole = holey.addr + kMiB / 2;
  ASSERT_TRUE(peer_.Call("unmap " + std::to_string(hole) + " " + std::to_string(page)).ok);
  for (Op op : {Op::kWrite, Op::kRead}) {
    SCOPED_TRACE(op == Op::kWrite ? "WRITE" : "READ");
    const xfer::Status one = engine_.TransferSync(peer_.name(), op, {{src_->addr(), holey.addr, kMiB}}, 10s);
    EXPECT_FALSE(one.ok()) << "a transfer across unmapped target memory reported success";
    // Many small descriptors, one of them in the hole.
    std::vector<TransferDesc> d;
    for (uint64_t off = 0; off < kMiB; off += 4096) d.push_back({src_->addr() + off, holey.addr + off, 4096});
    const xfer::Status many = engine_.TransferSync(peer_.name(), op, d, 10s);
    EXPECT_FALSE(many.ok()) << "a batch with one descriptor in unmapped target memory succeeded";
    xfer::RequestHandle req = 0;
    XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), op, d, 10s, &req));
    const Outcome o = WaitFor(engine_, req, 10s);
    EXPECT_EQ(o.status.state, RequestState::kFailed) << o.wait.ToString();
    RecordProperty(op == Op::kWrite ? "write_code" : "read_code", CodeName(one.code()));
  }
  // The mapped part before the hole still works.
  XT_EXPECT_OK(Write({{src_->addr(), holey.addr, kMiB / 2}}, 10s));
  EXPECT_EQ(peer_.SumRange(holey.addr, kMiB / 2), Hash64(src_->data(), kMiB / 2));
  EXPECT_TRUE(peer_.Call("ping").ok) << "the target died";
}

TEST_F(IntegrationBadInput, UnknownPeer) {
  const std::string nobody = "127.0.0.1:" + std::to_string(UnusedPort());
  XT_EXPECT_CODE(engine_.TransferSync(nobody, Op::kWrite, {{src_->addr(), r_.addr, 64}}, 5s),
                 StatusCode::kNotConnected);
  xfer::RequestHandle req = 0;
  XT_EXPECT_CODE(engine_.TransferAsync(nobody, Op::kRead, {{src_->addr(), r_.addr, 64}}, 5s, &req),
                 StatusCode::kNotConnected);
  xfer::PeerInfo info;
  XT_EXPECT_CODE(engine_.GetPeerInfo(nobody, &info), StatusCode::kNotConnected);
  std::vector<xfer::RegionInfo> regions;
  XT_EXPECT_CODE(engine_.GetRemoteRegions(nobody, &regions), StatusCode::kNotConnected);
  XT_EXPECT_CODE(engine_.Disconnect(nobody), StatusCode::kNotConnected);
  // The peer's real name with a different spelling of the port is still a different peer.
  ExpectTargetUnchanged();
}

TEST_F(IntegrationBadInput, MalformedNames) {
  for (const std::string name : {"", "127.0.0.1:notaport", "127.0.0.1:99999", "[::1"}) {
    SCOPED_TRACE("name '" + name + "'");
    const xfer::Status s = engine_.Connect(name, 1s);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  }
  xfer::Engine e;
  XT_EXPECT_CODE(e.Initialize("127.0.0.1:notaport"), StatusCode::kInvalidArgument);
}

TEST_F(IntegrationBadInput, ConnectToClosedPortFails) {
  const std::string wrong = "127.0.0.1:" + std::to_string(UnusedPort());
  const auto t0 = Clock::now();
  const xfer::Status s = engine_.Connect(wrong, 3s);
  EXPECT_TRUE(s.code() == StatusCode::kConnectionLost || s.code() == StatusCode::kTimeout) << s.ToString();
  EXPECT_LT(SecondsSince(t0), 5.0);
  xfer::PeerInfo info;
  XT_EXPECT_CODE(engine_.GetPeerInfo(wrong, &info), StatusCode::kNotConnected);
  // The real peer's session is unaffected.
  XT_EXPECT_OK(Write({{src_->addr(), r_.addr, 64}}, 10s));
}

TEST_F(IntegrationBadInput, AutoConnectToClosedPortIsNotConnected) {
  xfer::EngineOptions eo;
  eo.auto_connect = true;
  eo.auto_connect_timeout = 1s;
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0", eo));
  const std::string wrong = "127.0.0.1:" + std::to_string(UnusedPort());
  const auto t0 = Clock::now();
  XT_EXPECT_CODE(e.TransferSync(wrong, Op::kWrite, {{src_->addr(), r_.addr, 64}}, 5s),
                 StatusCode::kNotConnected);
  xfer::RequestHandle req = 0;
  XT_EXPECT_CODE(e.TransferAsync(wrong, Op::kWrite, {{src_->addr(), r_.addr, 64}}, 5s, &req),
                 StatusCode::kNotConnected);
  EXPECT_LT(SecondsSince(t0), 4.0);
  // Auto-connect to the real peer works from the same engine.
  XT_EXPECT_OK(e.TransferSync(peer_.name(), Op::kWrite, {{src_->addr(), r_.addr, 64}}, 5s));
  EXPECT_EQ(peer_.SumRange(r_.addr, 64), Hash64(src_->data(), 64));
}

TEST_F(IntegrationBadInput, ConnectToUnroutableAddressIsBounded) {
  // TEST-NET-2: nothing answers there. Refused, unreachable or timed out, within the timeout.
  const auto t0 = Clock::now();
  const xfer::Status s = engine_.Connect("198.51.100.1:9", 300ms);
  EXPECT_TRUE(s.code() == StatusCode::kTimeout || s.code() == StatusCode::kConnectionLost) << s.ToString();
  EXPECT_LT(SecondsSince(t0), 2.0) << "Connect overran its 300 ms timeout";
}

TEST_F(IntegrationBadInput, ConnectToSilentListenerTimesOut) {
  // A TCP listener that accepts (the kernel completes the handshake) and never says a word.
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(fd, 8), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const std::string silent = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  const auto t0 = Clock::now();
  const xfer::Status s = engine_.Connect(silent, 500ms);
  const double took = SecondsSince(t0);
  close(fd);
  EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.ToString();
  EXPECT_LT(took, 3.0) << "Connect overran its 500 ms timeout";
  xfer::PeerInfo info;
  XT_EXPECT_CODE(engine_.GetPeerInfo(silent, &info), StatusCode::kNotConnected);
}

TEST_F(IntegrationBadInput, DoubleConnect) {
  XT_EXPECT_CODE(engine_.Connect(peer_.name(), 5s), StatusCode::kAlreadyConnected);
  // The first session is still fine.
  XT_EXPECT_OK(Write({{src_->addr(), r_.addr, 4096}}, 10s));
  EXPECT_EQ(peer_.SumRange(r_.addr, 4096), Hash64(src_->data(), 4096));
}

TEST_F(IntegrationBadInput, BadRegistrations) {
  xfer::MemHandle h = 0;
  XT_EXPECT_CODE(engine_.RegisterMem(nullptr, 4096, xfer::MemType::kHost, &h), StatusCode::kInvalidArgument);
  XT_EXPECT_CODE(engine_.RegisterMem(src_->data(), 0, xfer::MemType::kHost, &h),
                 StatusCode::kInvalidArgument);
  // Host memory as kCuda: not GPU memory where a GPU is usable, else no GPU memory at all.
  XT_EXPECT_CODE(
      engine_.RegisterMem(src_->data(), 4096, xfer::MemType::kCuda, &h),
      xfer::transport::cuda::Available(nullptr) ? StatusCode::kInvalidArgument : StatusCode::kUnsupported);
  XT_EXPECT_CODE(engine_.DeregisterMem(0), StatusCode::kInvalidArgument);
  XT_EXPECT_CODE(engine_.DeregisterMem(0x7777777), StatusCode::kInvalidArgument);
  const Reply r = peer_.Call("regions " + engine_.LocalName());
  ASSERT_TRUE(r.ok) << r.line;
  EXPECT_EQ(r.u64(0), 0u) << "failed registrations became visible to the peer: " << r.line;
}

TEST_F(IntegrationBadInput, HugeTagDoesNotBreakSessions) {
  // A tag longer than the wire format carries must be refused (or carried) without costing
  // the connected peers their sessions.
  LocalBuffer mem(4096);
  xfer::MemHandle h = 0;
  const std::string tag(100000, 't');
  const xfer::Status s = engine_.RegisterMem(mem.data(), mem.len(), xfer::MemType::kHost, &h, tag);
  EXPECT_TRUE(s.ok() || s.code() == StatusCode::kInvalidArgument) << s.ToString();
  // Both directions of the session still work.
  XT_EXPECT_OK(Write({{src_->addr(), r_.addr, 64}}, 5s));
  const Reply regions = peer_.Call("regions " + engine_.LocalName());
  EXPECT_TRUE(regions.ok) << "the peer lost its session with us: " << regions.line;
  if (s.ok()) {
    EXPECT_EQ(regions.u64(0), 1u) << regions.line.substr(0, 200);
    XT_EXPECT_OK(engine_.DeregisterMem(h));
  }
  xfer::PeerInfo info;
  XT_EXPECT_OK(engine_.GetPeerInfo(peer_.name(), &info));
}

TEST_F(IntegrationBadInput, BadRequestHandles) {
  xfer::RequestStatus st;
  XT_EXPECT_CODE(engine_.GetTransferStatus(0, &st), StatusCode::kInvalidArgument);
  XT_EXPECT_CODE(engine_.GetTransferStatus(123456789, &st), StatusCode::kInvalidArgument);
  XT_EXPECT_CODE(engine_.Wait(0, 10ms, &st), StatusCode::kInvalidArgument);
  XT_EXPECT_CODE(engine_.Wait(123456789, 10ms, &st), StatusCode::kInvalidArgument);
  XT_EXPECT_CODE(engine_.Cancel(0), StatusCode::kInvalidArgument);
}

TEST_F(IntegrationBadInput, DeregisterWhileTransferRuns) {
  constexpr uint64_t kPiece = 64 * kMiB;
  const PeerRegion big = peer_.Alloc(kPiece, "doomed");
  ASSERT_NE(big.addr, 0u);
  LocalBuffer src(kPiece);
  src.Fill(3);
  // 1 GiB of writes into one 64 MiB region.
  std::vector<TransferDesc> d(16, TransferDesc{src.addr(), big.addr, kPiece});
  xfer::RequestHandle req = 0;
  XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kWrite, d, 60s, &req));
  const auto t0 = Clock::now();
  // Once DeregisterMem returned, no byte of ours may land there any more: the target reuses
  // the memory at once (the peer fills it the moment DeregisterMem returns).
  const Reply dereg = peer_.Call("dereg " + std::to_string(big.handle) + " 4", 30s);
  EXPECT_TRUE(dereg.ok) << dereg.line;
  EXPECT_LT(SecondsSince(t0), 20.0) << "DeregisterMem on the target blocked for long";
  const Outcome o = WaitFor(engine_, req, 30s);
  ASSERT_NE(o.status.state, RequestState::kWaiting) << "request never ended";
  if (o.status.state != RequestState::kCompleted) {
    EXPECT_EQ(o.status.state, RequestState::kFailed);
    EXPECT_EQ(o.wait.code(), StatusCode::kRemoteAccessDenied) << o.wait.ToString();
  }
  LocalBuffer reused(kPiece);
  reused.Fill(4);
  EXPECT_EQ(peer_.Sum(big), reused.Hash())
      << "the initiator kept writing after the target's DeregisterMem returned";
  // The region is gone for us.
  const uint64_t before = peer_.Sum(big);
  XT_EXPECT_CODE(Write({{src.addr(), big.addr, 4096}}, 10s), StatusCode::kRemoteAccessDenied);
  XT_EXPECT_CODE(Read({{src.addr(), big.addr + 8192, 4096}}, 10s), StatusCode::kRemoteAccessDenied);
  EXPECT_EQ(peer_.Sum(big), before) << "a write landed in a deregistered region";
  std::vector<xfer::RegionInfo> regions;
  XT_ASSERT_OK(engine_.GetRemoteRegions(peer_.name(), &regions));
  for (const auto& reg : regions) EXPECT_NE(reg.addr, big.addr) << "deregistered region listed";
  // Other regions are unaffected.
  ExpectTargetUnchanged();
  XT_EXPECT_OK(Write({{src_->addr(), r_.addr, 4096}}, 10s));
}

TEST_F(IntegrationBadInput, CallsAfterFinalize) {
  engine_.Finalize();
  const std::string peer = peer_.name();
  auto expect_refused = [](const xfer::Status& s, const char* call) {
    EXPECT_TRUE(s.code() == StatusCode::kNotConnected || s.code() == StatusCode::kInvalidArgument)
        << call << " after Finalize -> " << s.ToString();
  };
  expect_refused(Write({{src_->addr(), r_.addr, 64}}, 1s), "TransferSync");
  xfer::RequestHandle req = 0;
  expect_refused(engine_.TransferAsync(peer, Op::kWrite, {{src_->addr(), r_.addr, 64}}, 1s, &req),
                 "TransferAsync");
  expect_refused(engine_.Connect(peer, 1s), "Connect");
  expect_refused(engine_.Disconnect(peer), "Disconnect");
  xfer::PeerInfo info;
  expect_refused(engine_.GetPeerInfo(peer, &info), "GetPeerInfo");
  std::vector<xfer::RegionInfo> regions;
  expect_refused(engine_.GetRemoteRegions(peer, &regions), "GetRemoteRegions");
  xfer::MemHandle h = 0;
  expect_refused(engine_.RegisterMem(src_->data(), 4096, xfer::MemType::kHost, &h), "RegisterMem");
  expect_refused(engine_.DeregisterMem(1), "DeregisterMem");
  xfer::RequestStatus st;
  expect_refused(engine_.GetTransferStatus(1, &st), "GetTransferStatus");
  expect_refused(engine_.Wait(1, 10ms, &st), "Wait");
  expect_refused(engine_.Cancel(1), "Cancel");
  engine_.Finalize();  // twice is harmless
  ExpectTargetUnchanged();
  // The peer saw our goodbye and dropped the session.
  EXPECT_TRUE(PollUntil([&] { return !peer_.Call("info " + engine_.LocalName()).ok; }, 5s));
  // A fresh engine works against the same peer.
  xfer::Engine again;
  XT_ASSERT_OK(again.Initialize("127.0.0.1:0"));
  XT_ASSERT_OK(again.Connect(peer, 10s));
  XT_EXPECT_OK(again.TransferSync(peer, Op::kWrite, {{src_->addr(), r_.addr, 64}}, 10s));
}

TEST(IntegrationBadInputNoPeer, CallsBeforeInitialize) {
  xfer::Engine e;
  LocalBuffer b(4096);
  xfer::MemHandle h = 0;
  auto refused = [](const xfer::Status& s) {
    return s.code() == StatusCode::kNotConnected || s.code() == StatusCode::kInvalidArgument;
  };
  EXPECT_TRUE(refused(e.Connect("127.0.0.1:1", 100ms)));
  EXPECT_TRUE(refused(e.RegisterMem(b.data(), 4096, xfer::MemType::kHost, &h)));
  EXPECT_TRUE(refused(e.TransferSync("127.0.0.1:1", Op::kWrite, {{b.addr(), 1, 1}}, 100ms)));
  e.Finalize();  // before Initialize: harmless
}

TEST(IntegrationBadInputNoPeer, InitializeTwiceAndPortInUse) {
  xfer::Engine a;
  XT_ASSERT_OK(a.Initialize("127.0.0.1:0"));
  EXPECT_FALSE(a.Initialize("127.0.0.1:0").ok()) << "second Initialize accepted";
  xfer::Engine b;
  const xfer::Status s = b.Initialize(a.LocalName());
  EXPECT_FALSE(s.ok()) << "two engines bound the same port";
}

}  // namespace
}  // namespace xfer_test
