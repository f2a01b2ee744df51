// The ucx transport between two UcxTransports: A is the target (its memory is mapped, its
// progress thread serves), B the initiator. Without an RDMA NIC, what Debian's UCX 1.13.1 can do:
//   UCX_TLS=tcp, or unset (all): put and get work. tcp has no remote keys, so UCX emulates both
//     over its internal active messages, which the target's progress thread serves.
//   UCX_TLS=sm, posix,cma, cma: no endpoint can be created: shared-memory transports cannot
//     detect a peer's failure (UCP_ERR_HANDLING_MODE_PEER needs it) and cma carries no active
//     messages. Start() refuses them (it puts to itself).
// The emulation has a flaw on the target side: when an initiator vanishes while its puts or
// gets are in flight, the target process may abort inside UCX (ucp_put_handler: "unexpected
// error", or an assertion in uct_tcp_ep_pending_purge). So the tests that abandon batches in
// flight (deadline, Shutdown, killed target) run the target in a child process.
#include "transport/ucx/ucx_transport.h"

#include <dirent.h>
#include <elf.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "transport/ucx/ucx_library.h"
#include "xfer/engine.h"

extern char** environ;

namespace xfer::transport {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kRegionBytes = 20 << 20;
constexpr const char* kTargetFdEnv = "XFER_UCX_TEST_TARGET_FD";
// How late past its deadline a batch may return: the endpoint's teardown may take up to 2 s
// (kTeardownGrace) when UCX is slow to give requests back, plus a loaded machine's scheduling.
constexpr auto kLateSlack = 2500ms;

uint64_t A(const void* p) { return reinterpret_cast<uint64_t>(p); }

void Fill(std::vector<uint8_t>& v, uint32_t seed) {
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
}

// UCX_TLS as each context reads it at Start; "" = unset (UCX's default: all).
void SetTls(const std::string& tls) {
  if (tls.empty()) {
    ::unsetenv("UCX_TLS");
  } else {
    ::setenv("UCX_TLS", tls.c_str(), 1);
  }
}

class UcxTransportTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    SetTls(GetParam());
    region_.resize(kRegionBytes);
    a_ = std::make_unique<UcxTransport>(UcxOptions{});
    b_ = std::make_unique<UcxTransport>(UcxOptions{3});
    Status s = a_->Start();
    ASSERT_TRUE(s.ok()) << s.ToString();
    s = b_->Start();
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_FALSE(a_->worker_address().empty());
    s = a_->MapMemory(A(region_.data()), region_.size(), &mem_);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_FALSE(mem_->packed_key().empty());
    UcxPeer peer;
    peer.worker_address = a_->worker_address();
    peer.name = "A";
    peer.find_key = [this](uint64_t addr, uint64_t len, bool, UcxRemoteKey* key) {
      const uint64_t base = A(region_.data());
      if (addr < base || addr + len > base + region_.size()) return false;
      *key = {7, mem_->packed_key()};
      return true;
    };
    s = b_->Connect(peer, &link_);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  void TearDown() override {
    link_.reset();
    mem_.reset();
    b_.reset();
    a_.reset();
  }

  uint64_t R(uint64_t off) { return A(region_.data()) + off; }
  Status Exec(Op op, const std::vector<Slice>& b, std::chrono::milliseconds t = 5000ms) {
    return link_->Execute(op, b, Clock::now() + t);
  }

  std::vector<uint8_t> region_;
  std::unique_ptr<UcxTransport> a_, b_;
  std::unique_ptr<UcxMemory> mem_;
  std::shared_ptr<Link> link_;
};

TEST_P(UcxTransportTest, WritesAndReadsEverySize) {
  uint32_t seed = 1;
  for (uint64_t len : {1ull, 7ull, 64ull, 4097ull, 65536ull + 3, 1ull << 20, 16ull << 20}) {
    std::vector<uint8_t> src(len), back(len);
    Fill(src, seed++);
    const uint64_t off = (len * 13) % (kRegionBytes - len);
    Status s = Exec(Op::kWrite, {{A(src.data()), R(off), len}});
    ASSERT_TRUE(s.ok()) << len << ": " << s.ToString();
    ASSERT_EQ(std::memcmp(region_.data() + off, src.data(), len), 0) << len;
    Fill(src, seed++);  // new bytes at the target: READ must bring them
    std::memcpy(region_.data() + off, src.data(), len);
    s = Exec(Op::kRead, {{A(back.data()), R(off), len}});
    ASSERT_TRUE(s.ok()) << len << ": " << s.ToString();
    ASSERT_EQ(back, src) << len;
  }
}

TEST_P(UcxTransportTest, ScatteredSlicesInLargeBatches) {
  // 1000 slices of 1..4000 bytes at scattered, non-overlapping places on both sides.
  std::mt19937 rng(3);
  std::vector<uint8_t> src(8 << 20), back(8 << 20);
  Fill(src, 5);
  std::vector<Slice> wr, rd;
  uint64_t loc = 0, rem = 0;
  for (int i = 0; i < 1000; ++i) {
    const uint64_t len = 1 + rng() % 4000;
    loc += rng() % 64;
    rem += rng() % 4096;
    wr.push_back({A(src.data()) + loc, R(rem), len});
    rd.push_back({A(back.data()) + loc, R(rem), len});
    loc += len;
    rem += len;
  }
  ASSERT_LT(rem, kRegionBytes);
  Status s = Exec(Op::kWrite, wr);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (const Slice& sl : wr) {
    ASSERT_EQ(std::memcmp(reinterpret_cast<void*>(sl.remote), reinterpret_cast<void*>(sl.local), sl.len), 0);
  }
  s = Exec(Op::kRead, rd);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t i = 0; i < rd.size(); ++i) {
    ASSERT_EQ(
        std::memcmp(reinterpret_cast<void*>(rd[i].local), reinterpret_cast<void*>(wr[i].local), rd[i].len), 0)
        << i;
  }
}

