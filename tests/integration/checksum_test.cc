// End-to-end checksums (TransferOptions::checksum) between real processes, on every transport
// this machine has: clean requests complete, and a byte flipped where the bytes landed (the
// test hook XFER_TEST_CORRUPT_LANDED, set for both processes) fails the request with
// DATA_CORRUPTED naming the descriptor, its notification telling the target so.
#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "pattern.h"
#include "raw_peer.h"
#include "test_common.h"
#include "transport/common/cuda/cuda_api.h"
#include "util/checksum.h"

namespace xfer_test {
namespace {

using namespace std::chrono_literals;

struct Setup {
  std::string name;
  std::string forced;  // EngineOptions::transport of the initiator
  bool staged = false;
  std::string region = "host";  // "host", "shm" (AllocMem) or "gpu" (cudaMalloc'd, registered)
};
void PrintTo(const Setup& s, std::ostream* os) { *os << s.name; }

class Checksums : public PeerFixture, public ::testing::WithParamInterface<Setup> {
 protected:
  static constexpr uint64_t kRegion = 8 << 20;

  // corrupt: the test hook for both processes (descriptor 1 of each checksummed request).
  void Start(bool corrupt) {
    if (GetParam().forced == "ucx") ::setenv("UCX_TLS", "tcp", 1);  // (the peer inherits it)
    if (corrupt) ::setenv("XFER_TEST_CORRUPT_LANDED", "1", 1);
    PeerFixture::SetUp();
    ::unsetenv("XFER_TEST_CORRUPT_LANDED");
    region_ = GetParam().region == "shm"   ? peer_.ShmAlloc(kRegion)
              : GetParam().region == "gpu" ? peer_.DeviceAlloc(kRegion, -1, "", true)
                                           : peer_.Alloc(kRegion);
    local_ = std::make_unique<LocalBuffer>(kRegion);
  }
  void SetUp() override {  // (each test calls Start)
    std::string why;
    if (GetParam().region == "gpu" && !xfer::transport::cuda::Available(&why))
      GTEST_SKIP() << "no GPU: " << why;
  }
  void TearDown() override { ::unsetenv("UCX_TLS"); }
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o;
    o.transport = GetParam().forced;
    if (GetParam().staged) o.staging = xfer::Staging::kAlways;
    return o;
  }
  PeerOptions RemoteOptions() override { return OutcomesTarget(GetParam().forced); }
  // Three descriptors of len bytes at offsets 0, 3 len, 6 len of both sides.
  std::vector<TransferDesc> Three(uint64_t len) const {
    std::vector<TransferDesc> d;
    for (uint64_t k = 0; k < 3; ++k)
      d.push_back({local_->addr() + 3 * k * len, region_.addr + 3 * k * len, len});
    return d;
  }
  xfer::RequestStatus Run(Op op, const std::vector<TransferDesc>& d, std::optional<std::string> notify = {}) {
    xfer::TransferOptions o;
    o.checksum = true;
    o.notify = std::move(notify);
    xfer::RequestHandle h = 0;
    EXPECT_TRUE(engine_.TransferAsync(peer_.name(), op, d, 30s, o, &h).ok());
    return WaitFor(engine_, h).status;
  }

