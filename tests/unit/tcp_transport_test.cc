// The tcp transport against itself over loopback, real sockets: the target side's own checks.
#include "transport/tcp/tcp_transport.h"
#include "transport/tcp/tcp_wire.h"
#include "util/checksum.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>
#include <vector>

namespace xfer::transport {
namespace {

// With GetParam(), the target moves every range through staging buffers smaller than some
// slices (host memory standing in for GPU memory, as under EngineOptions::staging=always).
class TcpTransportTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    region_.assign(1 << 20, 0x11);
    TcpTargetHooks hooks;
    hooks.incarnation = 42;
    hooks.region_access = [this](uint64_t a, uint64_t l, bool) {
      if (a >= hold_from_.load()) std::this_thread::sleep_for(kHold);
      uint64_t base = reinterpret_cast<uint64_t>(region_.data());
      TcpTargetAccess access;
      access.allowed = a >= base && a + l <= base + region_.size();
      access.writable = a + l <= read_only_from_.load();
      access.staged = GetParam();
      return access;
    };
    hooks.staging_bytes = 64 << 10;  // smaller than some slices
    hooks.is_peer = [this](uint64_t inc) { return inc == 42 && peer_known_; };
    tcp_ = std::make_unique<TcpTransport>(TcpOptions{2, false, std::chrono::milliseconds(2000)}, hooks);
    ASSERT_TRUE(tcp_->Start("127.0.0.1").ok());
    TcpPeer self{42, "127.0.0.1", tcp_->port(), ""};
    ASSERT_TRUE(tcp_->Connect(self, &link_).ok());
  }
  uint64_t R(uint64_t off) { return reinterpret_cast<uint64_t>(region_.data()) + off; }
  Status Exec(Op op, std::vector<Slice> b) {
    return link_->Execute(op, b, Clock::now() + std::chrono::seconds(5));
  }

  // The target holds every batch that names an address at or past hold_from_ for kHold before
  // it serves it: a connection busy for a known time, however fast the machine.
  static constexpr std::chrono::milliseconds kHold{10};
  std::atomic<uint64_t> hold_from_{~0ull};
  std::atomic<uint64_t> read_only_from_{~0ull};  // ranges that end past it are read-only
  std::vector<uint8_t> region_;
  bool peer_known_ = true;
  std::unique_ptr<TcpTransport> tcp_;
  std::shared_ptr<Link> link_;
};

TEST_P(TcpTransportTest, WritesAndReadsScatteredSlices) {
  std::vector<uint8_t> src(3000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7);
  uint64_t s = reinterpret_cast<uint64_t>(src.data());
  ASSERT_TRUE(Exec(Op::kWrite, {{s, R(100), 1000}, {s + 1000, R(5000), 2000}}).ok());
  EXPECT_EQ(std::memcmp(region_.data() + 100, src.data(), 1000), 0);
  EXPECT_EQ(std::memcmp(region_.data() + 5000, src.data() + 1000, 2000), 0);
  std::vector<uint8_t> back(3000);
  uint64_t b = reinterpret_cast<uint64_t>(back.data());
  ASSERT_TRUE(Exec(Op::kRead, {{b, R(100), 1000}, {b + 1000, R(5000), 2000}}).ok());
  EXPECT_EQ(back, src);
}

TEST_P(TcpTransportTest, EveryAlignmentAndLengthKeepsTheStreamFramed) {
  // Frames are padded to the payload's address alignment: walk every local and remote offset
  // mod 64 and lengths that leave every tail size, interleaving refusals, on the same links.
  std::vector<uint8_t> src(4096 + 64), back(4096 + 64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 13 + 5);
  const uint64_t s = reinterpret_cast<uint64_t>(src.data());
  const uint64_t b = reinterpret_cast<uint64_t>(back.data());
  for (uint64_t off = 0; off < 64; ++off) {
    const uint64_t len = 1 + off * 61;  // 1 .. 3844 bytes
    const uint64_t roff = 64 * off + (off * 7) % 64;
    ASSERT_TRUE(Exec(Op::kWrite, {{s + off, R(roff), len}}).ok()) << off;
    ASSERT_EQ(std::memcmp(region_.data() + roff, src.data() + off, len), 0) << off;
    std::fill(back.begin(), back.end(), 0);
    ASSERT_TRUE(Exec(Op::kRead, {{b + (63 - off), R(roff), len}, {b + 4096, R(0), off + 1}}).ok()) << off;
    ASSERT_EQ(std::memcmp(back.data() + (63 - off), src.data() + off, len), 0) << off;
    ASSERT_EQ(std::memcmp(back.data() + 4096, region_.data(), off + 1), 0) << off;
    if (off % 8 == 0) {
      EXPECT_EQ(Exec(Op::kWrite, {{s + off, R(region_.size() - 1), len + 1}}).code(),
                StatusCode::kRemoteAccessDenied);
      EXPECT_EQ(Exec(Op::kRead, {{b, R(0) - 64, off + 1}}).code(), StatusCode::kRemoteAccessDenied);
    }
  }
}

TEST_P(TcpTransportTest, TargetRefusesRangesOutsideItsRegionsAndStaysUsable) {
  // The initiator's own check is bypassed here: the target must refuse on its own.
  std::vector<uint8_t> src(4096, 0xee);
  uint64_t s = reinterpret_cast<uint64_t>(src.data());
  const std::vector<uint8_t> before = region_;
  // The second slice runs past the region's end: nothing of the batch may land.
  Status st = Exec(Op::kWrite, {{s, R(0), 100}, {s, R(region_.size() - 10), 100}});
  EXPECT_EQ(st.code(), StatusCode::kRemoteAccessDenied) << st.ToString();
  EXPECT_EQ(region_, before);
  std::vector<uint8_t> back(100);
  st = Exec(Op::kRead, {{reinterpret_cast<uint64_t>(back.data()), R(0) - 4096, 100}});
  EXPECT_EQ(st.code(), StatusCode::kRemoteAccessDenied) << st.ToString();
  // The same connections go on working.
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(Exec(Op::kWrite, {{s, R(0), 4096}}).ok());
  EXPECT_EQ(region_[0], 0xee);
}