TEST_P(UcxTransportTest, RangeWithoutKeyIsDeniedAndMovesNothing) {
  std::vector<uint8_t> src(4096, 0xab);
  const uint64_t s = A(src.data());
  // One good slice and one that runs past the region: nothing may move.
  Status st = Exec(Op::kWrite, {{s, R(0), 100}, {s, R(kRegionBytes - 10), 20}});
  EXPECT_EQ(st.code(), StatusCode::kRemoteAccessDenied) << st.ToString();
  EXPECT_NE(st.message().find("no region of peer A holds slice 1"), std::string::npos) << st.message();
  EXPECT_EQ(region_[0], 0);
  st = Exec(Op::kRead, {{s, R(0) - 4096, 8}});
  EXPECT_EQ(st.code(), StatusCode::kRemoteAccessDenied) << st.ToString();
  st = Exec(Op::kWrite, {{s, R(0), 100}});
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(region_[99], 0xab);
}

TEST_P(UcxTransportTest, ThreadsShareOneLink) {
  constexpr int kThreads = 6, kRounds = 30;
  constexpr uint64_t kArea = 256 << 10;
  std::atomic<int> bad{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      std::vector<uint8_t> src(kArea), back(kArea);
      for (int r = 0; r < kRounds; ++r) {
        Fill(src, t * 1000 + r);
        const uint64_t len = 1 + (r * 7919) % kArea, half = len / 2;
        const uint64_t off = t * kArea;
        if (!Exec(Op::kWrite,
                  {{A(src.data()), R(off), half}, {A(src.data()) + half, R(off + half), len - half}})
                 .ok() ||
            !Exec(Op::kRead, {{A(back.data()), R(off), len}}).ok() ||
            std::memcmp(back.data(), src.data(), len) != 0) {
          bad.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST_P(UcxTransportTest, ShutdownFailsLaterBatches) {
  std::vector<uint8_t> buf(64);
  ASSERT_TRUE(Exec(Op::kWrite, {{A(buf.data()), R(0), 64}}).ok());
  link_->Shutdown();
  for (Op op : {Op::kWrite, Op::kRead}) {
    Status s = Exec(op, {{A(buf.data()), R(0), 64}});
    EXPECT_EQ(s.code(), StatusCode::kConnectionLost) << s.ToString();
  }
}

TEST_P(UcxTransportTest, StoppedTargetFailsWithinTheDeadline) {
  std::vector<uint8_t> buf(1 << 20);
  ASSERT_TRUE(Exec(Op::kWrite, {{A(buf.data()), R(0), buf.size()}}).ok());
  a_->Stop();  // its worker is gone; its memory stays mapped (the context lives on)
  for (Op op : {Op::kWrite, Op::kRead, Op::kWrite}) {
    const auto t0 = Clock::now();
    Status s = Exec(op, {{A(buf.data()), R(0), buf.size()}}, 3000ms);
    EXPECT_TRUE(s.code() == StatusCode::kConnectionLost || s.code() == StatusCode::kTimeout) << s.ToString();
    EXPECT_LT(Clock::now() - t0, 3000ms + kLateSlack);
  }
}

TEST_P(UcxTransportTest, PassedDeadlineMovesNothing) {
  std::vector<uint8_t> buf(4096, 0x5a);
  Status s = link_->Execute(Op::kWrite, {{{A(buf.data()), R(0), buf.size()}}}, Clock::now() - 1ms);
  EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.ToString();
  EXPECT_EQ(region_[0], 0);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Exec(Op::kWrite, {{A(buf.data()), R(0), buf.size()}}).ok());
  EXPECT_EQ(region_[4095], 0x5a);
}

// ---------------------------------------------------------------- pipelined batches
// n blocks of len bytes, block i between local + i * len and remote + i * len, each started as
// a batch of its own; their `done` calls are counted per block (they may come from any thread).
struct Blocks {
  Blocks(uint64_t local, uint64_t remote, size_t n, uint64_t len) : calls(n), bad(n) {
    for (size_t i = 0; i < n; ++i) slices.push_back({local + i * len, remote + i * len, len});
  }
  // Deadline of block i: due(i) from now (10 s without due).
  void Start(Link& link, Op op, const std::function<std::chrono::milliseconds(size_t)>& due = {}) {
    for (size_t i = 0; i < slices.size(); ++i) {
      link.Start(op, {&slices[i], 1}, Clock::now() + (due ? due(i) : 10000ms), [this, i](Status s) {
        if (!s.ok()) bad[i].store(true);
        calls[i].fetch_add(1);
        total.fetch_add(1);
      });
    }
  }
  bool All() const { return total.load() == static_cast<int>(slices.size()); }
  std::string Ended() const {
    return std::to_string(total.load()) + " of " + std::to_string(slices.size()) + " ended";
  }

  std::vector<Slice> slices;  // the batches' slices live until they end
  std::vector<std::atomic<int>> calls;
  std::vector<std::atomic<bool>> bad;
  std::atomic<int> total{0};
};

// n blocks of len random bytes (from seed) in *src, started as WRITE batches to remote onwards.
std::unique_ptr<Blocks> StartWrites(Link& link, uint64_t remote, std::vector<uint8_t>* src, size_t n,
                                    uint64_t len, uint32_t seed,
                                    const std::function<std::chrono::milliseconds(size_t)>& due = {}) {
  src->resize(n * len);
  Fill(*src, seed);
  auto b = std::make_unique<Blocks>(A(src->data()), remote, n, len);
  b->Start(link, Op::kWrite, due);
  return b;
}

// One thread starts many batches and then drives the link until all of them ended: every
// batch ends once, and every byte lands.
TEST_P(UcxTransportTest, OneThreadKeepsManyBatchesInFlight) {
  ASSERT_TRUE(link_->pipelined());
  constexpr size_t kBatches = 64;
  constexpr uint64_t kLen = 64 << 10;
  std::vector<uint8_t> src(kBatches * kLen), back(kBatches * kLen);
  Fill(src, 11);
  for (Op op : {Op::kWrite, Op::kRead}) {
    Blocks b(A((op == Op::kWrite ? src : back).data()), R(0), kBatches, kLen);
    b.Start(*link_, op);
    link_->Drive(Clock::now() + 10s, [&] { return b.All(); });
    ASSERT_TRUE(b.All()) << b.Ended();
    for (size_t i = 0; i < kBatches; ++i) {
      EXPECT_EQ(b.calls[i].load(), 1) << i;
      EXPECT_FALSE(b.bad[i].load()) << i;
    }
  }
  EXPECT_EQ(std::memcmp(region_.data(), src.data(), src.size()), 0);
  EXPECT_EQ(back, src);
}

// Batches started and never driven still end: the transport's progress thread drives them.
TEST_P(UcxTransportTest, StartedBatchesEndWithoutADriver) {
  std::vector<uint8_t> src;
  auto b = StartWrites(*link_, R(0), &src, 8, 256 << 10, 12);
  const auto t0 = Clock::now();
  while (!b->All() && Clock::now() - t0 < 5s) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(b->All()) << b->Ended() << " in 5 s";
  for (const auto& bad : b->bad) EXPECT_FALSE(bad.load());
  EXPECT_EQ(std::memcmp(region_.data(), src.data(), src.size()), 0);
}

// A batch that `ready` turns away ends with its answer and moves nothing.
TEST_P(UcxTransportTest, BatchTurnedAwayByReadyMovesNothing) {
  std::vector<uint8_t> src(4096, 0x77);
  const Slice no{A(src.data()), R(0), 4096}, yes{A(src.data()), R(8192), 4096};
  Status got;
  std::atomic<int> ended{0};
  link_->Start(
      Op::kWrite, {&no, 1}, Clock::now() + 5s,
      [&](Status s) {
        got = std::move(s);
        ended.fetch_add(1);
      },
      [] {
        return Status{StatusCode::kRemoteAccessDenied, "revoked meanwhile"};
      });
  link_->Start(Op::kWrite, {&yes, 1}, Clock::now() + 5s, [&](Status s) {
    EXPECT_TRUE(s.ok()) << s.ToString();
    ended.fetch_add(1);
  });
  link_->Drive(Clock::now() + 5s, [&] { return ended.load() == 2; });
  ASSERT_EQ(ended.load(), 2);
  EXPECT_EQ(got.code(), StatusCode::kRemoteAccessDenied) << got.ToString();
  EXPECT_EQ(region_[0], 0);
  EXPECT_EQ(region_[8192], 0x77);
}

// Quiesce is a fence: every batch either moved its bytes before Quiesce returned, or asks
// `ready` afterwards and sees what changed before the call (the engine revokes a region, then
// quiesces, then lets the peer reuse the memory).
TEST_P(UcxTransportTest, QuiesceIsAFence) {
  constexpr size_t kBatches = 64;
  constexpr uint64_t kLen = 1 << 20;
  std::vector<uint8_t> src(kLen, 0x11);
  std::vector<Slice> slices(kBatches, Slice{A(src.data()), R(0), kLen});
  std::atomic<bool> revoked{false};
  std::atomic<int> ended{0}, turned_away{0};
  for (const Slice& sl : slices) {
    link_->Start(
        Op::kWrite, {&sl, 1}, Clock::now() + 20s,
        [&](Status s) {
          if (s.code() == StatusCode::kRemoteAccessDenied) turned_away.fetch_add(1);
          ended.fetch_add(1);
        },
        [&] {
          return revoked.load() ? Status{StatusCode::kRemoteAccessDenied, "revoked"} : Status::Ok();
        });
  }
  revoked.store(true);
  link_->Quiesce(link_->QuiesceMark(), Clock::now() + std::chrono::seconds(60));
  std::memset(region_.data(), 0xee, kLen);  // the memory is reused at once
  link_->Drive(Clock::now() + 20s, [&] { return ended.load() == static_cast<int>(kBatches); });
  ASSERT_EQ(ended.load(), static_cast<int>(kBatches));
  EXPECT_TRUE(std::all_of(region_.begin(), region_.begin() + kLen, [](uint8_t v) { return v == 0xee; }))
      << "a batch landed after Quiesce returned";
  std::printf("%d of %zu batches turned away after the fence\n", turned_away.load(), kBatches);
}

// Quiesce waits for the batches taken to be posted, not for those still queued behind them
// (a fence must not wait for the rest of a long transfer).
TEST_P(UcxTransportTest, QuiesceDoesNotWaitForQueuedBatches) {
  if (std::string(GetParam()) != "tcp") GTEST_SKIP() << "over shared memory they all end first";
  constexpr size_t kBatches = 400;  // ~0.5 s over UCX's tcp here
  constexpr uint64_t kLen = 1 << 20;
  std::vector<uint8_t> src(kLen, 0x3c);
  Blocks b(A(src.data()), R(0), kBatches, 0);  // every block from src into the region's start
  for (auto& sl : b.slices) sl.len = kLen;
  b.Start(*link_, Op::kWrite);
  link_->Quiesce(link_->QuiesceMark(), Clock::now() + std::chrono::seconds(60));
  EXPECT_FALSE(b.All()) << "Quiesce waited for all " << kBatches << " batches";
  link_->Drive(Clock::now() + 60s, [&] { return b.All(); });
  ASSERT_TRUE(b.All()) << b.Ended();
}

// One batch whose deadline is due among others that have time: the others complete.
TEST_P(UcxTransportTest, LateBatchDoesNotFailItsNeighbours) {
  constexpr size_t kBatches = 9;
  constexpr uint64_t kLen = 1 << 20;
  std::vector<uint8_t> src;
  auto b =
      StartWrites(*link_, R(0), &src, kBatches, kLen, 14, [](size_t i) { return i == 4 ? 1ms : 10000ms; });
  link_->Drive(Clock::now() + 10s, [&] { return b->All(); });
  ASSERT_TRUE(b->All()) << b->Ended();
  for (size_t i = 0; i < kBatches; ++i) {
    if (i == 4) continue;  // done or timed out, as its moment fell
    EXPECT_FALSE(b->bad[i].load()) << i;
    EXPECT_EQ(std::memcmp(region_.data() + i * kLen, src.data() + i * kLen, kLen), 0) << i;
  }
}

std::string TlsName(const ::testing::TestParamInfo<const char*>& info) {
  std::string n = *info.param ? info.param : "all";
  for (auto& ch : n) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return n;
}
INSTANTIATE_TEST_SUITE_P(Tls, UcxTransportTest, ::testing::Values("tcp", ""), TlsName);

// ---------------------------------------------------------------- a target in another process
// The child runs this (disabled, so only when asked): it maps a region, reports its address,
// worker address and key on fd $XFER_UCX_TEST_TARGET_FD, then serves until killed.
TEST(UcxTargetProcess, DISABLED_Serve) {
  const char* fd_text = std::getenv(kTargetFdEnv);
  if (!fd_text) GTEST_SKIP() << "run by the tests below";
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  UcxTransport t(UcxOptions{});
  ASSERT_TRUE(t.Start().ok());
  std::vector<uint8_t> region(kRegionBytes);
  std::unique_ptr<UcxMemory> mem;
  ASSERT_TRUE(t.MapMemory(A(region.data()), region.size(), &mem).ok());
  std::string msg;
  auto put = [&](const void* p, size_t n) { msg.append(static_cast<const char*>(p), n); };
  const uint64_t base = A(region.data()), addr_len = t.worker_address().size(),
                 key_len = mem->packed_key().size();
  put(&base, 8);
  put(&addr_len, 8);
  put(t.worker_address().data(), addr_len);
  put(&key_len, 8);
  put(mem->packed_key().data(), key_len);
  const int fd = std::atoi(fd_text);
  ASSERT_EQ(::write(fd, msg.data(), msg.size()), static_cast<ssize_t>(msg.size()));
  ::close(fd);
  for (;;) ::pause();
}

class UcxRemoteTargetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetTls("tcp");
    int p[2];
    ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[1], 3);  // dup2 clears close-on-exec
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    std::vector<std::string> env_s;
    for (char** e = environ; *e; ++e) env_s.emplace_back(*e);
    env_s.push_back(std::string(kTargetFdEnv) + "=3");
    std::vector<char*> env;
    for (auto& e : env_s) env.push_back(e.data());
    env.push_back(nullptr);
    std::string a0 = "/proc/self/exe", a1 = "--gtest_filter=UcxTargetProcess.DISABLED_Serve",
                a2 = "--gtest_also_run_disabled_tests";
    char* argv[] = {a0.data(), a1.data(), a2.data(), nullptr};
    const int rc = ::posix_spawn(&pid_, "/proc/self/exe", &fa, nullptr, argv, env.data());
    posix_spawn_file_actions_destroy(&fa);
    ::close(p[1]);
    ASSERT_EQ(rc, 0) << std::strerror(rc);
    std::string msg;
    char buf[4096];
    for (;;) {
      pollfd pf{p[0], POLLIN, 0};
      ASSERT_EQ(::poll(&pf, 1, 10000), 1) << "the target process did not report";
      const ssize_t n = ::read(p[0], buf, sizeof buf);
      if (n <= 0) break;
      msg.append(buf, n);
    }
    ::close(p[0]);
    size_t at = 0;
    auto get = [&](size_t n) {
      std::string out = at < msg.size() ? msg.substr(at, n) : "";
      at += n;
      return out;
    };
    auto get64 = [&] {
      uint64_t v = 0;
      const std::string b = get(8);
      std::memcpy(&v, b.data(), b.size());
      return v;
    };
    ASSERT_GE(msg.size(), 24u) << "the target process failed to start";
    base_ = get64();
    const std::string address = get(get64());
    key_ = get(get64());
    ASSERT_EQ(at, msg.size());

    ASSERT_TRUE(b_.Start().ok());
    peer_ = UcxPeer{address,
                    [this](uint64_t a, uint64_t l, bool, UcxRemoteKey* k) {
                      if (a < base_ || a + l > base_ + kRegionBytes) return false;
                      *k = {1, key_};
                      return true;
                    },
                    "child"};
    ASSERT_TRUE(b_.Connect(peer_, &link_).ok());
    buf_.resize(4 << 20);
    Status s = Exec(Op::kWrite, 4096, 5000ms);  // connected, and the target serves
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  void TearDown() override {
    link_.reset();
    b_.Stop();
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Status Exec(Op op, uint64_t len, std::chrono::milliseconds t) {
    return link_->Execute(op, {{{A(buf_.data()), base_, len}}}, Clock::now() + t);
  }

  pid_t pid_ = -1;
  uint64_t base_ = 0;
  std::string key_;
  UcxPeer peer_;
  UcxTransport b_{UcxOptions{2}};
  std::shared_ptr<Link> link_;
  std::vector<uint8_t> buf_;
};

TEST_F(UcxRemoteTargetTest, HungTargetTimesOutAtTheDeadline) {
  ASSERT_EQ(::kill(pid_, SIGSTOP), 0);
  for (Op op : {Op::kRead, Op::kWrite, Op::kRead, Op::kWrite}) {  // every connection, rebuilt
    const auto t0 = Clock::now();
    Status s = Exec(op, buf_.size(), 500ms);
    const auto took = Clock::now() - t0;
    EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.ToString();
    EXPECT_GE(took, 450ms);
    EXPECT_LT(took, 500ms + kLateSlack);
  }
}

// A batch to a hung target that its caller only polls (Drive for one round, as
// GetTransferStatus does), or does not look at at all, still ends in TIMEOUT: a second after
// its deadline, whoever leads closes the endpoint without waiting.
TEST_F(UcxRemoteTargetTest, HungTargetTimesOutWhenOnlyPolled) {
  ASSERT_EQ(::kill(pid_, SIGSTOP), 0);
  for (bool poll : {true, false}) {
    SCOPED_TRACE(poll ? "polled" : "left alone");
    Status got;
    std::atomic<bool> over{false};
    const Slice sl{A(buf_.data()), base_, buf_.size()};
    const auto t0 = Clock::now();
    link_->Start(Op::kWrite, {&sl, 1}, t0 + 300ms, [&](Status s) {
      got = std::move(s);
      over.store(true);
    });
    while (!over.load() && Clock::now() - t0 < 10s) {
      if (poll) link_->Drive(Clock::now(), [&] { return over.load(); });
      std::this_thread::sleep_for(poll ? 100us : 1ms);  // polls often enough to look driven
    }
    ASSERT_TRUE(over.load()) << "the batch never ended";
    EXPECT_EQ(got.code(), StatusCode::kTimeout) << got.ToString();
    EXPECT_LT(Clock::now() - t0, 300ms + 1000ms + kLateSlack);
  }
}

TEST_F(UcxRemoteTargetTest, ShutdownReturnsARunningBatchAtOnce) {
  ASSERT_EQ(::kill(pid_, SIGSTOP), 0);
  Status s;
  Clock::time_point returned;
  std::thread t([&] {
    s = Exec(Op::kRead, buf_.size(), 10000ms);
    returned = Clock::now();
  });
  std::this_thread::sleep_for(200ms);
  const auto t0 = Clock::now();
  link_->Shutdown();
  t.join();
  EXPECT_EQ(s.code(), StatusCode::kConnectionLost) << s.ToString();
  EXPECT_LT(returned - t0, kLateSlack);
  s = Exec(Op::kWrite, 64, 5000ms);
  EXPECT_EQ(s.code(), StatusCode::kConnectionLost) << s.ToString();
}

// Closing endpoints whose puts a hung target never acknowledges waits for their flushes all
// at once: a second (kDrainGrace) for those Shutdown leads, and one more at most for those
// the transport's progress thread was leading; not a second per endpoint.
TEST_F(UcxRemoteTargetTest, ShutdownDrainsEveryEndpointAtOnce) {
  constexpr int kLinks = 6;
  UcxTransport rails{UcxOptions{kLinks}};
  ASSERT_TRUE(rails.Start().ok());
  std::shared_ptr<Link> link;
  ASSERT_TRUE(rails.Connect(peer_, &link).ok());
  std::vector<Slice> slices;
  std::vector<uint8_t> mine(kLinks << 20);
  for (int i = 0; i < kLinks; ++i) {  // one per endpoint (round-robin): each connects here
    slices.push_back({A(mine.data()) + (uint64_t(i) << 20), base_ + (uint64_t(i) << 20), 1 << 20});
    ASSERT_TRUE(link->Execute(Op::kWrite, {&slices[i], 1}, Clock::now() + 5000ms).ok());
  }
  ASSERT_EQ(::kill(pid_, SIGSTOP), 0);
  for (std::string stat; stat.find(") T ") == std::string::npos;) {  // stopped, not stopping
    std::ifstream in("/proc/" + std::to_string(pid_) + "/stat");
    std::getline(in, stat);
  }
  std::atomic<int> ended{0};
  for (int i = 0; i < kLinks; ++i) {
    link->Start(Op::kWrite, {&slices[i], 1}, Clock::now() + 30s, [&](Status s) {
      EXPECT_EQ(s.code(), StatusCode::kConnectionLost) << s.ToString();
      ++ended;
    });
  }
  const auto t0 = Clock::now();
  link->Shutdown();
  const auto took = Clock::now() - t0;
  EXPECT_EQ(ended.load(), kLinks);
  EXPECT_GE(took, 900ms) << "no endpoint waited for its flush: the test proved nothing";
  EXPECT_LT(took, 2 * 1000ms + 2000ms) << "the endpoints drained one after another";
  link.reset();
}

TEST_F(UcxRemoteTargetTest, KilledTargetFailsBatchesWithinTheirDeadline) {
  // Two threads move 1 MiB batches until the first fails; the target dies meanwhile.
  std::vector<std::thread> ts;
  std::vector<Status> failed(2);
  std::atomic<int> late{0};
  for (int i = 0; i < 2; ++i) {
    ts.emplace_back([&, i] {
      std::vector<uint8_t> mine(1 << 20);
      for (Status s; s.ok();) {
        const auto t0 = Clock::now();
        s = link_->Execute(i ? Op::kRead : Op::kWrite, {{{A(mine.data()), base_, mine.size()}}}, t0 + 2000ms);
        if (Clock::now() - t0 > 2000ms + kLateSlack) late.fetch_add(1);
        failed[i] = s;
      }
    });
  }
  std::this_thread::sleep_for(300ms);
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
  for (auto& t : ts) t.join();
  EXPECT_EQ(late.load(), 0);
  for (const Status& s : failed) {
    EXPECT_TRUE(s.code() == StatusCode::kConnectionLost || s.code() == StatusCode::kTimeout) << s.ToString();
  }
}

// ---------------------------------------------------------------- the rest
// CPU time (ticks) of this process's threads named `comm`.
long long ThreadTicks(const std::string& comm) {
  long long total = 0;
  DIR* d = ::opendir("/proc/self/task");
  if (!d) return -1;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string dir = std::string("/proc/self/task/") + e->d_name;
    std::ifstream c(dir + "/comm");
    std::string name;
    std::getline(c, name);
    if (name != comm) continue;
    std::ifstream st(dir + "/stat");
    std::string line;
    std::getline(st, line);
    std::istringstream in(line.substr(line.rfind(')') + 2));  // fields from 3 on
    std::string field;
    long long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && in >> field; ++i) {
      if (i == 14) utime = std::stoll(field);
      if (i == 15) stime = std::stoll(field);
    }
    total += utime + stime;
  }
  ::closedir(d);
  return total;
}