  PeerRegion region_;
  std::unique_ptr<LocalBuffer> local_;
};

TEST_P(Checksums, CleanRequestsCompleteAndTheirBytesArrive) {
  Start(false);
  // Sizes across the paths' cuts: small copies, slices, batches, the target's chunks (4 MiB).
  for (uint64_t len : {1ull, 4096ull, 300000ull, 1ull << 20}) {
    FillPattern(local_->data(), kRegion, len);
    const auto d =
        len >= (1 << 20) ? std::vector<TransferDesc>{{local_->addr(), region_.addr, 5 << 20}} : Three(len);
    const xfer::RequestStatus w = Run(Op::kWrite, d);
    ASSERT_EQ(w.state, RequestState::kCompleted) << len << ": " << w.status.ToString();
    for (const TransferDesc& x : d) {
      ASSERT_EQ(peer_.SumRange(x.remote_addr, x.len), Hash64(reinterpret_cast<void*>(x.local_addr), x.len));
    }
    std::memset(local_->data(), 0, kRegion);
    const xfer::RequestStatus r = Run(Op::kRead, d);
    ASSERT_EQ(r.state, RequestState::kCompleted) << len << ": " << r.status.ToString();
    for (const TransferDesc& x : d) {
      ASSERT_EQ(peer_.SumRange(x.remote_addr, x.len), Hash64(reinterpret_cast<void*>(x.local_addr), x.len));
    }
  }
  // 20,000 descriptors apart from one another: the peer is asked in several parts.
  std::vector<TransferDesc> many;
  for (uint64_t k = 0; k < 20000; ++k)
    many.push_back({local_->addr() + 256 * k, region_.addr + 256 * k + 64, 64});
  const xfer::RequestStatus m = Run(Op::kWrite, many);
  ASSERT_EQ(m.state, RequestState::kCompleted) << m.status.ToString();
  // 64 READs at once (each asks the peer as it starts: 64 asks wait there together).
  std::vector<xfer::RequestHandle> handles(64);
  xfer::TransferOptions checked;
  checked.checksum = true;
  for (uint64_t k = 0; k < handles.size(); ++k) {
    const TransferDesc d{local_->addr() + k * 65536, region_.addr + k * 65536, 65536};
    XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kRead, {d}, 30s, checked, &handles[k]));
  }
  for (xfer::RequestHandle h : handles) {
    const Outcome o = WaitFor(engine_, h);
    ASSERT_EQ(o.status.state, RequestState::kCompleted) << o.status.status.ToString();
  }
  // 10,000 small requests, none reported corrupt (sync, alternating WRITE and READ).
  xfer::TransferOptions o;
  o.checksum = true;
  for (int i = 0; i < 10000; ++i) {
    const TransferDesc d{local_->addr() + (i % 64) * 4096, region_.addr + (i % 64) * 4096, 512};
    xfer::RequestStatus st;
    const xfer::Status s =
        engine_.TransferSync(peer_.name(), i % 2 ? Op::kRead : Op::kWrite, {d}, 30s, o, &st);
    ASSERT_TRUE(s.ok()) << "request " << i << ": " << s.ToString();
  }
  if (GetParam().region == "gpu") {  // (the route each GPU case is about)
    xfer::PeerInfo info;
    XT_ASSERT_OK(engine_.GetPeerInfo(peer_.name(), &info));
    const std::string route = GetParam().forced.empty() ? "cuda" : GetParam().forced;
    EXPECT_GT(info.BytesVia(route), 0u) << "the bytes did not go via " << route;
  }
}

TEST_P(Checksums, AByteFlippedWhereItLandedFailsTheRequestNamingItsDescriptor) {
  Start(true);
  FillPattern(local_->data(), kRegion, 7);
  const auto d = Three(64 << 10);
  const xfer::RequestStatus w = Run(Op::kWrite, d, "blocks");
  EXPECT_EQ(w.state, RequestState::kFailed);
  EXPECT_EQ(w.status.code(), xfer::StatusCode::kDataCorrupted) << w.status.ToString();
  EXPECT_NE(w.status.message().find("descriptor 1:"), std::string::npos) << w.status.ToString();
  EXPECT_EQ(w.landed, (std::vector<uint64_t>{0, 2}));
  // The target hears that it failed, with the descriptors that landed intact (the request
  // ended without waiting for that notification's answer).
  Reply told;
  ASSERT_TRUE(PollUntil([&] { return (told = peer_.Call("notifies")).u64(0) > 0; }, 10s)) << told.line;
  EXPECT_EQ(told.u64(0), 1u) << told.line;
  EXPECT_NE(told.line.find(":blocks!FAILED:0,2"), std::string::npos) << told.line;

  const xfer::RequestStatus r = Run(Op::kRead, d);
  EXPECT_EQ(r.status.code(), xfer::StatusCode::kDataCorrupted) << r.status.ToString();
  EXPECT_NE(r.status.message().find("descriptor 1:"), std::string::npos) << r.status.ToString();
  EXPECT_EQ(r.landed, (std::vector<uint64_t>{0, 2}));

  // Without checksums the hook does nothing, and the request completes.
  XT_ASSERT_OK(engine_.TransferSync(peer_.name(), Op::kWrite, d, 30s));
}