TEST_P(TcpTransportTest, TargetRefusesWritesIntoReadOnlyRangesAndServesReads) {
  // The upper half is read-only for peers; the initiator's own check is bypassed here.
  read_only_from_ = R(region_.size() / 2);
  std::vector<uint8_t> src(4096, 0xee), back(4096);
  const uint64_t s = reinterpret_cast<uint64_t>(src.data());
  const std::vector<uint8_t> before = region_;
  // A batch whose last slice is read-only: nothing of it lands.
  Status st = Exec(Op::kWrite, {{s, R(0), 100}, {s, R(region_.size() / 2), 100}});
  EXPECT_EQ(st.code(), StatusCode::kRemoteAccessDenied) << st.ToString();
  EXPECT_NE(st.message().find("read-only"), std::string::npos) << st.message();
  st = Exec(Op::kWrite, {{s, R(region_.size() / 2 - 50), 100}});  // straddles the boundary
  EXPECT_EQ(st.code(), StatusCode::kRemoteAccessDenied) << st.ToString();
  EXPECT_EQ(region_, before);
  // READs of it are served, and WRITEs below it land, on the same connections.
  ASSERT_TRUE(
      Exec(Op::kRead, {{reinterpret_cast<uint64_t>(back.data()), R(region_.size() - 4096), 4096}}).ok());
  EXPECT_EQ(back, std::vector<uint8_t>(4096, 0x11));
  ASSERT_TRUE(Exec(Op::kWrite, {{s, R(0), 4096}}).ok());
  EXPECT_EQ(region_[0], 0xee);
}

TEST_P(TcpTransportTest, RefusesDataConnectionsFromStrangers) {
  peer_known_ = false;
  std::vector<uint8_t> src(64, 1);
  Status st = Exec(Op::kWrite, {{reinterpret_cast<uint64_t>(src.data()), R(0), 64}});
  EXPECT_EQ(st.code(), StatusCode::kConnectionLost) << st.ToString();
  EXPECT_EQ(region_[0], 0x11);
}

TEST_P(TcpTransportTest, GarbageOnTheDataPortClosesOnlyThatConnection) {
  net::Fd fd;
  ASSERT_TRUE(net::ConnectTcp(net::Address{"127.0.0.1", tcp_->port(), true},
                              Clock::now() + std::chrono::seconds(2), &fd)
                  .ok());
  const char junk[] = "GET / HTTP/1.0\r\n\r\n and some more bytes to fill the hello";
  ASSERT_TRUE(net::SendAll(fd.get(), junk, sizeof junk, Clock::now() + std::chrono::seconds(2)).ok());
  char c;
  EXPECT_FALSE(net::RecvAll(fd.get(), &c, 1, Clock::now() + std::chrono::seconds(3)).ok());
  std::vector<uint8_t> src(64, 2);
  EXPECT_TRUE(Exec(Op::kWrite, {{reinterpret_cast<uint64_t>(src.data()), R(0), 64}}).ok());
}

// A data connection that passed the handshake as peer 42 (the wire format in tcp_transport.h),
// to send frames the engine's own initiator never would.
net::Fd Handshake(uint16_t port) {
  net::Fd fd;
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  EXPECT_TRUE(net::ConnectTcp(net::Address{"127.0.0.1", port, true}, deadline, &fd).ok());
  const auto hello = tcp_wire::DataHello(42, 42);  // (the target's incarnation, and ours)
  uint8_t accepted[64];
  EXPECT_TRUE(net::SendAll(fd.get(), hello.data(), hello.size(), deadline).ok());
  EXPECT_TRUE(net::RecvAll(fd.get(), accepted, sizeof accepted, deadline).ok());
  EXPECT_EQ(accepted[0], 0) << "the target refused the handshake";
  return fd;
}

// A batch frame: header (op, lead, count, total), descriptors, lead zeros, the payload, then
// zeros to a multiple of 64 bytes.
std::vector<uint8_t> Frame(uint8_t op, uint8_t lead, uint32_t count, uint64_t total,
                           const std::vector<std::pair<uint64_t, uint64_t>>& slices,
                           const std::vector<uint8_t>& payload = {}) {
  std::vector<uint8_t> f(16 + 16 * slices.size() + (lead < 64 ? lead : 0));
  f[0] = op;
  f[1] = lead;
  std::memcpy(&f[4], &count, 4);
  std::memcpy(&f[8], &total, 8);
  for (size_t i = 0; i < slices.size(); ++i) {
    std::memcpy(&f[16 + 16 * i], &slices[i].first, 8);
    std::memcpy(&f[24 + 16 * i], &slices[i].second, 8);
  }
  f.insert(f.end(), payload.begin(), payload.end());
  f.resize((f.size() + 63) / 64 * 64);
  return f;
}

TEST_P(TcpTransportTest, ConnectionsThatSayNothingAreCappedAndPeersServed) {
  // 100 connections that never send their handshake: past kMaxPendingHandshakes the target
  // closes the new ones at once (each waiting one would hold a thread for io_timeout, 2 s).
  std::vector<net::Fd> idle(100);
  for (auto& fd : idle) {
    ASSERT_TRUE(net::ConnectTcp(net::Address{"127.0.0.1", tcp_->port(), true},
                                Clock::now() + std::chrono::seconds(2), &fd)
                    .ok());
  }
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  size_t closed = 0;
  for (auto& fd : idle) {  // closed by the target: readable, at end of stream
    pollfd p{fd.get(), POLLIN, 0};
    char c;
    if (::poll(&p, 1, 0) == 1 && ::recv(fd.get(), &c, 1, MSG_DONTWAIT) == 0) ++closed;
  }
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_GE(closed, idle.size() - TcpTransport::kMaxPendingHandshakes);
  EXPECT_LE(closed, idle.size() - TcpTransport::kMaxPendingHandshakes + 8);  // (a few may time out)
  EXPECT_LT(waited, 1.9) << "the excess waited for the handshake timeout";
  idle.clear();
  std::vector<uint8_t> src(4096, 9);
  EXPECT_TRUE(Exec(Op::kWrite, {{reinterpret_cast<uint64_t>(src.data()), R(0), 4096}}).ok());
  EXPECT_EQ(region_[0], 9);
}