TEST(UcxTransport, IdleProgressThreadSleeps) {
  SetTls("tcp");
  UcxTransport t(UcxOptions{});
  ASSERT_TRUE(t.Start().ok());
  std::this_thread::sleep_for(100ms);
  const long long before = ThreadTicks("xfer-ucx-prog");
  ASSERT_GE(before, 0);
  std::this_thread::sleep_for(500ms);
  EXPECT_LE(ThreadTicks("xfer-ucx-prog") - before, 2);  // 10 ms ticks: under 5% of a core
  const auto t0 = Clock::now();
  t.Stop();
  EXPECT_LT(Clock::now() - t0, 1s);
}

TEST(UcxTransport, MemoryAndLinksOutliveTheTransport) {
  SetTls("tcp");
  std::vector<uint8_t> region(4096);
  auto t = std::make_unique<UcxTransport>(UcxOptions{1});
  ASSERT_TRUE(t->Start().ok());
  std::unique_ptr<UcxMemory> mem;
  ASSERT_TRUE(t->MapMemory(A(region.data()), region.size(), &mem).ok());
  std::unique_ptr<UcxMemory> empty;
  EXPECT_EQ(t->MapMemory(A(region.data()), 0, &empty).code(), StatusCode::kInvalidArgument);
  UcxPeer self{t->worker_address(),
               [&](uint64_t, uint64_t, bool, UcxRemoteKey* k) {
                 *k = {1, mem->packed_key()};
                 return true;
               },
               "self"};
  std::shared_ptr<Link> link;
  ASSERT_TRUE(t->Connect(self, &link).ok());
  std::vector<uint8_t> src(100, 9);
  Status s = link->Execute(Op::kWrite, {{{A(src.data()), A(region.data()), src.size()}}}, Clock::now() + 5s);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(region[99], 9);
  t.reset();  // the context stays until the link and the memory let go of it
  link.reset();
  mem.reset();
}