INSTANTIATE_TEST_SUITE_P(Transports, Checksums,
                         ::testing::Values(Setup{"shm", "", false, "shm"}, Setup{"cma", "cma"},
                                           Setup{"tcp", "tcp"},
#ifdef XFER_TEST_UCX
                                           Setup{"ucx", "ucx"},
#endif
                                           Setup{"staged", "", true},
                                           // GPU memory at the target (device_check.sh runs "Gpu"):
                                           // on this host over cuda, its two sides compared here,
                                           // and over tcp, the target asked for its sums
                                           Setup{"Gpu", "", false, "gpu"},
                                           Setup{"GpuOverTcp", "tcp", false, "gpu"}),
                         [](const auto& info) { return info.param.name; });

// GPU memory on the initiator's side, summed there through host buffers: WRITEs from it and
// READs into it over tcp (staged here) to a peer's host memory, clean; then, with the test hook,
// a byte flipped where a READ landed in it. (device_check.sh runs "Gpu".)
TEST(ChecksumsLocalGpu, GpuMemoryOnThisSideIsSummedThroughHostBuffers) {
  std::string why;
  if (!xfer::transport::cuda::Available(&why)) GTEST_SKIP() << "no GPU: " << why;
  PeerProcess peer;
  std::string err;
  ASSERT_TRUE(peer.Start({}, &err)) << err;
  // Descriptors of a little over 1 MiB: each summed here in two chunks of the bounce buffers.
  constexpr uint64_t kLen = (1 << 20) + 4099, kBytes = 3 * kLen;
  const PeerRegion remote = peer.Alloc(kBytes);
  std::vector<unsigned char> pattern(kBytes), back(kBytes);
  FillPattern(pattern.data(), kBytes, 5);
  xfer::TransferOptions checked;
  checked.checksum = true;
  for (const bool corrupt : {false, true}) {
    if (corrupt) ::setenv("XFER_TEST_CORRUPT_LANDED", "1", 1);
    xfer::EngineOptions o;
    o.transport = "tcp";
    o.slice_bytes = o.batch_bytes = 4 << 20;  // (whole descriptors: pieces of two chunks)
    xfer::Engine e;
    XT_ASSERT_OK(e.Initialize("127.0.0.1:0", o));
    ::unsetenv("XFER_TEST_CORRUPT_LANDED");
    XT_ASSERT_OK(e.Connect(peer.name(), 10s));
    void* gpu = nullptr;
    xfer::MemHandle h = 0;
    XT_ASSERT_OK(e.AllocMem(kBytes, xfer::MemType::kCuda, &gpu, &h));
    const uint64_t at = reinterpret_cast<uint64_t>(gpu);
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    const xfer::transport::Slice fill{reinterpret_cast<uint64_t>(pattern.data()), at, kBytes};
    XT_ASSERT_OK(xfer::transport::cuda::Copy(Op::kWrite, std::span(&fill, 1), deadline));
    std::vector<TransferDesc> d;
    for (uint64_t k = 0; k < 3; ++k) d.push_back({at + k * kLen, remote.addr + k * kLen, kLen});
    xfer::RequestStatus st;
    XT_ASSERT_OK(e.TransferSync(peer.name(), Op::kWrite, d, 30s, checked, &st));  // (the peer has no hook)
    EXPECT_EQ(peer.SumRange(remote.addr, kBytes), Hash64(pattern.data(), kBytes));
    const xfer::Status r = e.TransferSync(peer.name(), Op::kRead, d, 30s, checked, &st);
    if (corrupt) {
      EXPECT_EQ(r.code(), xfer::StatusCode::kDataCorrupted) << r.ToString();
      EXPECT_NE(r.message().find("descriptor 1:"), std::string::npos) << r.ToString();
      EXPECT_EQ(st.landed, (std::vector<uint64_t>{0, 2}));
    } else {
      XT_EXPECT_OK(r);
      const xfer::transport::Slice out{reinterpret_cast<uint64_t>(back.data()), at, kBytes};
      XT_ASSERT_OK(xfer::transport::cuda::Copy(Op::kRead, std::span(&out, 1), deadline));
      EXPECT_EQ(Hash64(back.data(), kBytes), Hash64(pattern.data(), kBytes));
    }
    xfer::PeerInfo info;
    XT_ASSERT_OK(e.GetPeerInfo(peer.name(), &info));
    EXPECT_GT(info.BytesVia("staged"), 0u) << "the GPU memory was not staged";
    XT_EXPECT_OK(e.FreeMem(h));
    e.Finalize();
  }
}

