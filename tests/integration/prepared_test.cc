// Prepared lists (Engine::PrepareLocalList, PrepareRemoteList, and the transfers by index):
// data lands where the pairs say, over cma, shm and local (the inline copies included); bad
// input is refused with the entry or pair named and nothing moved; lists survive what they
// must (a peer's deregistration and re-registration, a local registry change) and fail
// clearly where they cannot (a peer gone, local memory unmapped).
#include <sys/mman.h>

#include <numeric>
#include <random>

#include "test_common.h"

namespace xfer_test {
namespace {

using namespace std::chrono_literals;
using xfer::ListHandle;
using xfer::MemRange;
using xfer::PreparedDescs;

// Blocks of `block` bytes, one after another from base.
std::vector<MemRange> Blocks(uint64_t base, uint64_t count, uint64_t block) {
  std::vector<MemRange> r;
  for (uint64_t i = 0; i < count; ++i) r.push_back({base + i * block, block});
  return r;
}

class Prepared : public PeerFixture {
 protected:
  ListHandle Local(const std::vector<MemRange>& ranges) {
    ListHandle h = 0;
    const xfer::Status s = engine_.PrepareLocalList(ranges, &h);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return h;
  }
  ListHandle Remote(const std::vector<MemRange>& ranges, const std::string& peer = "") {
    ListHandle h = 0;
    const xfer::Status s = engine_.PrepareRemoteList(peer.empty() ? peer_.name() : peer, ranges, &h);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return h;
  }
  xfer::Status Move(Op op, ListHandle l, const std::vector<uint32_t>& li, ListHandle r,
                    const std::vector<uint32_t>& ri, xfer::RequestStatus* result = nullptr) {
    return engine_.TransferSync(op, PreparedDescs{l, li, r, ri}, 30s, {}, result);
  }
  xfer::Status MoveAsync(Op op, ListHandle l, const std::vector<uint32_t>& li, ListHandle r,
                         const std::vector<uint32_t>& ri) {
    xfer::RequestHandle h = 0;
    const xfer::Status s = engine_.TransferAsync(op, PreparedDescs{l, li, r, ri}, 30s, {}, &h);
    if (!s.ok()) return s;
    return WaitFor(engine_, h).wait;
  }