TEST(UcxTransport, StartRefusesTransportsThatCannotReachAPeer) {
  for (const char* tls : {"sm", "cma"}) {
    SetTls(tls);
    UcxTransport t(UcxOptions{});
    Status s = t.Start();
    EXPECT_EQ(s.code(), StatusCode::kUnsupported) << tls << ": " << s.ToString();
    EXPECT_NE(s.message().find("UCX_TLS"), std::string::npos) << s.message();
    EXPECT_TRUE(t.worker_address().empty());
  }
}

// Start asks UCX which memory types it registers (GPU memory goes direct only where one is
// cuda); Describe says them, as xfer-info shows.
TEST(UcxTransport, StartAndDescribeSayWhetherUcxRegistersGpuMemory) {
  SetTls("");  // (UCX's default: every transport and memory domain it has)
  UcxTransport t(UcxOptions{});
  ASSERT_TRUE(t.Start().ok());
  const std::string d = UcxTransport::Describe();
  EXPECT_NE(d.find("memory types: host"), std::string::npos) << d;
  EXPECT_EQ(t.cuda_memory(), d.find("memory types: host, cuda") != std::string::npos) << d;
  EXPECT_NE(d.find("GPU memory to other hosts: " + UcxTransport::GpuVerdict(t.cuda_memory())),
            std::string::npos)
      << d;
  EXPECT_NE(UcxTransport::GpuVerdict(false).find("has no CUDA memory support"), std::string::npos);
  t.Stop();
}