// One request over two routes, shm (AllocMem memory, compared in place) and cma (registered
// memory, the peer asked): clean, then a byte flipped in the one the peer is asked for.
TEST(ChecksumsMixed, ARequestOverShmAndCmaChecksBoth) {
  PeerProcess peer;
  std::string err;
  ASSERT_TRUE(peer.Start({}, &err)) << err;
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0", {}));
  XT_ASSERT_OK(e.Connect(peer.name(), 10s));
  const PeerRegion shm = peer.ShmAlloc(1 << 20), reg = peer.Alloc(1 << 20);
  LocalBuffer local(3 << 20);
  FillPattern(local.data(), 3 << 20, 4);
  const std::vector<TransferDesc> d = {{local.addr(), shm.addr, 1 << 20},
                                       {local.addr() + (1 << 20), reg.addr, 1 << 20},
                                       {local.addr() + (2 << 20), shm.addr, 4096}};
  xfer::TransferOptions o;
  o.checksum = true;
  xfer::RequestStatus st;
  XT_ASSERT_OK(e.TransferSync(peer.name(), Op::kWrite, d, 30s, o, &st));
  XT_ASSERT_OK(e.TransferSync(peer.name(), Op::kRead, d, 30s, o, &st));
  xfer::PeerInfo info;
  XT_ASSERT_OK(e.GetPeerInfo(peer.name(), &info));
  EXPECT_EQ(std::count_if(info.moved.begin(), info.moved.end(), [](const auto& m) { return m.bytes > 0; }), 2)
      << "the request did not go over two routes";
  e.Finalize();

  ::setenv("XFER_TEST_CORRUPT_LANDED", "1", 1);
  xfer::Engine corrupting;
  XT_ASSERT_OK(corrupting.Initialize("127.0.0.1:0", {}));
  ::unsetenv("XFER_TEST_CORRUPT_LANDED");
  XT_ASSERT_OK(corrupting.Connect(peer.name(), 10s));
  const xfer::Status s = corrupting.TransferSync(peer.name(), Op::kRead, d, 30s, o, &st);
  EXPECT_EQ(s.code(), xfer::StatusCode::kDataCorrupted) << s.ToString();
  EXPECT_NE(s.message().find("descriptor 1:"), std::string::npos) << s.ToString();
  EXPECT_EQ(st.landed, (std::vector<uint64_t>{0, 2}));
  corrupting.Finalize();
}

// A peer that moves the data (cma needs nothing of it) but never answers for its checksums: it
// is stopped (SIGSTOP) once it knows the 1 MiB region r, which holds 0x5a, and goes on at the
// end; its session outlives the stop.
class ChecksumsStalledPeer : public ::testing::Test {
 protected:
  static constexpr uint64_t kBytes = 1 << 20;
  void SetUp() override {
    std::string err;
    ASSERT_TRUE(peer_.Start({}, &err)) << err;
    xfer::EngineOptions opts;
    opts.transport = "cma";
    opts.heartbeat_timeout = 30s;
    opts.heartbeat_interval = 1s;
    XT_ASSERT_OK(e_.Initialize("127.0.0.1:0", opts));
    XT_ASSERT_OK(e_.Connect(peer_.name(), 10s));
    r_ = peer_.Alloc(kBytes);
    std::memset(reinterpret_cast<void*>(local_.addr()), 0x5a, kBytes);
    XT_ASSERT_OK(e_.TransferSync(peer_.name(), Op::kWrite, {{local_.addr(), r_.addr, kBytes}}, 10s));
    std::memset(reinterpret_cast<void*>(local_.addr()), 0, kBytes);
    peer_.Signal(SIGSTOP);
    checked_.checksum = true;
  }
  void TearDown() override {
    peer_.Signal(SIGCONT);
    e_.Finalize();
  }
  PeerProcess peer_;
  xfer::Engine e_;
  PeerRegion r_;
  LocalBuffer local_{kBytes};
  xfer::TransferOptions checked_;
};

