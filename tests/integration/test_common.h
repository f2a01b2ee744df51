// Shared helpers for the integration and fault tests: status assertions, page-aligned local
// buffers, and a fixture with one local engine connected to one xfer_test_peer process.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "pattern.h"
#include "peer_process.h"
#include "xfer/engine.h"

namespace xfer {
// Readable gtest output for the enums.
inline void PrintTo(StatusCode c, std::ostream* os) { *os << StatusCodeName(c); }
inline void PrintTo(RequestState s, std::ostream* os) { *os << RequestStateName(s); }
inline void PrintTo(Op op, std::ostream* os) { *os << OpName(op); }
}  // namespace xfer

#define XT_ASSERT_OK(expr)                                          \
  do {                                                              \
    const ::xfer::Status xt_s_ = (expr);                            \
    ASSERT_TRUE(xt_s_.ok()) << #expr << " -> " << xt_s_.ToString(); \
  } while (0)
#define XT_EXPECT_OK(expr)                                          \
  do {                                                              \
    const ::xfer::Status xt_s_ = (expr);                            \
    EXPECT_TRUE(xt_s_.ok()) << #expr << " -> " << xt_s_.ToString(); \
  } while (0)
#define XT_EXPECT_CODE(expr, want)                                          \
  do {                                                                      \
    const ::xfer::Status xt_s_ = (expr);                                    \
    EXPECT_EQ(xt_s_.code(), (want)) << #expr << " -> " << xt_s_.ToString(); \
  } while (0)

namespace xfer_test {

using Clock = std::chrono::steady_clock;
using xfer::Op;
using xfer::PeerAccess;
using xfer::RequestState;
using xfer::StatusCode;
using xfer::TransferDesc;

inline std::string CodeName(StatusCode c) { return std::string(xfer::StatusCodeName(c)); }

inline double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Page-aligned anonymous memory in this process (zeroed), unmapped on destruction.
class LocalBuffer {
 public:
  explicit LocalBuffer(uint64_t len) : len_(len) {
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    map_len_ = (len + page - 1) / page * page;
    void* p = mmap(nullptr, map_len_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    p_ = p == MAP_FAILED ? nullptr : static_cast<unsigned char*>(p);
  }
  ~LocalBuffer() {
    if (p_ != nullptr) munmap(p_, map_len_);
  }
  LocalBuffer(const LocalBuffer&) = delete;
  LocalBuffer& operator=(const LocalBuffer&) = delete;

  unsigned char* data() { return p_; }
  uint64_t addr() const { return reinterpret_cast<uintptr_t>(p_); }
  uint64_t len() const { return len_; }
  void Fill(uint64_t seed) { FillPattern(p_, len_, seed); }
  uint64_t Hash() const { return Hash64(p_, len_); }

 private:
  unsigned char* p_ = nullptr;
  uint64_t len_ = 0;
  uint64_t map_len_ = 0;
};

// Waits for an async request to end (bounded); returns its terminal status and the value
// Wait() returned.
struct Outcome {
  xfer::Status wait;
  xfer::RequestStatus status;
  double seconds = 0;
};
inline Outcome WaitFor(xfer::Engine& e, xfer::RequestHandle req,
                       std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  Outcome o;
  const auto t0 = Clock::now();
  o.wait = e.Wait(req, timeout, &o.status);
  o.seconds = SecondsSince(t0);
  return o;
}

// Polls cond every 5 ms until it is true or timeout passes; returns the final value.
template <typename F>
bool PollUntil(F cond, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    if (cond()) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// A peer process's options as a target that hears every notified request's end
// (notify.outcomes), with ucx on where the initiator forces it.
inline PeerOptions OutcomesTarget(const std::string& forced) {
  PeerOptions o;
  o.extra_args = {"--option", "notify.outcomes=true"};
  if (forced == "ucx") o.extra_args.insert(o.extra_args.end(), {"--ucx", "on"});
  return o;
}

// A local engine whose notification ring to a same-host peer is small (4 KiB, messages of up
// to 100 bytes), and a peer process that may stay stopped (SIGSTOP) a while without either
// side declaring the other dead.
inline xfer::EngineOptions SmallRingOptions() {
  xfer::EngineOptions o;
  o.notify.ring_bytes = 4096;
  o.notify.max_message_bytes = 100;
  o.heartbeat_timeout = std::chrono::seconds(30);
  return o;
}
inline PeerOptions Stoppable(PeerOptions o) {
  o.heartbeat_timeout_ms = 30000;
  return o;
}

// One local engine ("initiator") and one xfer_test_peer process ("target"), connected.
class PeerFixture : public ::testing::Test {
 protected:
  // Override in a subclass to change options before SetUp runs.
  virtual xfer::EngineOptions LocalOptions() { return {}; }
  virtual PeerOptions RemoteOptions() { return {}; }
  virtual bool ConnectInSetUp() { return true; }

  void SetUp() override {
    std::string err;
    ASSERT_TRUE(peer_.Start(RemoteOptions(), &err)) << err;
    XT_ASSERT_OK(engine_.Initialize("127.0.0.1:0", LocalOptions()));
    if (ConnectInSetUp()) {
      XT_ASSERT_OK(engine_.Connect(peer_.name(), std::chrono::seconds(10)));
      // The acceptor may install the session a moment after our Connect returned (that race
      // has its own test, IntegrationSelf.AcceptorKnowsThePeerWhenConnectReturns); tests that
      // drive the peer to use the session wait for it here.
      ASSERT_TRUE(PeerKnowsUs()) << "the peer never listed our session";
    }
  }

  bool PeerKnowsUs() {
    return PollUntil([&] { return peer_.Call("info " + engine_.LocalName()).ok; }, std::chrono::seconds(5));
  }

  xfer::Status Write(const std::vector<TransferDesc>& d,
                     std::chrono::milliseconds t = std::chrono::seconds(60)) {
    return engine_.TransferSync(peer_.name(), Op::kWrite, d, t);
  }
  xfer::Status Read(const std::vector<TransferDesc>& d,
                    std::chrono::milliseconds t = std::chrono::seconds(60)) {
    return engine_.TransferSync(peer_.name(), Op::kRead, d, t);
  }

  // `threads` threads each WRITE their own len bytes into their own part of one peer region,
  // `rounds` times, all at once; every part must hold its writer's bytes.
  void ConcurrentWrites(int threads, uint64_t len, int rounds) {
    const PeerRegion r = peer_.Alloc(threads * len);
    std::vector<std::unique_ptr<LocalBuffer>> bufs;
    for (int t = 0; t < threads; ++t) {
      bufs.push_back(std::make_unique<LocalBuffer>(len));
      bufs.back()->Fill(100 + t);
    }
    std::vector<xfer::Status> results(threads);
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t] {
        for (int i = 0; i < rounds && results[t].ok(); ++i) {
          results[t] = Write({{bufs[t]->addr(), r.addr + t * len, len}});
        }
      });
    }
    for (auto& th : ts) th.join();
    for (int t = 0; t < threads; ++t) {
      XT_EXPECT_OK(results[t]);
      EXPECT_EQ(peer_.SumRange(r.addr + t * len, len), bufs[t]->Hash()) << t;
    }
  }