// A UCX without CUDA is never handed GPU memory to map: it would take it for host memory.
TEST(UcxTransport, GpuMemoryIsMappedOnlyByAUcxThatRegistersIt) {
  SetTls("");
  UcxTransport t(UcxOptions{});
  ASSERT_TRUE(t.Start().ok());
  if (t.cuda_memory()) GTEST_SKIP() << "this UCX registers CUDA memory (the GPU check maps GPU memory)";
  std::vector<uint8_t> host(4096);
  std::unique_ptr<UcxMemory> m;
  Status s = t.MapMemory(reinterpret_cast<uint64_t>(host.data()), host.size(), &m, true, /*gpu=*/true);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.ToString();
  EXPECT_NE(s.message().find("has no CUDA memory support"), std::string::npos) << s.message();
  EXPECT_EQ(m, nullptr);
  t.Stop();
}

TEST(UcxTransport, ConnectBeforeStartIsRefused) {
  UcxTransport t(UcxOptions{});
  std::shared_ptr<Link> link;
  EXPECT_EQ(t.Connect(UcxPeer{}, &link).code(), StatusCode::kInvalidArgument);
}

TEST(UcxTransport, DescribeNamesVersionAndTransports) {
  SetTls("tcp");
  const std::string d = UcxTransport::Describe();
  EXPECT_EQ(d.rfind("UCX 1.", 0), 0u) << d;
  EXPECT_NE(d.find("UCX_TLS=tcp"), std::string::npos) << d;
  EXPECT_NE(d.find("transports: tcp("), std::string::npos) << d;
  EXPECT_NE(d.find("RDMA"), std::string::npos) << d;
}