  // WRITEs local blocks into remote blocks in a shuffled order (sync, then async), checks each
  // remote block, then READs them back into other local blocks and compares.
  void ShuffledRoundTrip(const PeerRegion& r, uint64_t block, bool register_local) {
    const uint64_t n = r.len / block;
    LocalBuffer src(n * block), back(n * block);
    src.Fill(n + block);
    xfer::MemHandle mh = 0;
    if (register_local) XT_ASSERT_OK(engine_.RegisterMem(src.data(), src.len(), xfer::MemType::kHost, &mh));
    const ListHandle from = Local(Blocks(src.addr(), n, block));
    const ListHandle into = Local(Blocks(back.addr(), n, block));
    const ListHandle there = Remote(Blocks(r.addr, n, block));
    std::vector<uint32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(7));
    std::vector<uint32_t> identity(n);
    std::iota(identity.begin(), identity.end(), 0);
    // Local block i goes to remote block order[i]: the first half in one request, the rest one
    // pair per async request (the inline path where the route copies inline).
    const std::vector<uint32_t> first(identity.begin(), identity.begin() + n / 2);
    const std::vector<uint32_t> first_to(order.begin(), order.begin() + n / 2);
    XT_ASSERT_OK(Move(Op::kWrite, from, first, there, first_to));
    for (uint64_t i = n / 2; i < n; ++i)
      XT_ASSERT_OK(MoveAsync(Op::kWrite, from, {uint32_t(i)}, there, {order[i]}));
    for (uint64_t i = 0; i < n; ++i) {
      ASSERT_EQ(peer_.SumRange(r.addr + order[i] * block, block), Hash64(src.data() + i * block, block))
          << "block " << i;
    }
    // Back: remote block order[i] into local block i, one pair per sync request for the first
    // half, the rest in one async request.
    for (uint64_t i = 0; i < n / 2; ++i)
      XT_ASSERT_OK(Move(Op::kRead, into, {uint32_t(i)}, there, {order[i]}));
    const std::vector<uint32_t> rest(identity.begin() + n / 2, identity.end());
    const std::vector<uint32_t> rest_from(order.begin() + n / 2, order.end());
    XT_ASSERT_OK(MoveAsync(Op::kRead, into, rest, there, rest_from));
    EXPECT_EQ(back.Hash(), src.Hash());
    for (ListHandle h : {from, into, there}) XT_EXPECT_OK(engine_.ReleaseList(h));
    if (register_local) XT_EXPECT_OK(engine_.DeregisterMem(mh));
  }
};

TEST_F(Prepared, ShuffledBlocksOverCma) {
  ShuffledRoundTrip(peer_.Alloc(64 * 4096), 4096, false);
  xfer::PeerInfo info;
  XT_ASSERT_OK(engine_.GetPeerInfo(peer_.name(), &info));
  EXPECT_GT(info.BytesVia("cma"), 0u);
}

TEST_F(Prepared, ShuffledBlocksOverShmInline) {
  ShuffledRoundTrip(peer_.ShmAlloc(32 * 16384), 16384, true);
  xfer::PeerInfo info;
  XT_ASSERT_OK(engine_.GetPeerInfo(peer_.name(), &info));
  EXPECT_GT(info.BytesVia("shm"), 0u);
  EXPECT_EQ(info.BytesVia("cma"), 0u);
}

TEST_F(Prepared, ToThisEngineOverLocal) {
  LocalBuffer src(8 * 4096), dst(8 * 4096);
  src.Fill(3);
  xfer::MemHandle h = 0;
  XT_ASSERT_OK(engine_.RegisterMem(dst.data(), dst.len(), xfer::MemType::kHost, &h));
  const ListHandle from = Local(Blocks(src.addr(), 8, 4096));
  const ListHandle into = Remote(Blocks(dst.addr(), 8, 4096), engine_.LocalName());
  XT_ASSERT_OK(Move(Op::kWrite, from, {0, 1, 2, 3}, into, {7, 6, 5, 4}));
  for (uint32_t i : {4u, 5u, 6u, 7u}) XT_ASSERT_OK(MoveAsync(Op::kWrite, from, {i}, into, {7 - i}));
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(std::memcmp(dst.data() + (7 - i) * 4096, src.data() + i * 4096, 4096), 0) << i;
  }
  xfer::PeerInfo info;
  XT_ASSERT_OK(engine_.GetPeerInfo(engine_.LocalName(), &info));
  EXPECT_EQ(info.BytesVia("local"), 8u * 4096);
  XT_EXPECT_OK(engine_.DeregisterMem(h));
}

TEST_F(Prepared, RemoteListAcrossRegionsAndANotification) {
  const PeerRegion a = peer_.Alloc(4 * 4096), b = peer_.ShmAlloc(4 * 4096), c = peer_.Alloc(4 * 4096);
  std::vector<MemRange> ranges;
  for (int i = 0; i < 4; ++i) {  // interleaved: a0 b0 c0 a1 b1 c1 ...
    for (const PeerRegion* r : {&a, &b, &c}) ranges.push_back({r->addr + i * 4096ull, 4096});
  }
  LocalBuffer src(12 * 4096);
  src.Fill(11);
  const ListHandle from = Local(Blocks(src.addr(), 12, 4096));
  const ListHandle there = Remote(ranges);
  std::vector<uint32_t> all(12);
  std::iota(all.begin(), all.end(), 0);
  xfer::TransferOptions o;
  o.notify = "blocks 0-11 ready";
  XT_ASSERT_OK(engine_.TransferSync(Op::kWrite, PreparedDescs{from, all, there, all}, 30s, o));
  for (int i = 0; i < 12; ++i) {
    const PeerRegion* r = i % 3 == 0 ? &a : i % 3 == 1 ? &b : &c;
    EXPECT_EQ(peer_.SumRange(r->addr + (i / 3) * 4096ull, 4096), Hash64(src.data() + i * 4096, 4096)) << i;
  }
  const Reply n = peer_.Call("notifies");
  ASSERT_TRUE(n.ok) << n.line;
  EXPECT_EQ(n.u64(0), 1u) << n.line;
  EXPECT_NE(n.line.find("blocks 0-11 ready"), std::string::npos) << n.line;
}