  // For each size from 1 B to 64 MiB: WRITE random data into a fresh peer region and check it
  // there, let the peer refill the region, READ it back and check. Returns the bytes moved.
  uint64_t RoundTripsOfEverySize() {
    uint64_t moved = 0;
    for (uint64_t size : {1ull, 7ull, 4096ull, 65537ull, (1ull << 20) + 3, 64ull << 20}) {
      SCOPED_TRACE(size);
      const PeerRegion r = peer_.Alloc(size);
      LocalBuffer src(size), back(size);
      src.Fill(size);
      EXPECT_TRUE(Write({{src.addr(), r.addr, size}}).ok());
      EXPECT_EQ(peer_.Sum(r), src.Hash());
      peer_.Fill(r, size + 1);
      EXPECT_TRUE(Read({{back.addr(), r.addr, size}}).ok());
      EXPECT_EQ(back.Hash(), peer_.Sum(r));
      moved += 2 * size;
    }
    return moved;
  }

  // A WRITE running past the end of the peer's region is refused without touching it; the
  // transfers after it work (the transport's resources all came back).
  void RefusalMovesNothing() {
    const PeerRegion r = peer_.Alloc(4096);
    peer_.Fill(r, 5);
    const uint64_t before = peer_.Sum(r);
    LocalBuffer src(8192);
    XT_EXPECT_CODE(Write({{src.addr(), r.addr + 4000, 200}}), StatusCode::kRemoteAccessDenied);
    EXPECT_EQ(peer_.Sum(r), before);
    XT_EXPECT_OK(Write({{src.addr(), r.addr, 4096}}));
    XT_EXPECT_OK(Write({{src.addr(), r.addr, 4096}}));
  }

  // n descriptors of b bytes in one request, scattered (every other block of the peer's
  // region) so nothing coalesces: WRITE them, READ them back elsewhere, compare.
  void ScatteredRoundTrip(uint64_t n, uint64_t b) {
    const PeerRegion r = peer_.Alloc(2 * n * b);
    LocalBuffer src(n * b), back(n * b);
    src.Fill(n + b);
    std::vector<TransferDesc> d;
    for (uint64_t i = 0; i < n; ++i) d.push_back({src.addr() + i * b, r.addr + 2 * i * b, b});
    XT_ASSERT_OK(Write(d));
    for (auto& x : d) x.local_addr = back.addr() + (x.local_addr - src.addr());
    XT_ASSERT_OK(Read(d));
    EXPECT_EQ(back.Hash(), src.Hash());
  }

  // Starts a 1 GiB WRITE and kills the peer 20 ms in: the request must fail with connection
  // lost, within 3 s (the fixture's heartbeat timeout should be shorter).
  void KillPeerDuringLargeWrite() {
    constexpr uint64_t kLen = 64 << 20;
    const PeerRegion r = peer_.Alloc(kLen);
    LocalBuffer src(kLen);
    std::vector<TransferDesc> d(16, TransferDesc{src.addr(), r.addr, kLen});
    xfer::RequestHandle h = 0;
    XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kWrite, d, std::chrono::seconds(60), &h));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    peer_.KillNow();
    const Outcome o = WaitFor(engine_, h, std::chrono::seconds(10));
    EXPECT_EQ(o.status.state, RequestState::kFailed) << xfer::RequestStateName(o.status.state);
    EXPECT_EQ(o.status.status.code(), StatusCode::kConnectionLost) << o.status.status.ToString();
    EXPECT_LT(o.seconds, 3.0);
  }

  PeerProcess peer_;     // destroyed after engine_ (declared first)
  xfer::Engine engine_;  // finalized first on teardown
};

}  // namespace xfer_test