template <typename F>
bool PollUntil(F cond, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!cond()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

size_t ThreadsOfThisProcess() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

TEST_P(TcpTransportTest, DataConnectionsHoldNoThreadWhileHandshakingOrIdle) {
  // 40 connections that stop halfway through their hello hold no thread of the target's
  // (before: one each, for the whole handshake timeout).
  const size_t before = ThreadsOfThisProcess();
  std::vector<net::Fd> idle(40);
  const auto hello = tcp_wire::DataHello(42, 42);
  for (auto& fd : idle) {
    ASSERT_TRUE(net::ConnectTcp(net::Address{"127.0.0.1", tcp_->port(), true},
                                Clock::now() + std::chrono::seconds(2), &fd)
                    .ok());
    ASSERT_TRUE(
        net::SendAll(fd.get(), hello.data(), hello.size() / 2, Clock::now() + std::chrono::seconds(2)).ok());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // (the target has accepted them)
  EXPECT_LE(ThreadsOfThisProcess(), before + 2) << "a thread per connection still in its handshake";
  // 200 connections past their handshake, each moving a batch in turn: once idle, they hold
  // no thread (before: 200 threads).
  std::vector<net::Fd> served;
  std::vector<uint8_t> payload(64, 7);
  const auto frame = Frame(static_cast<uint8_t>(Op::kWrite), 0, 1, 64, {{R(0), 64}}, payload);
  for (int i = 0; i < 200; ++i) {
    served.push_back(Handshake(tcp_->port()));
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    ASSERT_TRUE(net::SendAll(served.back().get(), frame.data(), frame.size(), deadline).ok());
    uint8_t reply[64];
    ASSERT_TRUE(net::RecvAll(served.back().get(), reply, sizeof reply, deadline).ok()) << i;
    ASSERT_EQ(reply[0], 0) << i;
  }
  EXPECT_EQ(region_[0], 7);
  // Each keeps its thread for TcpTransport::kServeGrace after its batch; idle, the threads go
  // (a second after) but one, and one that serves the engine's own link below.
  EXPECT_TRUE(PollUntil([&] { return tcp_->serve_threads() <= 2; }, std::chrono::seconds(10)))
      << tcp_->serve_threads() << " threads serve 200 idle connections";
  // (A thread that left the pool may still be on its way out of the process: ASan's exits are
  // slow. One that stays is counted after the wait.)
  PollUntil([&] { return ThreadsOfThisProcess() <= before + 2; }, std::chrono::seconds(5));
  EXPECT_LE(ThreadsOfThisProcess(), before + 2) << "threads grew with the connections";
  std::vector<uint8_t> src(64, 6);
  EXPECT_TRUE(Exec(Op::kWrite, {{reinterpret_cast<uint64_t>(src.data()), R(0), 64}}).ok());
}

TEST_P(TcpTransportTest, ConnectionsBusyAtOnceAreServedAtOnce) {
  // 8 connections whose batches each stall halfway for 300 ms, all at once: each gets a thread,
  // so they end together (about 300 ms), not one after another (2.4 s).
  std::vector<net::Fd> conns;
  for (int i = 0; i < 8; ++i) conns.push_back(Handshake(tcp_->port()));
  std::vector<uint8_t> payload(4096, 3);
  const auto frame = Frame(static_cast<uint8_t>(Op::kWrite), 0, 1, 4096, {{R(0), 4096}}, payload);
  const auto t0 = Clock::now();
  for (auto& c : conns)
    ASSERT_TRUE(net::SendAll(c.get(), frame.data(), 1024, t0 + std::chrono::seconds(2)).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_GE(tcp_->serve_threads(), 8u);
  for (auto& c : conns) {
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    ASSERT_TRUE(net::SendAll(c.get(), frame.data() + 1024, frame.size() - 1024, deadline).ok());
  }
  for (auto& c : conns) {
    uint8_t reply[64];
    ASSERT_TRUE(net::RecvAll(c.get(), reply, sizeof reply, Clock::now() + std::chrono::seconds(2)).ok());
    EXPECT_EQ(reply[0], 0);
  }
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 1.5);
  EXPECT_EQ(region_[0], 3);
}

TEST_P(TcpTransportTest, APeerEngineHoldsAtMostItsShareOfStagingBuffers) {
  // 40 connections of one peer engine, each with a staged WRITE stalled halfway through its
  // payload: the target stages through at most kStagingBuffersPerPeer buffers (one per frame
  // that moves), not one per connection; the other frames wait for one, and every batch lands.
  constexpr int kConnections = 40;
  static_assert(kConnections > TcpTransport::kStagingBuffersPerPeer);
  std::vector<net::Fd> conns;
  std::vector<std::vector<uint8_t>> frames;
  for (int i = 0; i < kConnections; ++i) {
    conns.push_back(Handshake(tcp_->port()));
    frames.push_back(Frame(static_cast<uint8_t>(Op::kWrite), 0, 1, 4096, {{R(4096 * i), 4096}},
                           std::vector<uint8_t>(4096, static_cast<uint8_t>(i + 1))));
  }
  const auto t0 = Clock::now();
  for (int i = 0; i < kConnections; ++i)
    ASSERT_TRUE(net::SendAll(conns[i].get(), frames[i].data(), 1024, t0 + std::chrono::seconds(2)).ok());
  const int bound = GetParam() ? TcpTransport::kStagingBuffersPerPeer : 0;
  PollUntil([&] { return tcp_->staging_buffers_lent() >= bound; }, std::chrono::seconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // (and no more come)
  EXPECT_EQ(tcp_->staging_buffers(), bound) << "staging buffers made for one peer's stalled frames";
  EXPECT_EQ(tcp_->staging_buffers_lent(), bound);
  for (int i = 0; i < kConnections; ++i) {
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    ASSERT_TRUE(
        net::SendAll(conns[i].get(), frames[i].data() + 1024, frames[i].size() - 1024, deadline).ok());
  }
  for (int i = 0; i < kConnections; ++i) {
    uint8_t reply[64];
    ASSERT_TRUE(
        net::RecvAll(conns[i].get(), reply, sizeof reply, Clock::now() + std::chrono::seconds(2)).ok());
    EXPECT_EQ(reply[0], 0) << "connection " << i;
    EXPECT_EQ(region_[4096 * i + 4095], i + 1) << "connection " << i;
  }
  EXPECT_LE(tcp_->staging_buffers(), TcpTransport::kStagingBuffersPerPeer);
  EXPECT_EQ(tcp_->staging_buffers_lent(), 0) << "a staging buffer was not given back";
}

TEST_P(TcpTransportTest, AFenceEndsWithinTheIoTimeoutWhilePeersTrickle) {
  // Three connections each start a WRITE into our memory and then trickle its payload, one
  // byte every 100 ms, the second starting 1.5 s after the first and the third 1.5 s after
  // that. Each frame ends at its own io_timeout (2 s), but a fence that waited for one after
  // the other would take ~5 s (before: it did). It must end within the io_timeout, closing
  // the connections still busy then.
  const auto io = std::chrono::milliseconds(2000);
  std::vector<net::Fd> trickling;
  for (int i = 0; i < 3; ++i) trickling.push_back(Handshake(tcp_->port()));
  const auto frame = Frame(static_cast<uint8_t>(Op::kWrite), 0, 1, 4096, {{R(0), 4096}});
  const auto t0 = Clock::now();
  std::atomic<bool> fenced{false};
  std::chrono::duration<double> took{};
  size_t started = 0;
  std::thread fence;
  while (!fenced.load() && Clock::now() - t0 < std::chrono::seconds(8)) {
    if (started < trickling.size() && Clock::now() - t0 >= started * std::chrono::milliseconds(1500)) {
      EXPECT_TRUE(net::SendAll(trickling[started++].get(), frame.data(), 16 + 16, Clock::now() + io).ok());
    }
    for (size_t i = 0; i < started; ++i) ::send(trickling[i].get(), "x", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (!fence.joinable() && Clock::now() - t0 >= std::chrono::milliseconds(100)) {
      fence = std::thread([&] {
        const auto f0 = Clock::now();
        tcp_->Fence(f0 + io);
        took = Clock::now() - f0;
        fenced.store(true);
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  fence.join();
  EXPECT_LT(took.count(), 2.9) << "the fence waited for one trickling connection after another";
  trickling.clear();
  std::vector<uint8_t> src(64, 7);  // and the engine's own link is served as before
  EXPECT_TRUE(Exec(Op::kWrite, {{reinterpret_cast<uint64_t>(src.data()), R(0), 64}}).ok());
  EXPECT_EQ(region_[0], 7);
}

TEST_P(TcpTransportTest, APeerEngineHoldsAtMostItsShareOfDataConnections) {
  std::vector<net::Fd> held;
  for (size_t i = 0; i < TcpTransport::kMaxConnectionsPerPeer; ++i) held.push_back(Handshake(tcp_->port()));
  // One more of peer 42's: refused.
  net::Fd fd;
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  ASSERT_TRUE(net::ConnectTcp(net::Address{"127.0.0.1", tcp_->port(), true}, deadline, &fd).ok());
  const auto hello = tcp_wire::DataHello(42, 42);
  uint8_t answer[64] = {};
  ASSERT_TRUE(net::SendAll(fd.get(), hello.data(), hello.size(), deadline).ok());
  ASSERT_TRUE(net::RecvAll(fd.get(), answer, sizeof answer, deadline).ok());
  uint32_t code = 0;
  std::memcpy(&code, answer, 4);
  EXPECT_EQ(code, static_cast<uint32_t>(StatusCode::kResourceExhausted));
  held.clear();  // and once they are gone, the peer is served again
  std::vector<uint8_t> src(64, 3);
  Status st;
  for (int i = 0;
       i < 50 && !(st = Exec(Op::kWrite, {{reinterpret_cast<uint64_t>(src.data()), R(0), 64}})).ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(region_[0], 3);
}

TEST_P(TcpTransportTest, MalformedFramesCloseOnlyTheirConnection) {
  // A peer past the handshake sends frames the engine's initiator never would. Each must close
  // that connection without touching memory; every other connection goes on working.
  constexpr uint8_t kRead = static_cast<uint8_t>(Op::kRead), kWrite = static_cast<uint8_t>(Op::kWrite);
  const uint64_t r = R(0), huge = 1ull << 63;
  const std::vector<std::pair<const char*, std::vector<uint8_t>>> frames = {
      {"unknown op", Frame(7, 0, 1, 64, {{r, 64}})},
      {"unknown flags",
       [&] {
         auto f = Frame(kRead, 0, 1, 64, {{r, 64}});
         f[2] = 2;
         return f;
       }()},
      {"no slices", Frame(kWrite, 0, 0, 0, {})},
      {"too many slices", Frame(kRead, 0, 1025, 64, {{r, 64}})},
      {"batch over 1 GiB", Frame(kRead, 0, 1, (1ull << 30) + 1, {{r, (1ull << 30) + 1}})},
      {"lead past the alignment", Frame(kWrite, 64, 1, 64, {{r, 64}})},
      {"lead on a READ", Frame(kRead, 8, 1, 64, {{r, 64}})},
      {"total is not the sum", Frame(kRead, 0, 2, 64, {{r, 64}, {r + 64, 64}})},
      {"empty slice", Frame(kRead, 0, 2, 64, {{r, 64}, {r + 64, 0}})},
      {"range wraps", Frame(kRead, 0, 1, 64, {{~0ull - 10, 64}})},
      {"lengths overflow", Frame(kRead, 0, 2, 0, {{r, huge}, {r, huge}})},
  };
  const std::vector<uint8_t> before = region_;
  for (const auto& [what, frame] : frames) {
    net::Fd fd = Handshake(tcp_->port());
    const auto deadline = Clock::now() + std::chrono::seconds(3);
    ASSERT_TRUE(net::SendAll(fd.get(), frame.data(), frame.size(), deadline).ok()) << what;
    uint8_t reply[64];
    const Status s = net::RecvAll(fd.get(), reply, sizeof reply, deadline);
    EXPECT_EQ(s.code(), StatusCode::kConnectionLost) << what << ": " << s.ToString();
    EXPECT_EQ(region_, before) << what;
  }
  std::vector<uint8_t> src(64, 5);
  EXPECT_TRUE(Exec(Op::kWrite, {{reinterpret_cast<uint64_t>(src.data()), R(0), 64}}).ok());
  EXPECT_EQ(region_[0], 5);
}

TEST_P(TcpTransportTest, RandomFramesNeverTouchMemoryOrStopTheTarget) {
  // 300 frames of random header fields and descriptors (a fixed seed), none naming the region,
  // each on a connection of its own that then shuts its sending side: whatever the target makes
  // of a frame (refusal, close), the region stays as it was and the transport goes on working.
  std::mt19937_64 rng(20261130);
  auto pick = [&](std::initializer_list<uint64_t> v) { return *(v.begin() + rng() % v.size()); };
  const std::vector<uint8_t> before = region_;
  const uint64_t base = R(0), end = R(region_.size());
  for (int i = 0; i < 300; ++i) {
    const uint32_t count = static_cast<uint32_t>(pick({0, 1, 2, 7, 1024, 1025, rng() % 1100}));
    std::vector<std::pair<uint64_t, uint64_t>> slices;
    uint64_t sum = 0;
    for (uint32_t k = 0; k < std::min<uint32_t>(count, 1024); ++k) {
      const uint64_t addr = pick({0, base - 4096, end, ~0ull - rng() % 128, rng() | (1ull << 63)});
      const uint64_t len = pick({0, 1, 64, 4096, 1ull << 31, ~0ull, rng()});
      slices.push_back({addr, len});
      sum += len;
    }
    const uint64_t total = rng() % 2 ? sum : pick({0, 64, 1ull << 30, rng()});
    const uint8_t op = static_cast<uint8_t>(pick({0, 1, 2, 255}));
    const uint8_t lead = static_cast<uint8_t>(pick({0, 8, 63, 64, 200}));
    const std::vector<uint8_t> f = Frame(op, lead, count, total, slices);
    net::Fd fd = Handshake(tcp_->port());
    const auto deadline = Clock::now() + std::chrono::seconds(3);
    ASSERT_TRUE(net::SendAll(fd.get(), f.data(), f.size(), deadline).ok());
    ::shutdown(fd.get(), SHUT_WR);
    uint8_t byte;  // a refusal's reply, then the end of the connection
    while (net::RecvAll(fd.get(), &byte, 1, deadline).ok()) {
    }
    ASSERT_LT(Clock::now(), deadline) << "frame " << i << ": the target kept the connection";
  }
  EXPECT_EQ(region_, before);
  std::vector<uint8_t> src(64, 6);
  EXPECT_TRUE(Exec(Op::kWrite, {{reinterpret_cast<uint64_t>(src.data()), R(0), 64}}).ok());
  EXPECT_EQ(region_[0], 6);
}

TEST_P(TcpTransportTest, WellFormedFramesOutsideTheRegionsAreRefusedOnTheSameConnection) {
  // Frames that parse but name memory the target never registered: a refusal each, on the
  // same connection, the WRITE's payload drained unread.
  net::Fd fd = Handshake(tcp_->port());
  const auto deadline = Clock::now() + std::chrono::seconds(3);
  const std::vector<uint8_t> before = region_;
  std::vector<uint8_t> payload(4096, 0xab);
  const uint64_t outside[] = {R(0) - 4096, R(region_.size()), 4096};
  for (uint64_t addr : outside) {
    for (uint8_t op : {static_cast<uint8_t>(Op::kWrite), static_cast<uint8_t>(Op::kRead)}) {
      const bool write = op == static_cast<uint8_t>(Op::kWrite);
      const std::vector<uint8_t> f =
          Frame(op, 0, 1, payload.size(), {{addr, payload.size()}}, write ? payload : std::vector<uint8_t>{});
      ASSERT_TRUE(net::SendAll(fd.get(), f.data(), f.size(), deadline).ok());
      uint8_t head[8];
      ASSERT_TRUE(net::RecvAll(fd.get(), head, sizeof head, deadline).ok());
      uint32_t code;
      uint16_t len;
      std::memcpy(&code, head, 4);
      std::memcpy(&len, head + 4, 2);
      EXPECT_EQ(code, static_cast<uint32_t>(StatusCode::kRemoteAccessDenied));
      std::vector<uint8_t> rest((8 + len + 63) / 64 * 64 - 8);  // message and padding
      ASSERT_TRUE(net::RecvAll(fd.get(), rest.data(), rest.size(), deadline).ok());
    }
  }
  EXPECT_EQ(region_, before);
  // Then a frame inside the region, on that same connection, lands.
  const std::vector<uint8_t> f =
      Frame(static_cast<uint8_t>(Op::kWrite), 32, 1, 64, {{R(64), 64}}, std::vector<uint8_t>(64, 0xab));
  ASSERT_TRUE(net::SendAll(fd.get(), f.data(), f.size(), deadline).ok());
  uint8_t ok[64];
  ASSERT_TRUE(net::RecvAll(fd.get(), ok, sizeof ok, deadline).ok());
  EXPECT_EQ(ok[0], 0);
  EXPECT_EQ(region_[64], 0xab);
  EXPECT_EQ(region_[63], 0x11);
}

TEST_P(TcpTransportTest, DeadlineDuringTheHandshakeIsATimeout) {
  // A listener that never answers: the connect succeeds (the kernel accepts), the hello waits.
  net::Fd mute;
  net::Address bound;
  ASSERT_TRUE(net::Listen(net::Address{"127.0.0.1", 0, true}, &mute, &bound).ok());
  std::shared_ptr<Link> link;
  ASSERT_TRUE(tcp_->Connect(TcpPeer{42, "127.0.0.1", bound.port, ""}, &link).ok());
  std::vector<uint8_t> src(64, 4);
  const std::vector<Slice> batch{{reinterpret_cast<uint64_t>(src.data()), R(0), 64}};
  const Status st = link->Execute(Op::kWrite, batch, Clock::now() + std::chrono::milliseconds(100));
  EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.ToString();
  EXPECT_EQ(region_[0], 0x11);
}

TEST_P(TcpTransportTest, ATargetThatStallsLosesTheLinkWithinTheIoTimeout) {
  // A target that passes the handshake and then reads nothing (a WRITE larger than the socket
  // buffers cannot be sent), or reads the frame and never replies: the batch ends within the
  // io_timeout (500 ms), not at its own deadline 20 s away (before: it waited for that).
  net::Fd listener;
  net::Address bound;
  ASSERT_TRUE(net::Listen(net::Address{"127.0.0.1", 0, true}, &listener, &bound).ok());
  TcpTargetHooks none;
  none.incarnation = 7;
  TcpTransport initiator(TcpOptions{1, false, std::chrono::milliseconds(500)}, none);
  std::shared_ptr<Link> link;
  ASSERT_TRUE(initiator.Connect(TcpPeer{42, "127.0.0.1", bound.port, ""}, &link).ok());
  for (const bool reads_the_frame : {false, true}) {
    std::vector<net::Fd> held;
    std::thread target([&] {  // accepts, answers the hello, then (maybe) reads and stalls
      pollfd p{listener.get(), POLLIN, 0};
      if (::poll(&p, 1, 5000) != 1) return;
      net::Fd fd(::accept(listener.get(), nullptr, nullptr));
      uint8_t hello[64], accepted[64] = {};
      if (!net::RecvAll(fd.get(), hello, 64, Clock::now() + std::chrono::seconds(5)).ok()) return;
      (void)net::SendAll(fd.get(), accepted, 64, Clock::now() + std::chrono::seconds(5));
      std::vector<uint8_t> sink(1 << 20);
      while (reads_the_frame && ::recv(fd.get(), sink.data(), sink.size(), MSG_DONTWAIT) != 0) {
        if (::poll(&p, 0, 10) < 0) break;  // (10 ms between reads, until the initiator closes)
      }
      held.push_back(std::move(fd));  // (for the rest of this round)
    });
    const size_t len = reads_the_frame ? 64 : 64 << 20;
    std::vector<uint8_t> src(len, 1);
    const auto t0 = Clock::now();
    const std::vector<Slice> batch{{reinterpret_cast<uint64_t>(src.data()), R(0), len}};
    const Status st = link->Execute(Op::kWrite, batch, Clock::now() + std::chrono::seconds(20));
    const double took = std::chrono::duration<double>(Clock::now() - t0).count();
    EXPECT_EQ(st.code(), StatusCode::kConnectionLost) << st.ToString();
    EXPECT_LT(took, 3.0) << (reads_the_frame ? "no reply" : "the frame not read") << ": " << st.ToString();
    target.join();
  }
}

TEST_P(TcpTransportTest, InterruptEndsTheBatchesATargetStallsAndNoOthers) {
  // A target that passes the handshake and then reads nothing: a 64 MiB WRITE stalls in its
  // send, and a second batch waits behind it; the io_timeout (30 s) is far. Interrupt ends
  // both at once, without a retry on a fresh connection (which would stall again). An
  // Interrupt whose `since` is before the connection opened leaves it alone: it has not been
  // silent that long.
  net::Fd listener;
  net::Address bound;
  ASSERT_TRUE(net::Listen(net::Address{"127.0.0.1", 0, true}, &listener, &bound).ok());
  TcpTargetHooks none;
  none.incarnation = 7;
  TcpTransport initiator(TcpOptions{1, false, std::chrono::seconds(30)}, none);
  std::shared_ptr<Link> link;
  ASSERT_TRUE(initiator.Connect(TcpPeer{42, "127.0.0.1", bound.port, ""}, &link).ok());
  std::vector<net::Fd> held;
  std::atomic<bool> stop{false};
  std::thread target([&] {  // accepts, answers each hello, reads nothing
    while (!stop) {
      pollfd p{listener.get(), POLLIN, 0};
      if (::poll(&p, 1, 50) != 1) continue;
      net::Fd fd(::accept(listener.get(), nullptr, nullptr));
      uint8_t hello[64], accepted[64] = {};
      if (net::RecvAll(fd.get(), hello, 64, Clock::now() + std::chrono::seconds(5)).ok()) {
        (void)net::SendAll(fd.get(), accepted, 64, Clock::now() + std::chrono::seconds(5));
      }
      held.push_back(std::move(fd));
    }
  });
  const auto before_open = Clock::now();
  std::vector<uint8_t> big(64 << 20, 1), small(64, 2);
  Status results[2];
  std::atomic<int> ended{0};
  std::thread first([&] {
    const std::vector<Slice> b{{reinterpret_cast<uint64_t>(big.data()), R(0), big.size()}};
    results[0] = link->Execute(Op::kWrite, b, Clock::now() + std::chrono::seconds(60));
    ++ended;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // (it fills the socket)
  std::thread second([&] {
    const std::vector<Slice> b{{reinterpret_cast<uint64_t>(small.data()), R(0), small.size()}};
    results[1] = link->Execute(Op::kWrite, b, Clock::now() + std::chrono::seconds(60));
    ++ended;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  link->Interrupt(before_open - std::chrono::seconds(1), false);  // silent since then? no: opened after
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(ended.load(), 0) << "ended by an Interrupt it was not silent for";
  const auto t0 = Clock::now();
  link->Interrupt(t0, false);
  first.join();
  second.join();
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  for (const Status& st : results) {
    EXPECT_EQ(st.code(), StatusCode::kConnectionLost) << st.ToString();
    EXPECT_NE(st.message().find("interrupted"), std::string::npos) << st.ToString();
  }
  EXPECT_LT(took, 2.0) << "interrupted batches went on (retried on a fresh connection?)";
  stop = true;
  target.join();
}

TEST_P(TcpTransportTest, BatchesOutliveOtherBatchesDeadlines) {
  // The target holds each WRITE for kHold, so a READ that queues behind one on the same
  // connection misses its much shorter deadline while it waits for its turn, and breaks the
  // connection under the WRITE; the WRITEs, with time to spare, are retried on fresh
  // connections and land. After each break the READs pause for a few kHold, so that the retry
  // can land before the next break (unpaced, they would break every retry too). The WRITEs go
  // on until kBreaks such breaks were seen (bounded in time), so the test proves its point on
  // every run, however fast or slow the machine.
  constexpr int kBreaks = 10, kMinWrites = 50;
  constexpr auto kTight = std::chrono::milliseconds(2);
  static_assert(kTight < kHold);
  hold_from_ = R(512 << 10);  // the WRITEs' range; the READs' lies below it
  std::atomic<bool> stop{false};
  std::atomic<int> broke{0};
  std::thread breaker([&] {
    std::vector<uint8_t> into(512 << 10);
    const std::vector<Slice> b{{reinterpret_cast<uint64_t>(into.data()), R(0), into.size()}};
    while (!stop) {
      const Status s = link_->Execute(Op::kRead, b, Clock::now() + kTight);
      if (s.message().find("waiting for the target's reply") != std::string::npos) {
        ++broke;
        std::this_thread::sleep_for(3 * kHold);
      }
    }
  });
  std::vector<uint8_t> src(64 << 10, 7);
  const uint64_t s_addr = reinterpret_cast<uint64_t>(src.data());
  const auto give_up = Clock::now() + std::chrono::seconds(60);
  int writes = 0, failed = 0;
  while ((broke < kBreaks || writes < kMinWrites) && Clock::now() < give_up) {
    const Status s = Exec(Op::kWrite, {{s_addr, R(512 << 10), src.size()}});
    ++writes;
    if (!s.ok()) {
      ++failed;
      ADD_FAILURE() << s.ToString();
    }
  }
  stop = true;
  breaker.join();
  EXPECT_EQ(failed, 0) << "of " << writes << ", with " << broke.load() << " connections broken by deadlines";
  EXPECT_GE(broke.load(), kBreaks) << "too few deadlines were missed in " << writes
                                   << " WRITEs: the test proved too little";
  EXPECT_EQ(region_[512 << 10], 7);
}

TEST_P(TcpTransportTest, ManyThreadsPipelineOnOneConnection) {
  // Frames from several threads share the connections; replies must reach the thread whose
  // frame they answer, refusals included.
  constexpr int kThreads = 6, kRounds = 200;
  constexpr uint64_t kChunk = 8192;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint8_t> src(kChunk), back(kChunk);
      const uint64_t s = reinterpret_cast<uint64_t>(src.data());
      const uint64_t b = reinterpret_cast<uint64_t>(back.data());
      const uint64_t mine = R(t * 2 * kChunk);
      for (int i = 0; i < kRounds; ++i) {
        std::fill(src.begin(), src.end(), static_cast<uint8_t>(t * 31 + i));
        const uint64_t len = 1 + (i * 977) % kChunk;
        if (!Exec(Op::kWrite, {{s, mine, len}}).ok()) ++failures;
        if (!Exec(Op::kRead, {{b, mine, len}}).ok() || std::memcmp(src.data(), back.data(), len)) {
          ++failures;
        }
        if (i % 16 == 0 && Exec(Op::kRead, {{b, R(0) - 128, 64}}).code() != StatusCode::kRemoteAccessDenied) {
          ++failures;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST_P(TcpTransportTest, ShutdownEndsExecuteAndFenceWaits) {
  std::vector<uint8_t> src(64, 3);
  ASSERT_TRUE(Exec(Op::kWrite, {{reinterpret_cast<uint64_t>(src.data()), R(0), 64}}).ok());
  tcp_->Fence(Clock::now() + std::chrono::seconds(2));  // nothing in flight: returns at once
  link_->Shutdown();
  EXPECT_EQ(Exec(Op::kWrite, {{reinterpret_cast<uint64_t>(src.data()), R(0), 64}}).code(),
            StatusCode::kConnectionLost);
}

INSTANTIATE_TEST_SUITE_P(DirectAndStaged, TcpTransportTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Staged" : "Direct"; });

// A TCP relay to a data port that flips one byte at each of the given offsets of the stream in
// one direction (to the target, or back from it): corruption that TCP's checksum missed.
class FlippingRelay {
 public:
  FlippingRelay(uint16_t target_port, bool to_target, std::vector<uint64_t> offsets)
      : to_target_(to_target), offsets_(std::move(offsets)) {
    net::Address bound;
    EXPECT_TRUE(net::Listen(net::Address{"127.0.0.1", 0, true}, &listener_, &bound).ok());
    port_ = bound.port;
    thread_ = std::thread([this, target_port] { Run(target_port); });
  }
  ~FlippingRelay() {
    stop_ = true;
    thread_.join();
  }
  uint16_t port() const { return port_; }
  int flipped() const { return flipped_.load(); }

 private:
  void Run(uint16_t target_port) {
    pollfd l{listener_.get(), POLLIN, 0};
    if (::poll(&l, 1, 10000) <= 0) return;
    net::Fd client(::accept(listener_.get(), nullptr, nullptr)), target;
    if (!client.valid() || !net::ConnectTcp(net::Address{"127.0.0.1", target_port, true},
                                            Clock::now() + std::chrono::seconds(5), &target)
                                .ok()) {
      return;
    }
    net::SetBlocking(target.get());
    uint64_t at[2] = {0, 0};  // stream offsets: 0 to the target, 1 back
    std::vector<uint8_t> buf(1 << 16);
    while (!stop_) {
      pollfd p[2] = {{client.get(), POLLIN, 0}, {target.get(), POLLIN, 0}};
      if (::poll(p, 2, 50) <= 0) continue;
      for (int d = 0; d < 2; ++d) {
        if ((p[d].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        const int from = d == 0 ? client.get() : target.get(), to = d == 0 ? target.get() : client.get();
        const ssize_t n = ::read(from, buf.data(), buf.size());
        if (n <= 0) return;
        if ((d == 0) == to_target_) {
          for (uint64_t off : offsets_) {
            if (off >= at[d] && off < at[d] + static_cast<uint64_t>(n)) {
              buf[off - at[d]] ^= 0x01;
              ++flipped_;
            }
          }
        }
        at[d] += static_cast<uint64_t>(n);
        if (!net::SendAll(to, buf.data(), static_cast<size_t>(n), Clock::now() + std::chrono::seconds(5))
                 .ok())
          return;
      }
    }
  }

  const bool to_target_;
  const std::vector<uint64_t> offsets_;
  net::Fd listener_;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> flipped_{0};
  std::thread thread_;
};

// EngineOptions::tcp.checksum: a byte flipped on the way fails the batch's checksum at the
// side that receives it (the target for WRITE, the initiator for READ, direct and staged), the
// batch is tried once more and lands intact; flipped again, it fails with kDataCorrupted.
TEST_P(TcpTransportTest, ChecksummedBatchesCatchAFlippedByteAndAreTriedOnceMore) {
  if (!checksum::Available())
    GTEST_SKIP() << "built without libxxhash (scripts/setup.sh installs libxxhash-dev)";
  // Offsets in the data stream, for one 4 KiB slice from and to 64-byte aligned addresses:
  // the handshake (64 bytes), then a frame's payload 64 bytes in (WRITE: header, descriptor
  // and lead; READ's reply: header and lead), each frame 4224 bytes long (payload, checksum,
  // padding).
  constexpr uint64_t kLen = 4096, kFirst = 64 + 64 + 100, kSecond = kFirst + 4224;
  const uint64_t off = (64 - R(0) % 64) % 64;  // a 64-byte aligned place in the region
  alignas(64) static uint8_t src[kLen], back[kLen];
  std::memset(src, 0x5a, kLen);
  TcpTargetHooks mine;  // the initiator: peer 42 to the target, checksums on
  mine.incarnation = 42;
  TcpOptions o{1, false, std::chrono::milliseconds(2000)};
  o.checksum = true;
  // One batch of one slice through a relay that flips the stream at those offsets (in the
  // stream to the target, or back from it); *flipped: how many it flipped.
  auto through = [&](bool write, bool to_target, const std::vector<uint64_t>& flips, int* flipped) {
    FlippingRelay relay(tcp_->port(), to_target, flips);
    TcpTransport initiator(o, mine);
    std::shared_ptr<Link> link;
    EXPECT_TRUE(initiator.Connect(TcpPeer{42, "127.0.0.1", relay.port(), ""}, &link).ok());
    const Slice s = write ? Slice{reinterpret_cast<uint64_t>(src), R(off), kLen}
                          : Slice{reinterpret_cast<uint64_t>(back), R(off), kLen};
    const Status st =
        link->Execute(write ? Op::kWrite : Op::kRead, {&s, 1}, Clock::now() + std::chrono::seconds(5));
    *flipped = relay.flipped();
    return st;
  };
  for (const bool write : {true, false}) {
    for (const std::vector<uint64_t>& flips :
         {std::vector<uint64_t>{kFirst}, std::vector<uint64_t>{kFirst, kSecond}}) {
      SCOPED_TRACE(std::string(write ? "WRITE" : "READ") + ", flipped " + std::to_string(flips.size()) +
                   " time(s)");
      std::memset(region_.data() + off, 0x11, kLen);
      if (!write) std::memset(region_.data() + off, 0x77, kLen);
      std::memset(back, 0, kLen);
      int flipped = 0;
      const Status st = through(write, write, flips, &flipped);
      EXPECT_EQ(flipped, static_cast<int>(flips.size()));
      if (flips.size() == 1) {
        ASSERT_TRUE(st.ok()) << st.ToString();
        if (write) {
          EXPECT_EQ(std::memcmp(region_.data() + off, src, kLen), 0);
        } else {
          EXPECT_EQ(back[100], 0x77);
        }
      } else {
        EXPECT_EQ(st.code(), StatusCode::kDataCorrupted) << st.ToString();
        EXPECT_NE(st.message().find("checksum"), std::string::npos) << st.message();
      }
    }
  }
  // A flipped bit in an address (the first descriptor's, in the frame to the target): WRITE
  // would land in the wrong place, READ would bring the wrong bytes, and an address thrown
  // outside the region would be refused. The checksum covers the descriptors too: the batch is
  // tried once more and lands right.
  for (const bool write : {true, false}) {
    SCOPED_TRACE(write ? "WRITE, an address flipped" : "READ, an address flipped");
    std::memset(region_.data() + off, write ? 0x11 : 0x77, kLen);
    std::memset(back, 0, kLen);
    // Bit 8 of the address: 256 bytes off, inside the region or (a WRITE) before its start.
    int flipped = 0;
    const Status st = through(write, true, {64 + 16 + 1}, &flipped);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(flipped, 1);
    if (write) {
      EXPECT_EQ(std::memcmp(region_.data() + off, src, kLen), 0);
    } else {
      EXPECT_EQ(std::count(back, back + kLen, 0x77), static_cast<long>(kLen));
    }
  }
}

TEST_P(TcpTransportTest, ChecksummedBatchesWithOverlappingRangesAreNotCorrupt) {
  if (!checksum::Available())
    GTEST_SKIP() << "built without libxxhash (scripts/setup.sh installs libxxhash-dev)";
  // Two slices into the same bytes (the later copy wins): what lands differs from what was
  // sent, and the checksum must still agree.
  TcpTargetHooks mine;
  mine.incarnation = 42;
  TcpOptions o{1, false, std::chrono::milliseconds(2000)};
  o.checksum = true;
  TcpTransport initiator(o, mine);
  std::shared_ptr<Link> link;
  ASSERT_TRUE(initiator.Connect(TcpPeer{42, "127.0.0.1", tcp_->port(), ""}, &link).ok());
  std::vector<uint8_t> a(4096, 1), b(4096, 2), back(4096);
  const uint64_t pa = reinterpret_cast<uint64_t>(a.data()), pb = reinterpret_cast<uint64_t>(b.data());
  const Slice writes[] = {{pa, R(0), 4096}, {pb, R(0), 4096}};
  Status st = link->Execute(Op::kWrite, writes, Clock::now() + std::chrono::seconds(5));
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(region_[0], 2);
  std::memset(region_.data() + 8192, 3, 4096);
  const uint64_t pback = reinterpret_cast<uint64_t>(back.data());
  const Slice reads[] = {{pback, R(0), 4096}, {pback, R(8192), 4096}};
  st = link->Execute(Op::kRead, reads, Clock::now() + std::chrono::seconds(5));
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(back[0], 3);
}

}  // namespace
}  // namespace xfer::transport