// ---------------------------------------------------------------- UCX loaded at run time
// The DT_NEEDED entries of a 64-bit ELF file: the libraries the dynamic loader must find before
// the program runs. Empty, with *error set, when the file cannot be read as one.
std::vector<std::string> NeededLibraries(const char* path, std::string* error) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *error = std::string("open: ") + std::strerror(errno);
    return {};
  }
  auto read_at = [fd](uint64_t offset, void* out, size_t len) {
    return ::pread(fd, out, len, static_cast<off_t>(offset)) == static_cast<ssize_t>(len);
  };
  std::vector<std::string> needed;
  Elf64_Ehdr eh{};
  if (!read_at(0, &eh, sizeof eh) || std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
      eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_shentsize != sizeof(Elf64_Shdr)) {
    *error = "not a 64-bit ELF file";
  }
  std::vector<Elf64_Shdr> sections(error->empty() ? eh.e_shnum : 0);
  if (!sections.empty() && !read_at(eh.e_shoff, sections.data(), sections.size() * sizeof(Elf64_Shdr))) {
    *error = "unreadable section headers";
    sections.clear();
  }
  for (const Elf64_Shdr& dyn : sections) {
    if (dyn.sh_type != SHT_DYNAMIC || dyn.sh_link >= sections.size()) continue;
    const Elf64_Shdr& str = sections[dyn.sh_link];  // the dynamic section's string table
    std::vector<Elf64_Dyn> entries(dyn.sh_size / sizeof(Elf64_Dyn));
    std::string strings(str.sh_size, '\0');
    if (!read_at(dyn.sh_offset, entries.data(), entries.size() * sizeof(Elf64_Dyn)) ||
        !read_at(str.sh_offset, strings.data(), strings.size())) {
      *error = "unreadable dynamic section";
      break;
    }
    for (const Elf64_Dyn& e : entries) {
      if (e.d_tag == DT_NULL) break;
      if (e.d_tag == DT_NEEDED && e.d_un.d_val < strings.size())
        needed.emplace_back(strings.c_str() + e.d_un.d_val);
    }
  }
  ::close(fd);
  if (needed.empty() && error->empty()) *error = "no DT_NEEDED entry";
  return needed;
}

