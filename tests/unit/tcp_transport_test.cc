// The tcp transport against itself over loopback, real sockets: the target side's own checks.
#include "transport/tcp/tcp_transport.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <cstring>
#include <atomic>
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
    hooks.region_access = [this](uint64_t a, uint64_t l) {
      uint64_t base = reinterpret_cast<uint64_t>(region_.data());
      TcpTargetAccess access;
      access.allowed = a >= base && a + l <= base + region_.size();
      access.staged = GetParam();
      return access;
    };
    hooks.staging_bytes = 64 << 10;  // smaller than some slices
    hooks.is_peer = [this](uint64_t inc) { return inc == 42 && peer_known_; };
    tcp_ = std::make_unique<TcpTransport>(TcpOptions{2, false, std::chrono::milliseconds(2000)}, hooks);
    ASSERT_TRUE(tcp_->Start("127.0.0.1").ok());
    PeerEndpoint self{0, 42, 0, "127.0.0.1", tcp_->port()};
    ASSERT_TRUE(tcp_->Connect(self, &link_).ok());
  }
  uint64_t R(uint64_t off) { return reinterpret_cast<uint64_t>(region_.data()) + off; }
  Status Exec(Op op, std::vector<Slice> b) {
    return link_->Execute(op, b, Clock::now() + std::chrono::seconds(5));
  }

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
    ASSERT_TRUE(Exec(Op::kRead, {{b + (63 - off), R(roff), len}, {b + 4096, R(0), off + 1}}).ok())
        << off;
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
                              Clock::now() + std::chrono::seconds(2), &fd).ok());
  const char junk[] = "GET / HTTP/1.0\r\n\r\n and some more bytes to fill the hello";
  ASSERT_TRUE(net::SendAll(fd.get(), junk, sizeof junk, Clock::now() + std::chrono::seconds(2)).ok());
  char c;
  EXPECT_FALSE(net::RecvAll(fd.get(), &c, 1, Clock::now() + std::chrono::seconds(3)).ok());
  std::vector<uint8_t> src(64, 2);
  EXPECT_TRUE(Exec(Op::kWrite, {{reinterpret_cast<uint64_t>(src.data()), R(0), 64}}).ok());
}

TEST_P(TcpTransportTest, DeadlineDuringTheHandshakeIsATimeout) {
  // A listener that never answers: the connect succeeds (the kernel accepts), the hello waits.
  net::Fd mute;
  net::Address bound;
  ASSERT_TRUE(net::Listen(net::Address{"127.0.0.1", 0, true}, &mute, &bound).ok());
  std::shared_ptr<Link> link;
  ASSERT_TRUE(tcp_->Connect(PeerEndpoint{0, 42, 0, "127.0.0.1", bound.port}, &link).ok());
  std::vector<uint8_t> src(64, 4);
  const std::vector<Slice> batch{{reinterpret_cast<uint64_t>(src.data()), R(0), 64}};
  const Status st = link->Execute(Op::kWrite, batch, Clock::now() + std::chrono::milliseconds(100));
  EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.ToString();
  EXPECT_EQ(region_[0], 0x11);
}

TEST_P(TcpTransportTest, BatchesOutliveOtherBatchesDeadlines) {
  // One thread's READs keep missing a tight deadline, each breaking the connection it shares;
  // another thread's WRITEs, with time to spare, are retried on fresh connections and land.
  std::atomic<bool> stop{false};
  std::atomic<int> broke{0};
  std::thread breaker([&] {
    std::vector<uint8_t> into(512 << 10);
    const std::vector<Slice> b{{reinterpret_cast<uint64_t>(into.data()), R(0), into.size()}};
    while (!stop) {
      const Status s = link_->Execute(Op::kRead, b, Clock::now() + std::chrono::microseconds(100));
      if (s.message().find("waiting for the target's reply") != std::string::npos) ++broke;
    }
  });
  std::vector<uint8_t> src(64 << 10, 7);
  const uint64_t s_addr = reinterpret_cast<uint64_t>(src.data());
  int failed = 0;
  for (int i = 0; i < 300; ++i) {
    const Status s = Exec(Op::kWrite, {{s_addr, R(512 << 10), src.size()}});
    if (!s.ok()) {
      ++failed;
      ADD_FAILURE() << s.ToString();
    }
  }
  stop = true;
  breaker.join();
  EXPECT_EQ(failed, 0) << "of 300, with " << broke.load() << " connections broken by deadlines";
  EXPECT_GT(broke.load(), 0) << "no deadline was missed: the test proved nothing";
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
        if (i % 16 == 0 && Exec(Op::kRead, {{b, R(0) - 128, 64}}).code() !=
                               StatusCode::kRemoteAccessDenied) {
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
  tcp_->Fence();  // nothing in flight: returns at once
  link_->Shutdown();
  EXPECT_EQ(Exec(Op::kWrite, {{reinterpret_cast<uint64_t>(src.data()), R(0), 64}}).code(),
            StatusCode::kConnectionLost);
}

INSTANTIATE_TEST_SUITE_P(DirectAndStaged, TcpTransportTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Staged" : "Direct"; });

}  // namespace
}  // namespace xfer::transport