// The request ends TIMEOUT at its deadline, every descriptor moved but unchecked.
TEST_F(ChecksumsStalledPeer, AnAnswerThatNeverComesEndsTheRequestAtItsDeadline) {
  xfer::RequestStatus st;
  const auto t0 = Clock::now();
  const xfer::Status s =
      e_.TransferSync(peer_.name(), Op::kRead, {{local_.addr(), r_.addr, kBytes}}, 1s, checked_, &st);
  const double seconds = SecondsSince(t0);
  EXPECT_EQ(s.code(), xfer::StatusCode::kTimeout) << s.ToString();
  EXPECT_EQ(st.state, RequestState::kTimeout);
  EXPECT_NE(s.message().find("checksum"), std::string::npos) << s.ToString();
  EXPECT_EQ(st.landed, (std::vector<uint64_t>{0}));
  EXPECT_LT(seconds, 3.0) << "ended long after its deadline";
}

// Cancel ends a request that waits for its check at once, CANCELED, every descriptor moved but
// unchecked (it used to wait for the answer until its deadline).
TEST_F(ChecksumsStalledPeer, ACancelWhileTheAnswerIsAwaitedEndsTheRequestAtOnce) {
  xfer::RequestHandle h = 0;
  XT_ASSERT_OK(
      e_.TransferAsync(peer_.name(), Op::kRead, {{local_.addr(), r_.addr, kBytes}}, 30s, checked_, &h));
  // cma reads a stopped process: the bytes arrive, and the request then waits for the answer.
  const auto* got = reinterpret_cast<const uint8_t*>(local_.addr());
  for (const auto until = Clock::now() + 10s; got[kBytes - 1] != 0x5a && Clock::now() < until;) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(got[kBytes - 1], 0x5a) << "the bytes never arrived";
  xfer::RequestStatus st;
  EXPECT_EQ(e_.Wait(h, 200ms, &st).code(), xfer::StatusCode::kTimeout) << "ended without its check";
  const auto t0 = Clock::now();
  XT_ASSERT_OK(e_.Cancel(h));
  const xfer::Status s = e_.Wait(h, 5s, &st);
  EXPECT_LT(SecondsSince(t0), 2.0) << "the cancel did not end the wait for the check";
  EXPECT_EQ(s.code(), xfer::StatusCode::kCanceled) << s.ToString();
  EXPECT_EQ(st.state, RequestState::kCanceled);
  EXPECT_NE(s.message().find("checksum"), std::string::npos) << s.ToString();
  EXPECT_EQ(st.landed, (std::vector<uint64_t>{0}));
}

// An engine's transfers to itself (the local backend): its own memory is read on both sides.
TEST(ChecksumsSelf, CleanRequestsCompleteAndAFlippedByteIsCaught) {
  for (bool corrupt : {false, true}) {
    if (corrupt) ::setenv("XFER_TEST_CORRUPT_LANDED", "0", 1);
    xfer::Engine e;
    xfer::EngineOptions opts;
    opts.checksum = true;  // (the engine's default: no TransferOptions needed)
    XT_ASSERT_OK(e.Initialize("127.0.0.1:0", opts));
    ::unsetenv("XFER_TEST_CORRUPT_LANDED");
    LocalBuffer a(1 << 20), b(1 << 20);
    FillPattern(a.data(), 1 << 20, 3);
    xfer::MemHandle ha = 0, hb = 0;
    XT_ASSERT_OK(e.RegisterMem(a.data(), 1 << 20, xfer::MemType::kHost, &ha));
    XT_ASSERT_OK(e.RegisterMem(b.data(), 1 << 20, xfer::MemType::kHost, &hb));
    xfer::RequestStatus st;
    const xfer::Status s =
        e.TransferSync(e.LocalName(), Op::kWrite, {{a.addr(), b.addr(), 1 << 20}}, 10s, {}, &st);
    if (corrupt) {
      EXPECT_EQ(s.code(), xfer::StatusCode::kDataCorrupted) << s.ToString();
      EXPECT_TRUE(st.landed.empty());
    } else {
      XT_EXPECT_OK(s);
      EXPECT_EQ(Hash64(a.data(), 1 << 20), Hash64(b.data(), 1 << 20));
    }
    e.Finalize();
  }
}