TEST_F(Prepared, BadInputIsRefusedAndMovesNothing) {
  const PeerRegion r = peer_.Alloc(4 * 4096);
  const PeerRegion ro = peer_.Alloc(4096, "ro", PeerAccess::kReadOnly);
  peer_.Fill(r, 5);
  const uint64_t before = peer_.Sum(r);
  LocalBuffer src(4 * 4096);
  ListHandle h = 0;
  // Preparing: empty, malformed, outside every region.
  XT_EXPECT_CODE(engine_.PrepareLocalList({}, &h), StatusCode::kInvalidArgument);
  XT_EXPECT_CODE(engine_.PrepareLocalList({{src.addr(), 0}}, &h), StatusCode::kInvalidArgument);
  XT_EXPECT_CODE(engine_.PrepareLocalList({{0, 64}}, &h), StatusCode::kInvalidArgument);
  XT_EXPECT_CODE(engine_.PrepareLocalList({{~0ull - 10, 64}}, &h), StatusCode::kInvalidArgument);
  XT_EXPECT_CODE(engine_.PrepareLocalList({{src.addr(), 64}}, nullptr), StatusCode::kInvalidArgument);
  XT_EXPECT_CODE(engine_.PrepareRemoteList(peer_.name(), {{r.addr, 4096}, {r.addr + 3 * 4096, 8192}}, &h),
                 StatusCode::kRemoteAccessDenied);
  const xfer::Status unmapped = engine_.PrepareLocalList({{src.addr(), 4096}, {8, 4096}}, &h);
  EXPECT_EQ(unmapped.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unmapped.message().find("entry 1"), std::string::npos) << unmapped.ToString();
  XT_EXPECT_CODE(engine_.PrepareRemoteList("127.0.0.1:1", {{r.addr, 64}}, &h), StatusCode::kNotConnected);

  const ListHandle l = Local(Blocks(src.addr(), 4, 4096));
  const ListHandle rl = Remote(Blocks(r.addr, 4, 4096));
  const ListHandle rol = Remote({{ro.addr, 4096}});
  const ListHandle odd = Remote({{r.addr, 100}});
  auto code = [&](Op op, ListHandle a, std::vector<uint32_t> ai, ListHandle b, std::vector<uint32_t> bi) {
    return Move(op, a, ai, b, bi).code();
  };
  EXPECT_EQ(code(Op::kWrite, l, {4}, rl, {0}), StatusCode::kInvalidArgument);  // past the end
  EXPECT_EQ(code(Op::kWrite, l, {0}, rl, {9}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Op::kWrite, l, {0, 1}, rl, {0}), StatusCode::kInvalidArgument);  // sizes differ
  EXPECT_EQ(code(Op::kWrite, l, {}, rl, {}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Op::kWrite, l, {0}, odd, {0}), StatusCode::kInvalidArgument);     // lengths differ
  EXPECT_EQ(code(Op::kWrite, rl, {0}, l, {0}), StatusCode::kInvalidArgument);      // kinds swapped
  EXPECT_EQ(code(Op::kWrite, l, {0}, 987654, {0}), StatusCode::kInvalidArgument);  // unknown
  EXPECT_EQ(code(Op::kWrite, l, {0}, rol, {0}), StatusCode::kRemoteAccessDenied);  // read-only
  EXPECT_EQ(code(static_cast<Op>(9), l, {0}, rl, {0}), StatusCode::kInvalidArgument);
  // A pair that is bad after good ones: the good ones do not move either.
  const xfer::Status late = Move(Op::kWrite, l, {0, 1, 2}, rl, {0, 1, 7});
  EXPECT_EQ(late.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(late.message().find("pair 2"), std::string::npos) << late.ToString();
  xfer::RequestHandle req = 0;
  XT_EXPECT_CODE(
      engine_.TransferAsync(Op::kWrite, PreparedDescs{l, std::vector<uint32_t>{0}, rl, {}}, 1s, {}, &req),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(peer_.Sum(r), before);

  // A READ into memory this process may only read.
  void* page = mmap(nullptr, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(page, MAP_FAILED);
  const ListHandle readonly = Local({{reinterpret_cast<uint64_t>(page), 4096}});
  const xfer::Status into_ro = Move(Op::kRead, readonly, {0}, rl, {0});
  EXPECT_EQ(into_ro.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(into_ro.message().find("not writable"), std::string::npos) << into_ro.ToString();
  XT_EXPECT_OK(Move(Op::kWrite, readonly, {0}, rl, {0}));  // (reading it is fine)
  munmap(page, 4096);

  // Released lists are unknown; a second release says so.
  XT_EXPECT_OK(engine_.ReleaseList(rl));
  XT_EXPECT_CODE(engine_.ReleaseList(rl), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Op::kWrite, l, {0}, rl, {0}), StatusCode::kInvalidArgument);
}

TEST_F(Prepared, PeerDeregistrationAndReRegistration) {
  const PeerRegion r = peer_.Alloc(8 * 4096);
  LocalBuffer src(8 * 4096);
  src.Fill(21);
  const ListHandle l = Local(Blocks(src.addr(), 8, 4096));
  const ListHandle rl = Remote(Blocks(r.addr, 8, 4096));
  XT_ASSERT_OK(Move(Op::kWrite, l, {0}, rl, {0}));
  ASSERT_TRUE(peer_.Call("dereg " + std::to_string(r.handle)).ok);
  XT_EXPECT_CODE(Move(Op::kWrite, l, {1}, rl, {1}), StatusCode::kRemoteAccessDenied);
  XT_EXPECT_CODE(MoveAsync(Op::kWrite, l, {1, 2}, rl, {1, 2}), StatusCode::kRemoteAccessDenied);
  // The same memory registered again: the list finds it.
  // (At once: a refusal catches up with the peer's region updates before it is final.)
  PeerRegion again = peer_.Reg(r.addr, r.len);
  XT_ASSERT_OK(Move(Op::kWrite, l, {1, 2}, rl, {1, 2}));
  EXPECT_EQ(peer_.SumRange(r.addr + 4096, 8192), Hash64(src.data() + 4096, 8192));
  // The same request again, after another deregistration: the plan kept from the last one
  // must not be used (its region was revoked), and once registered again it works.
  ASSERT_TRUE(peer_.Call("dereg " + std::to_string(again.handle)).ok);
  XT_EXPECT_CODE(Move(Op::kWrite, l, {1, 2}, rl, {1, 2}), StatusCode::kRemoteAccessDenied);
  peer_.Reg(r.addr, r.len);
  peer_.FillRange(r.addr, r.len, 99);
  XT_ASSERT_OK(Move(Op::kWrite, l, {1, 2}, rl, {1, 2}));
  EXPECT_EQ(peer_.SumRange(r.addr + 4096, 8192), Hash64(src.data() + 4096, 8192));
}

TEST_F(Prepared, TheSameRequestPostedAgainMovesTheDataOfTheMoment) {
  const PeerRegion r = peer_.ShmAlloc(64 * 64);
  LocalBuffer src(64 * 64), back(64 * 64);
  const ListHandle l = Local(Blocks(src.addr(), 64, 64));
  const ListHandle into = Local(Blocks(back.addr(), 64, 64));
  // Two remote lists of the same blocks: each keeps the plan of its own request (WRITEs over
  // one, READs over the other), so every request after the first of each is planned no more.
  const ListHandle there = Remote(Blocks(r.addr, 64, 64)), back_from = Remote(Blocks(r.addr, 64, 64));
  std::vector<uint32_t> all(64), reversed(64);
  std::iota(all.begin(), all.end(), 0);
  std::iota(reversed.rbegin(), reversed.rend(), 0);
  for (int round = 0; round < 4; ++round) {
    src.Fill(round);
    XT_ASSERT_OK(Move(Op::kWrite, l, all, there, reversed));
    for (int i : {0, 17, 63}) {
      EXPECT_EQ(peer_.SumRange(r.addr + (63 - i) * 64, 64), Hash64(src.data() + i * 64, 64))
          << round << " " << i;
    }
    std::memset(back.data(), 0, back.len());
    XT_ASSERT_OK(MoveAsync(Op::kRead, into, reversed, back_from, all));  // back: block i into 63 - i
    EXPECT_EQ(back.Hash(), src.Hash()) << round;
  }
}

// An entry in a read-only region and in a writable one inside it: a WRITE to it is allowed,
// whatever the entry before it was found in, and even when the list was prepared before this
// engine heard of the writable one.
TEST_F(Prepared, AnEntryTakesTheWritableRegionThatHoldsIt) {
  const PeerRegion ro = peer_.Alloc(3 * 4096, "ro", PeerAccess::kReadOnly);
  peer_.Reg(ro.addr + 4096, 2 * 4096, "rw");
  LocalBuffer src(2 * 4096);
  src.Fill(5);
  const ListHandle l = Local(Blocks(src.addr(), 2, 4096));
  const ListHandle rl = Remote(Blocks(ro.addr, 2, 4096));  // entry 0: read-only only; 1: both
  XT_EXPECT_CODE(Move(Op::kWrite, l, {0}, rl, {0}), StatusCode::kRemoteAccessDenied);
  XT_ASSERT_OK(Move(Op::kWrite, l, {1}, rl, {1}));
  EXPECT_EQ(peer_.SumRange(ro.addr + 4096, 4096), Hash64(src.data() + 4096, 4096));
  // Prepared while only the read-only region is known here: the writable one registered later
  // takes the WRITE.
  const PeerRegion ro2 = peer_.Alloc(2 * 4096, "ro2", PeerAccess::kReadOnly);
  const ListHandle early = Remote(Blocks(ro2.addr, 2, 4096));
  peer_.Reg(ro2.addr + 4096, 4096, "rw2");
  XT_ASSERT_OK(Move(Op::kWrite, l, {1}, early, {1}));
  EXPECT_EQ(peer_.SumRange(ro2.addr + 4096, 4096), Hash64(src.data() + 4096, 4096));
  XT_EXPECT_CODE(Move(Op::kWrite, l, {0}, early, {0}), StatusCode::kRemoteAccessDenied);
}

TEST_F(Prepared, AnotherEnginesListIsUnknown) {
  xfer::Engine other;
  XT_ASSERT_OK(other.Initialize("127.0.0.1:0"));
  LocalBuffer src(4096);
  ListHandle theirs = 0;
  XT_ASSERT_OK(other.PrepareLocalList({{src.addr(), 4096}}, &theirs));
  const PeerRegion r = peer_.Alloc(4096);
  const ListHandle rl = Remote({{r.addr, 4096}});
  const xfer::Status s = Move(Op::kWrite, theirs, {0}, rl, {0});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("unknown"), std::string::npos) << s.ToString();
  XT_EXPECT_CODE(engine_.ReleaseList(theirs), StatusCode::kInvalidArgument);
  XT_EXPECT_OK(other.ReleaseList(theirs));
}

TEST_F(Prepared, LocalMemoryUnmappedAfterDeregistration) {
  const PeerRegion r = peer_.Alloc(4 * 4096);
  const uint64_t len = 4 * 4096;
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  const uint64_t addr = reinterpret_cast<uint64_t>(p);
  xfer::MemHandle h = 0;
  XT_ASSERT_OK(engine_.RegisterMem(p, len, xfer::MemType::kHost, &h));
  const ListHandle l = Local(Blocks(addr, 4, 4096));
  const ListHandle rl = Remote(Blocks(r.addr, 4, 4096));
  XT_ASSERT_OK(Move(Op::kRead, l, {0, 1}, rl, {0, 1}));
  XT_ASSERT_OK(engine_.DeregisterMem(h));
  // The range becomes inaccessible in one step: after a plain munmap another thread of this
  // process (an engine's, the allocator's) may map new memory at the same address, which then
  // is readable memory of this process again and the engine rightly moves it.
  ASSERT_NE(mmap(p, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0), MAP_FAILED);
  // Nothing crashes: the registry changed, so the list's entries are checked again (and the
  // plan kept from the same request before is not used).
  XT_EXPECT_CODE(Move(Op::kRead, l, {0, 1}, rl, {0, 1}), StatusCode::kInvalidArgument);
  const xfer::Status s = Move(Op::kRead, l, {0}, rl, {0});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("no longer"), std::string::npos) << s.ToString();
  XT_EXPECT_CODE(MoveAsync(Op::kWrite, l, {3}, rl, {3}), StatusCode::kInvalidArgument);
  munmap(p, len);
}

TEST_F(Prepared, PeerGoneEndsTheList) {
  const PeerRegion r = peer_.Alloc(4096);
  LocalBuffer src(4096);
  const ListHandle l = Local({{src.addr(), 4096}});
  const ListHandle rl = Remote({{r.addr, 4096}});
  XT_ASSERT_OK(Move(Op::kWrite, l, {0}, rl, {0}));
  peer_.KillNow();
  // A batch may see the death first; once the engine has seen the session end, the list
  // itself is refused, saying what to do.
  xfer::Status s;
  ASSERT_TRUE(PollUntil(
      [&] {
        s = Move(Op::kWrite, l, {0}, rl, {0});
        return s.code() != StatusCode::kConnectionLost ||
               s.message().find("prepare the remote list again") != std::string::npos;
      },
      10s))
      << s.ToString();
  EXPECT_EQ(s.code(), StatusCode::kConnectionLost) << s.ToString();
  XT_EXPECT_CODE(MoveAsync(Op::kRead, l, {0}, rl, {0}), StatusCode::kConnectionLost);
}

TEST_F(Prepared, LandedNamesPairsAfterADeadline) {
  // Enough pairs that a 1 ms deadline passes before all have moved.
  const uint64_t block = 1 << 20, n = 64;
  const PeerRegion r = peer_.Alloc(n * block);
  LocalBuffer src(n * block);
  const ListHandle l = Local(Blocks(src.addr(), n, block));
  const ListHandle rl = Remote(Blocks(r.addr, n, block));
  std::vector<uint32_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  xfer::RequestStatus result;
  const xfer::Status s = engine_.TransferSync(Op::kWrite, PreparedDescs{l, all, rl, all}, 1ms, {}, &result);
  if (s.ok()) GTEST_SKIP() << "64 MiB moved within 1 ms: no deadline to test";
  EXPECT_EQ(result.state, RequestState::kTimeout);
  EXPECT_LT(result.landed.size(), n);
  for (uint64_t k : result.landed) EXPECT_LT(k, n);
}

}  // namespace
}  // namespace xfer_test