// xfer loads UCX at run time (ucx_library.h): no binary it builds names a UCX library among
// those the dynamic loader must find, so the same binary runs on a machine without UCX.
TEST(UcxLibrary, BinariesDoNotNeedUcxLibraries) {
  std::string error;
  const std::vector<std::string> needed = NeededLibraries("/proc/self/exe", &error);
  ASSERT_FALSE(needed.empty()) << error;  // (libc, at least)
  for (const std::string& lib : needed) {
    for (const char* ucx : {"libucp", "libuct", "libucs", "libucm"}) {
      EXPECT_NE(lib.rfind(ucx, 0), 0u) << "this binary needs " << lib << " to start";
    }
  }
}

TEST(UcxLibrary, DefaultCandidatesHonourXferUcxLib) {
  const auto set = ucx::DefaultCandidates("/opt/ucx/lib/libucp.so.0");
  ASSERT_EQ(set.size(), 1u);  // that one alone: never quietly another UCX
  EXPECT_EQ(set[0].name, "/opt/ucx/lib/libucp.so.0");
  EXPECT_NE(set[0].label.find("XFER_UCX_LIB=/opt/ucx/lib/libucp.so.0"), std::string::npos) << set[0].label;
  for (const char* unset : {static_cast<const char*>(nullptr), ""}) {
    const auto c = ucx::DefaultCandidates(unset);
    ASSERT_FALSE(c.empty());
    EXPECT_EQ(c.back().name, "libucp.so.0");  // the dynamic loader's search comes last
    EXPECT_TRUE(c.front().if_loaded);         // after one the process loaded already
    EXPECT_FALSE(c.back().if_loaded);
    for (const auto& one : c) EXPECT_EQ(one.label.find("XFER_UCX_LIB"), std::string::npos) << one.label;
  }
}

