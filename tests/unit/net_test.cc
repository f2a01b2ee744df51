#include "util/net.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <atomic>
#include <thread>

namespace xfer::net {
namespace {

TEST(Address, ParsesEveryForm) {
  Address a;
  ASSERT_TRUE(ParseAddress("127.0.0.1:5000", &a).ok());
  EXPECT_EQ(a.host, "127.0.0.1");
  EXPECT_EQ(a.port, 5000);
  EXPECT_TRUE(a.has_port);
  ASSERT_TRUE(ParseAddress("[::1]:0", &a).ok());
  EXPECT_EQ(a.host, "::1");
  EXPECT_EQ(a.ToString(), "[::1]:0");
  ASSERT_TRUE(ParseAddress("node7", &a).ok());
  EXPECT_FALSE(a.has_port);
  EXPECT_EQ(a.ToString(), "node7");
  ASSERT_TRUE(ParseAddress("[fe80::1]", &a).ok());
  EXPECT_FALSE(a.has_port);
}

TEST(Address, RejectsMalformedNames) {
  Address a;
  for (const char* bad :
       {"", ":5000", "host:", "host:65536", "host:12x", "::1:5000", "[::1", "[::1]x", "host:-1"}) {
    EXPECT_EQ(ParseAddress(bad, &a).code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(Sockets, ConnectToClosedPortFailsFast) {
  Fd listener;
  Address bound;
  ASSERT_TRUE(Listen(Address{"127.0.0.1", 0, true}, &listener, &bound).ok());
  listener.Reset();  // nothing listens there now
  Fd fd;
  Status s = ConnectTcp(bound, Clock::now() + std::chrono::seconds(2), &fd);
  EXPECT_EQ(s.code(), StatusCode::kConnectionLost) << s.ToString();
}

// The two ends of a connection name each other alike (what the authentication's check of the
// address dialled compares), an IPv4 client of a dual-stack listener included.
TEST(Sockets, EachEndOfAConnectionNamesTheOtherAlike) {
  for (const char* host : {"127.0.0.1", "::"}) {
    SCOPED_TRACE(host);
    Fd listener;
    Address bound;
    if (!Listen(Address{host, 0, true}, &listener, &bound).ok()) continue;  // (no IPv6 here)
    Fd client;
    // (An IPv6 wildcard takes IPv4 only where net.ipv6.bindv6only is 0.)
    if (!ConnectTcp(Address{"127.0.0.1", bound.port, true}, Clock::now() + std::chrono::seconds(2), &client)
             .ok()) {
      ASSERT_STREQ(host, "::");
      continue;
    }
    Fd accepted(::accept(listener.get(), nullptr, nullptr));
    ASSERT_TRUE(accepted.valid());
    const std::string dialled = PeerOf(client.get());
    EXPECT_EQ(dialled, "127.0.0.1:" + std::to_string(bound.port));
    EXPECT_EQ(LocalOf(accepted.get()), dialled);
    EXPECT_EQ(PeerOf(accepted.get()), LocalOf(client.get()));
  }
}

// A connection to a listener that never sends: every receive on it waits out its deadline.
class SilentPeer : public ::testing::Test {
 protected:
  void SetUp() override {
    Address bound;
    ASSERT_TRUE(Listen(Address{"127.0.0.1", 0, true}, &listener_, &bound).ok());
    ASSERT_TRUE(ConnectTcp(bound, Clock::now() + std::chrono::seconds(2), &fd_).ok());
  }
  Fd listener_, fd_;
};

TEST_F(SilentPeer, RecvAllHonoursDeadline) {
  char b[4];
  auto t0 = Clock::now();
  EXPECT_EQ(RecvAll(fd_.get(), b, 4, t0 + std::chrono::milliseconds(50)).code(), StatusCode::kTimeout);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2));
}

TEST_F(SilentPeer, WaitsNeverEndBeforeTheirDeadline) {
  // Callers tell a timeout from a failure by the clock: a wait that gave up early (poll's
  // whole milliseconds, rounded down) turned an expired request into a failed one.
  char b[4];
  for (int i = 0; i < 20; ++i) {
    const auto deadline = Clock::now() + std::chrono::microseconds(2500 + 137 * i);
    EXPECT_EQ(RecvAll(fd_.get(), b, 4, deadline).code(), StatusCode::kTimeout);
    EXPECT_GE(Clock::now(), deadline) << "round " << i;
  }
}

TEST(Sockets, ADeadlineIsForTheWholeMoveWhileThePeerTrickles) {
  // The peer sends a byte every millisecond or so: each receive call gets bytes before the
  // socket's timeout, but the move as a whole must still end at its deadline (before: it went
  // on for as long as the bytes kept trickling), and must not spin past it on bytes that are
  // ready then.
  Fd listener, fd, peer;
  Address bound;
  ASSERT_TRUE(Listen(Address{"127.0.0.1", 0, true}, &listener, &bound).ok());
  ASSERT_TRUE(ConnectTcp(bound, Clock::now() + std::chrono::seconds(2), &fd).ok());
  peer = Fd(::accept(listener.get(), nullptr, nullptr));
  ASSERT_TRUE(peer.valid());
  SetBlocking(fd.get());
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    for (int i = 0; i < 3000 && !stop.load(); ++i) {  // (3 s at most, fewer bytes than b holds)
      ::send(peer.get(), "x", 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  char b[8192];
  iovec v{b, sizeof b};
  const auto t0 = Clock::now();
  const Status s = RecvVWaitAll(fd.get(), &v, 1, t0 + std::chrono::milliseconds(200));
  const auto took = Clock::now() - t0;
  stop.store(true);
  trickle.join();
  EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.ToString();
  EXPECT_LT(took, std::chrono::milliseconds(1000));
}

TEST(Net, FloodVictimIsTheOldestFromTheHostWithTheMost) {
  EXPECT_EQ(FloodVictim({}), 0u);
  EXPECT_EQ(FloodVictim({"10.0.0.1:5"}), 0u);
  // 10.0.0.2 holds three (ports differ), 10.0.0.1 two: the oldest of 10.0.0.2's goes.
  EXPECT_EQ(FloodVictim({"10.0.0.1:1", "10.0.0.2:1", "10.0.0.1:2", "10.0.0.2:2", "10.0.0.2:3"}), 1u);
  EXPECT_EQ(FloodVictim({"[fe80::1]:9", "[::1]:1", "[::1]:2"}), 1u);
}

}  // namespace
}  // namespace xfer::net
