// net::ServePool: idle connections hold no thread; busy ones cannot starve the others.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "transport/tcp/serve_pool.h"

namespace xfer::net {
namespace {

using namespace std::chrono_literals;

struct Conn {
  int here = -1, there = -1;  // a socketpair: the pool serves `here`, the test writes `there`
  std::atomic<int> bytes{0};
  std::chrono::milliseconds work{0};  // ServeFrames: how long taking a frame holds the thread
  Conn() {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    here = sv[0];
    there = sv[1];
  }
  ~Conn() {
    ::close(there);  // (here: closed by its serve, at the end it then sees)
  }
};

// Serves as the tcp target does: while bytes keep coming within 50 ms, the connection keeps
// its thread, unless every thread is busy (then it yields after each read).
ServePool::Next ServeLikeTcp(ServePool& pool, Conn& c) {
  char buf[256];
  for (;;) {
    const ssize_t n = ::recv(c.here, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) {
      ::close(c.here);
      return ServePool::Next::kDone;
    }
    if (n > 0) {
      c.bytes += static_cast<int>(n);
      if (pool.Saturated()) return ServePool::Next::kIdle;
      continue;
    }
    pollfd p{c.here, POLLIN, 0};
    if (::poll(&p, 1, 50) == 0) return ServePool::Next::kIdle;
  }
}

TEST(ServePool, BusyConnectionsCannotStarveTheOthersWhenEveryThreadServes) {
  // Two threads at most; two connections get a byte every 5 ms (each would keep its thread
  // for good), a third one byte: it is served all the same.
  ServePool* self = nullptr;
  ServePool pool([&](void* c) { return ServeLikeTcp(*self, *static_cast<Conn*>(c)); }, 2, 1000ms);
  self = &pool;
  ASSERT_TRUE(pool.Start().ok());
  Conn busy1, busy2, quiet;
  for (Conn* c : {&busy1, &busy2, &quiet}) ASSERT_TRUE(pool.Add(c->here, c).ok());
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    while (!stop.load()) {
      (void)!::write(busy1.there, "x", 1);
      (void)!::write(busy2.there, "x", 1);
      std::this_thread::sleep_for(5ms);
    }
  });
  std::this_thread::sleep_for(100ms);  // (both busy ones hold a thread now)
  ASSERT_EQ(::write(quiet.there, "q", 1), 1);
  const auto t0 = std::chrono::steady_clock::now();
  while (quiet.bytes.load() == 0 && std::chrono::steady_clock::now() - t0 < 3s)
    std::this_thread::sleep_for(1ms);
  EXPECT_EQ(quiet.bytes.load(), 1) << "a connection waited behind two busy ones for 3 s";
  EXPECT_LE(pool.threads(), 2u);
  stop.store(true);
  writer.join();
  EXPECT_GT(busy1.bytes.load(), 10);
  EXPECT_GT(busy2.bytes.load(), 10);
  for (Conn* c : {&busy1, &busy2, &quiet}) ::shutdown(c->there, SHUT_RDWR);
  std::this_thread::sleep_for(200ms);  // (each serve sees the end and closes its side)
  pool.Stop();
}

// Serves as the tcp target serves a frame: it keeps its thread until the whole frame (16 bytes)
// came, however slowly, and yields to nobody meanwhile; then it works on it for c.work.
ServePool::Next ServeFrames(Conn& c) {
  char buf[16];
  size_t got = 0;
  while (got < sizeof buf) {
    const ssize_t n = ::recv(c.here, buf + got, sizeof buf - got, 0);
    if (n <= 0) {
      ::close(c.here);
      return ServePool::Next::kDone;
    }
    got += static_cast<size_t>(n);
  }
  std::this_thread::sleep_for(c.work);
  c.bytes += static_cast<int>(got);
  return ServePool::Next::kIdle;
}

// Connections whose frames trickle in: a byte every 40 ms on each (a frame: 640 ms and more),
// from a thread of its own, until End (then each connection sees its end). It must outlive the
// pool that serves them.
class Trickling {
 public:
  Trickling()
      : thread_([this] {
          while (!stop_.load()) {
            {
              std::lock_guard lock(mu_);
              for (auto& c : conns_) (void)!::write(c->there, "t", 1);
            }
            std::this_thread::sleep_for(40ms);
          }
        }) {}
  ~Trickling() { End(); }
  void End() {
    if (stop_.exchange(true)) return;
    thread_.join();
    for (auto& c : conns_) ::shutdown(c->there, SHUT_RDWR);
  }
  Conn* Add() {
    std::lock_guard lock(mu_);
    return conns_.emplace_back(std::make_unique<Conn>()).get();
  }
  int Bytes() {  // served so far, all connections
    std::lock_guard lock(mu_);
    int n = 0;
    for (auto& c : conns_) n += c->bytes.load();
    return n;
  }