TEST(UcxLibrary, MissingLibraryNamesWhatWasTriedAndHowToFix) {
  const std::string path = "/nonexistent/libucp.so.0";
  ucx::UcxLibrary lib;
  const Status s = ucx::LoadLibrary(ucx::DefaultCandidates(path.c_str()), &lib);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.ToString();
  EXPECT_NE(s.message().find("not found at run time"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("XFER_UCX_LIB=" + path + " (" + path), std::string::npos)  // (dlerror's)
      << s.message();
  EXPECT_NE(s.message().find("LD_LIBRARY_PATH"), std::string::npos) << s.message();
  EXPECT_EQ(lib.ucp_put_nbx, nullptr);
}

TEST(UcxLibrary, LibraryWithoutTheFunctionsIsRefused) {
  ucx::UcxLibrary lib;  // (libc opens, but is no UCX)
  const Status s = ucx::LoadLibrary({{"libc.so.6", "libc"}, {"/nonexistent/libucp.so.0", "nothing"}}, &lib);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.ToString();
  EXPECT_NE(s.message().find("no usable UCX"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("libc (it lacks ucp_cleanup"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("nothing (/nonexistent/libucp.so.0"), std::string::npos) << s.message();
  EXPECT_EQ(lib.ucp_cleanup, nullptr);
}

TEST(UcxLibrary, LoadsEveryFunction) {
  ucx::UcxLibrary lib;
  const Status s = ucx::LoadLibrary(ucx::DefaultCandidates(nullptr), &lib);
  ASSERT_TRUE(s.ok()) << s.ToString();
#define XFER_EXPECT_LOADED(name) EXPECT_NE(lib.name, nullptr) << #name;
  XFER_UCX_FUNCTIONS(XFER_EXPECT_LOADED)
#undef XFER_EXPECT_LOADED
  EXPECT_NE(lib.path.find("/libucp.so"), std::string::npos) << lib.path;  // the file, not the soname
  // libucs's, found through libucp's handle
  EXPECT_STREQ(lib.ucs_status_string(UCS_OK), "Success");
  EXPECT_STREQ(lib.ucs_memory_type_names[UCS_MEMORY_TYPE_HOST], "host");
  EXPECT_EQ(std::string(lib.ucp_get_version_string()).rfind("1.", 0), 0u) << lib.ucp_get_version_string();
  if (std::getenv("XFER_UCX_LIB") == nullptr) {  // the process's UCX: the same library
    ASSERT_TRUE(ucx::LibraryStatus().ok()) << ucx::LibraryStatus().ToString();
    EXPECT_EQ(ucx::Ucx().path, lib.path);
    EXPECT_EQ(ucx::Ucx().ucp_put_nbx, lib.ucp_put_nbx);
  }
}

// The child of the test below, which names no library in XFER_UCX_LIB: this process has no UCX.
TEST(UcxWithoutUcx, DISABLED_StartDescribeAndTheEngineSayWhy) {
  const char* lib = std::getenv("XFER_UCX_LIB");
  if (lib == nullptr) GTEST_SKIP() << "run by the test below";
  UcxTransport t(UcxOptions{});
  const Status s = t.Start();
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.ToString();
  EXPECT_EQ(s.message().rfind("ucx: UCX (libucp.so.0) not found at run time", 0), 0u) << s.message();
  EXPECT_NE(s.message().find(std::string("XFER_UCX_LIB=") + lib), std::string::npos) << s.message();
  EXPECT_TRUE(t.worker_address().empty());
  std::vector<uint8_t> region(4096);
  std::unique_ptr<UcxMemory> mem;
  EXPECT_EQ(t.MapMemory(A(region.data()), region.size(), &mem).code(), StatusCode::kInvalidArgument);
  t.Stop();
  const std::string d = UcxTransport::Describe();  // (xfer-info's)
  EXPECT_EQ(d.rfind("UCX (libucp.so.0) not found at run time", 0), 0u) << d;
  EXPECT_NE(d.find("\nGPU memory to other hosts: through the buffer pool (UCX was not found at run time)"),
            std::string::npos)
      << d;
  // An engine starts without it: the other backends serve.
  EngineOptions o;
  o.ucx.mode = UcxMode::kOn;
  Engine e;
  const Status init = e.Initialize("127.0.0.1:0", o);
  EXPECT_TRUE(init.ok()) << init.ToString();
  e.Finalize();
}

TEST(UcxLibrary, WithoutUcxTheTransportSaysWhyAndTheEngineStarts) {
  // The library loads once per process: the test runs in a child without it.
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, p[1], 1);
  posix_spawn_file_actions_adddup2(&fa, p[1], 2);
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e) {
    if (std::string_view(*e).rfind("XFER_UCX_LIB=", 0) != 0) env_s.emplace_back(*e);
  }
  env_s.push_back("XFER_UCX_LIB=/nonexistent/libucp.so.0");
  std::vector<char*> env;
  for (auto& e : env_s) env.push_back(e.data());
  env.push_back(nullptr);
  std::string a0 = "/proc/self/exe",
              a1 = "--gtest_filter=UcxWithoutUcx.DISABLED_StartDescribeAndTheEngineSayWhy",
              a2 = "--gtest_also_run_disabled_tests";
  char* argv[] = {a0.data(), a1.data(), a2.data(), nullptr};
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, argv, env.data());
  posix_spawn_file_actions_destroy(&fa);
  ::close(p[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; rc == 0 && (n = ::read(p[0], buf, sizeof buf)) > 0;) out.append(buf, n);
  ::close(p[0]);
  ASSERT_EQ(rc, 0) << std::strerror(rc);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  EXPECT_NE(out.find("[  PASSED  ] 1 test"), std::string::npos) << out;
  EXPECT_EQ(out.find("SKIPPED"), std::string::npos) << out;
}

}  // namespace
}  // namespace xfer::transport