// A peer's asks are checked against the regions it may read: a range outside them, empty or
// straddling a region's end is refused with why, the session stays open; asks past the bound
// on waiting ranges are refused RESOURCE_EXHAUSTED, and an ask whose session ended is given up.
TEST(ChecksumsHostile, APeersAsksAreCheckedBoundedAndGivenUpWithItsSession) {
  namespace wire = xfer::wire;
  xfer::Engine target;
  XT_ASSERT_OK(target.Initialize("127.0.0.1:0", {}));
  constexpr uint64_t kLen = 4 << 20;
  LocalBuffer buf(kLen), other(4096);
  FillPattern(buf.data(), kLen, 9);
  xfer::MemHandle h = 0;
  XT_ASSERT_OK(target.RegisterMem(buf.data(), kLen, xfer::MemType::kHost, &h));
  auto raw_session = std::make_unique<RawSession>(target.LocalName());
  RawSession& raw = *raw_session;
  const wire::Hello hello = raw.Hello(HelloOf("10.9.8.7:6000", 0x5eed));
  ASSERT_FALSE(hello.name.empty());
  // It says it sums ranges of its GPU memory too (a peer asks for those only of such builds).
  EXPECT_EQ(hello.features & (wire::kFeatureDigests | wire::kFeatureGpuDigests),
            wire::kFeatureDigests | wire::kFeatureGpuDigests);
  std::map<uint64_t, wire::DigestAnswer> answers;
  auto await = [&](size_t n) {
    wire::Message m;
    for (auto until = Clock::now() + 10s; answers.size() < n && raw.s->ReadOne(until, &m).ok();) {
      if (auto* a = std::get_if<wire::DigestAnswer>(&m)) {
        EXPECT_TRUE(answers.emplace(a->id, *a).second) << "ask " << a->id << " answered twice";
      }
    }
  };
  raw.Send(wire::Digest{1, false, {{buf.addr(), 4096}, {buf.addr() + 4096, kLen - 4096}}});
  raw.Send(wire::Digest{2, false, {{buf.addr() + kLen - 10, 100}}});  // past the region's end
  raw.Send(wire::Digest{3, true, {{other.addr(), 10}}});              // not registered
  raw.Send(wire::Digest{4, false, {{buf.addr(), 0}}});
  raw.Send(wire::Digest{5, false, {}});  // (an ask for nothing: queued without bound before)
  await(5);
  ASSERT_EQ(answers.size(), 5u);
  EXPECT_EQ(answers[1].code, xfer::StatusCode::kOk) << answers[1].why;
  EXPECT_EQ(answers[1].digests, (std::vector<uint64_t>{xfer::checksum::Of(buf.data(), 4096),
                                                       xfer::checksum::Of(buf.data() + 4096, kLen - 4096)}));
  EXPECT_EQ(answers[2].code, xfer::StatusCode::kRemoteAccessDenied) << answers[2].why;
  EXPECT_EQ(answers[3].code, xfer::StatusCode::kRemoteAccessDenied) << answers[3].why;
  EXPECT_EQ(answers[4].code, xfer::StatusCode::kInvalidArgument) << answers[4].why;
  EXPECT_EQ(answers[5].code, xfer::StatusCode::kInvalidArgument) << answers[5].why;
  EXPECT_NE(answers[3].why.find("range 0"), std::string::npos) << answers[3].why;

  // Asks past the bound on waiting ranges are refused at once: one ask keeps the target's
  // thread busy for minutes (65,536 times the whole region), then asks of one range each wait
  // behind it. Each counts 5 against the bound (1,048,576): fewer than 200,000 fit, where all
  // would if only ranges counted.
  answers.clear();
  raw.Send(wire::Digest{1000, false, std::vector<wire::DigestRange>(65536, {buf.addr(), kLen})});
  for (uint64_t id = 1001; id <= 1000 + 200'000; ++id) raw.Send(wire::Digest{id, false, {{buf.addr(), 64}}});
  wire::Message m;
  for (auto until = Clock::now() + 10s; answers.empty() && raw.s->ReadOne(until, &m).ok();) {
    if (auto* a = std::get_if<wire::DigestAnswer>(&m)) answers.emplace(a->id, *a);
  }
  ASSERT_FALSE(answers.empty()) << "no ask past the bound was refused";
  EXPECT_GE(answers.begin()->first, 1000u + 190'000);
  EXPECT_EQ(answers.begin()->second.code, xfer::StatusCode::kResourceExhausted)
      << answers.begin()->second.why;
  // A canceled ask's ranges stop counting at once (its own 4 until the thread drops it): with
  // 10 asks of one range canceled, an ask of 6 ranges (counting 10) fits where none of 1 did.
  for (uint64_t id = 1001; id <= 1010; ++id) raw.Send(wire::DigestCancel{id});
  raw.Send(wire::Digest{500000, false, std::vector<wire::DigestRange>(6, {buf.addr(), 64})});
  for (auto until = Clock::now() + 2s; raw.s->ReadOne(until, &m).ok();) {
    const auto* a = std::get_if<wire::DigestAnswer>(&m);
    if (a != nullptr && a->id == 500000) ADD_FAILURE() << "refused after the cancels: " << a->why;
  }
  // An ask whose session ends is given up: Finalize does not wait for it.
  const auto t0 = Clock::now();
  raw_session.reset();  // (first: Finalize would wait for its goodbye's answer)
  target.Finalize();
  EXPECT_LT(SecondsSince(t0), 5.0);
}

// A peer whose build cannot sum its GPU memory (its hello lacks kFeatureGpuDigests: older
// builds refused such asks) gets no checksummed request that would ask it to: refused
// UNSUPPORTED before anything moves. Its GPU region is only advertised (no GPU needed here):
// the peer is a raw session, whose tcp port takes no connection. The same peer with the
// feature is asked, and the request goes on to fail for the port.
TEST(ChecksumsHostile, AnOlderPeerIsNotAskedToSumItsGpuMemory) {
  namespace wire = xfer::wire;
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0", {}));
  const auto dead_port = static_cast<uint16_t>(UnusedPort());
  LocalBuffer src(4096);
  src.Fill(1);
  auto request = [&](uint32_t features, uint64_t incarnation) {
    RawSession raw(e.LocalName());
    wire::Hello ours = HelloOf("10.9.8.7:" + std::to_string(6000 + incarnation), incarnation);
    ours.features = features;
    std::string port(sizeof dead_port, '\0');
    std::memcpy(port.data(), &dead_port, sizeof dead_port);
    ours.backends = {{"tcp", port}};
    ours.regions = {{1, xfer::RegionInfo{0x7f0000000000, 1 << 20, xfer::MemType::kCuda, 0, ""}, {}}};
    EXPECT_FALSE(raw.Hello(ours).name.empty());
    xfer::TransferOptions o;
    o.checksum = true;
    return e.TransferSync(ours.name, Op::kWrite, {{src.addr(), 0x7f0000000000, 4096}}, 2s, o);
  };
  const xfer::Status older = request(wire::kFeatureDigests, 0x01d);
  EXPECT_EQ(older.code(), StatusCode::kUnsupported) << older.ToString();
  EXPECT_NE(older.message().find("GPU memory"), std::string::npos) << older.ToString();
  const xfer::Status newer = request(wire::kFeatureDigests | wire::kFeatureGpuDigests, 0x2e3);
  EXPECT_EQ(newer.code(), StatusCode::kConnectionLost) << newer.ToString();
  e.Finalize();
}

// The target's thread takes the sessions' asks in turns of a chunk each: a peer that asks for
// the checksums of huge ranges (minutes of reading) delays another peer's checksummed WRITE by
// a chunk per turn, not by the whole of its ask.
TEST(ChecksumsHostile, AHugeAskDelaysAnotherPeersAskByATurnOnly) {
  namespace wire = xfer::wire;
  constexpr uint64_t kLen = 4 << 20;
  LocalBuffer buf(kLen), src(1 << 20);  // (first: they outlive the engines)
  xfer::Engine target;
  xfer::EngineOptions to;
  to.heartbeat_timeout = 60s;  // (the raw session sends none: it stays, and so does its ask)
  XT_ASSERT_OK(target.Initialize("127.0.0.1:0", to));
  xfer::MemHandle h = 0;
  XT_ASSERT_OK(target.RegisterMem(buf.data(), kLen, xfer::MemType::kHost, &h));
  auto raw = std::make_unique<RawSession>(target.LocalName());
  ASSERT_FALSE(raw->Hello(HelloOf("10.9.8.7:6000", 0x5eed)).name.empty());
  raw->Send(wire::Digest{1, false, std::vector<wire::DigestRange>(65536, {buf.addr(), kLen})});  // 256 GiB

  xfer::Engine peer;
  xfer::EngineOptions o;
  o.transport = "tcp";
  XT_ASSERT_OK(peer.Initialize("127.0.0.1:0", o));
  XT_ASSERT_OK(peer.Connect(target.LocalName(), 10s));
  src.Fill(5);
  xfer::TransferOptions checked;
  checked.checksum = true;
  for (int k = 0; k < 3; ++k) {
    const auto t0 = Clock::now();
    XT_ASSERT_OK(
        peer.TransferSync(target.LocalName(), Op::kWrite, {{src.addr(), buf.addr(), 1 << 20}}, 10s, checked));
    EXPECT_LT(SecondsSince(t0), 2.0) << "write " << k << " waited behind the huge ask";
  }
  EXPECT_EQ(Hash64(buf.data(), 1 << 20), src.Hash());
  peer.Finalize();
  raw.reset();
  target.Finalize();
}

// A request whose checksums the peer still computes when it ends (its deadline passed, or it
// was canceled) tells the peer to drop the ask (wire::DigestCancel): the next request's ask,
// which waits behind it in that peer's turn, is answered at once instead of after the whole of
// the abandoned one. A READ's ask leaves as it starts: here 256 GiB to checksum at the target
// (half a minute or more).
class ChecksumsAbandoned : public ::testing::Test {
 protected:
  static constexpr uint64_t kLen = 64 << 20;
  // Ends the huge READ (of that deadline) with `end` while the target computes its
  // checksums, then times the next checksummed READ.
  void ExpectTheNextAskAnsweredAtOnce(
      std::chrono::milliseconds deadline,
      const std::function<xfer::Status(xfer::Engine&, xfer::RequestHandle)>& end) {
    LocalBuffer buf(kLen), dst(kLen);  // (first: they outlive the engines)
    buf.Fill(8);
    xfer::Engine target;
    XT_ASSERT_OK(target.Initialize("127.0.0.1:0", {}));
    xfer::MemHandle h = 0;
    XT_ASSERT_OK(target.RegisterMem(buf.data(), kLen, xfer::MemType::kHost, &h));
    xfer::Engine peer;
    xfer::EngineOptions o;
    o.transport = "tcp";
    XT_ASSERT_OK(peer.Initialize("127.0.0.1:0", o));
    XT_ASSERT_OK(peer.Connect(target.LocalName(), 10s));
    xfer::TransferOptions checked;
    checked.checksum = true;
    const std::vector<TransferDesc> huge(4096, {dst.addr(), buf.addr(), kLen});
    xfer::RequestHandle r = 0;
    XT_ASSERT_OK(peer.TransferAsync(target.LocalName(), Op::kRead, huge, deadline, checked, &r));
    XT_EXPECT_OK(end(peer, r));
    const auto t0 = Clock::now();
    XT_ASSERT_OK(
        peer.TransferSync(target.LocalName(), Op::kRead, {{dst.addr(), buf.addr(), 1 << 20}}, 30s, checked));
    EXPECT_LT(SecondsSince(t0), 3.0) << "the next ask waited for the abandoned one";
    EXPECT_EQ(Hash64(dst.data(), 1 << 20), Hash64(buf.data(), 1 << 20));
    peer.Finalize();
    target.Finalize();
  }
};

TEST_F(ChecksumsAbandoned, AnAskPastItsDeadlineIsDroppedByThePeer) {
  ExpectTheNextAskAnsweredAtOnce(200ms, [](xfer::Engine& e, xfer::RequestHandle r) {
    xfer::RequestStatus st;
    if (xfer::Status w = e.Wait(r, 30s, &st); st.state == RequestState::kWaiting)
      return w;  // (still running)
    return st.state == RequestState::kTimeout ? xfer::Status::Ok()
                                              : xfer::Status(StatusCode::kInternal, st.status.ToString());
  });
}

TEST_F(ChecksumsAbandoned, AnAskOfACanceledRequestIsDroppedByThePeer) {
  ExpectTheNextAskAnsweredAtOnce(60s, [](xfer::Engine& e, xfer::RequestHandle r) {
    std::this_thread::sleep_for(100ms);  // (under way, its ask at the target)
    if (xfer::Status s = e.Cancel(r); !s.ok()) return s;
    xfer::RequestStatus st;
    if (xfer::Status w = e.Wait(r, 30s, &st); st.state == RequestState::kWaiting)
      return w;  // (still running)
    return st.state == RequestState::kCanceled ? xfer::Status::Ok()
                                               : xfer::Status(StatusCode::kInternal, st.status.ToString());
  });
}

}  // namespace
}  // namespace xfer_test