 private:
  std::mutex mu_;
  std::vector<std::unique_ptr<Conn>> conns_;  // mu_
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Peers that come one after another, each with connections whose frames trickle in (each
// frame holds its thread 640 ms and more): none takes the threads a later one needs, and a peer
// that comes then is served at once. (Before, the first peer kept the half it took alone, the
// second a third: the fourth peer's frame waited for a trickling frame to end.)
TEST(ServePool, PeersWhoseFramesTrickleLeaveThreadsForAPeerThatComes) {
  Trickling trickling;
  Conn whole;
  ServePool pool([&](void* c) { return ServeFrames(*static_cast<Conn*>(c)); }, 12, 1000ms);
  ASSERT_TRUE(pool.Start().ok());
  for (uint64_t peer = 1; peer <= 3; ++peer) {  // three peers (hosts), six connections each, 100 ms apart
    for (int i = 0; i < 6; ++i) {
      Conn* c = trickling.Add();
      ASSERT_TRUE(pool.Add(c->here, c, peer, peer).ok());
    }
    std::this_thread::sleep_for(100ms);
  }
  ASSERT_TRUE(pool.Add(whole.here, &whole, 4, 4).ok());
  ASSERT_EQ(::write(whole.there, "0123456789abcdef", 16), 16);
  const auto t0 = std::chrono::steady_clock::now();
  while (whole.bytes.load() == 0 && std::chrono::steady_clock::now() - t0 < 3s)
    std::this_thread::sleep_for(1ms);
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(whole.bytes.load(), 16);
  EXPECT_LT(waited, 100ms) << "a whole frame waited behind other peers' trickling ones";
  while (trickling.Bytes() < 12 * 16 && std::chrono::steady_clock::now() - t0 < 5s)
    std::this_thread::sleep_for(10ms);
  EXPECT_GE(trickling.Bytes(), 12 * 16) << "the trickling peers' frames were not served";
  trickling.End();
  ::shutdown(whole.there, SHUT_RDWR);
  std::this_thread::sleep_for(200ms);  // (each serve sees the end and closes its side)
  pool.Stop();
}

// One host that opens many engines, each with connections whose frames trickle in, holds only
// its host's share: a peer from another host gets threads for all its connections at once.
// (Before, shares were per engine: eight engines of one host left the newcomer a twelfth of the
// threads, and its four frames went one after another.)
TEST(ServePool, ManyEnginesOfOneHostHoldOnlyThatHostsShare) {
  Trickling trickling;
  std::vector<std::unique_ptr<Conn>> peer;
  ServePool pool([&](void* c) { return ServeFrames(*static_cast<Conn*>(c)); }, 12, 1000ms);
  ASSERT_TRUE(pool.Start().ok());
  for (uint64_t engine = 1; engine <= 8; ++engine) {  // host 1: eight engines, three connections each
    for (int i = 0; i < 3; ++i) {
      Conn* c = trickling.Add();
      ASSERT_TRUE(pool.Add(c->here, c, engine, 1).ok());
    }
  }
  std::this_thread::sleep_for(300ms);
  // Host 2: one engine, four connections, each a whole frame that takes 200 ms to work on (a
  // big batch).
  for (int i = 0; i < 4; ++i) {
    peer.push_back(std::make_unique<Conn>());
    peer.back()->work = 200ms;
    ASSERT_TRUE(pool.Add(peer.back()->here, peer.back().get(), 9, 2).ok());
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& c : peer) ASSERT_EQ(::write(c->there, "0123456789abcdef", 16), 16);
  auto served = [&] {
    int n = 0;
    for (auto& c : peer) n += c->bytes.load();
    return n;
  };
  while (served() < 4 * 16 && std::chrono::steady_clock::now() - t0 < 3s) std::this_thread::sleep_for(1ms);
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(served(), 4 * 16);
  EXPECT_LT(waited, 500ms) << "the peer's frames went one after another (800 ms and more)";
  trickling.End();
  for (auto& c : peer) ::shutdown(c->there, SHUT_RDWR);
  std::this_thread::sleep_for(200ms);  // (each serve sees the end and closes its side)
  pool.Stop();
}

TEST(ServePool, IdleConnectionsHoldNoThreadAndIdleThreadsEnd) {
  ServePool* self = nullptr;
  ServePool pool([&](void* c) { return ServeLikeTcp(*self, *static_cast<Conn*>(c)); }, 64, 200ms);
  self = &pool;
  ASSERT_TRUE(pool.Start().ok());
  std::vector<std::unique_ptr<Conn>> conns;
  for (int i = 0; i < 32; ++i) {
    conns.push_back(std::make_unique<Conn>());
    ASSERT_TRUE(pool.Add(conns.back()->here, conns.back().get()).ok());
  }
  for (auto& c : conns) ASSERT_EQ(::write(c->there, "abc", 3), 3);  // all busy at once
  std::this_thread::sleep_for(20ms);
  EXPECT_GT(pool.threads(), 2u);
  // Idle: after their 50 ms grace and the 200 ms a waiting thread lingers, one is left.
  const auto t0 = std::chrono::steady_clock::now();
  while (pool.threads() > 1 && std::chrono::steady_clock::now() - t0 < 5s) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(pool.threads(), 1u);
  for (auto& c : conns) EXPECT_EQ(c->bytes.load(), 3);
  for (auto& c : conns) ::shutdown(c->there, SHUT_RDWR);
  std::this_thread::sleep_for(200ms);
  pool.Stop();
}

}  // namespace
}  // namespace xfer::net
