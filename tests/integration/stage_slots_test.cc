// Staging at the target (core/stage/): what a peer may ask of the slots an engine lends it,
// from a raw session. The transfers through them are IntegrationStaging's "ucx" cases.
#include <map>
#include <memory>
#include <vector>

#include "raw_peer.h"
#include "test_common.h"

namespace xfer_test {
namespace {

using namespace std::chrono_literals;
namespace wire = xfer::wire;

// Reads frames until `n` answers of type T arrived (by id), or 10 s passed.
template <class T>
std::map<uint64_t, T> Await(RawSession& raw, size_t n) {
  std::map<uint64_t, T> answers;
  wire::Message m;
  for (auto until = Clock::now() + 10s; answers.size() < n && raw.s->ReadOne(until, &m).ok();) {
    if (auto* a = std::get_if<T>(&m)) {
      EXPECT_TRUE(answers.emplace(a->id, *a).second) << a->id << " twice";
    }
  }
  return answers;
}

// Moves are checked before any byte moves: a slot it did not lend, ranges past the slot,
// memory outside the regions registered here or read-only for peers; the session stays open,
// and a good move then copies what it names into the slot.
TEST(StageSlots, APeersMovesAreCheckedAgainstItsSlotsAndTheRegions) {
  xfer::EngineOptions o;
  o.staging_buffers = 2;
  o.staging_buffer_bytes = 64 << 10;
  xfer::Engine target;
  XT_ASSERT_OK(target.Initialize("127.0.0.1:0", o));
  LocalBuffer buf(1 << 20), ro(4096), other(4096);
  xfer::MemHandle h = 0, hro = 0;
  XT_ASSERT_OK(target.RegisterMem(buf.data(), 1 << 20, xfer::MemType::kHost, &h));
  XT_ASSERT_OK(
      target.RegisterMem(ro.data(), 4096, xfer::MemType::kHost, &hro, "", xfer::PeerAccess::kReadOnly));
  auto raw = std::make_unique<RawSession>(target.LocalName());
  const wire::Hello hello = raw->Hello(HelloOf("10.9.8.7:6000", 0x5eed));
  ASSERT_FALSE(hello.name.empty());
  EXPECT_NE(hello.features & wire::kFeatureTargetStaging, 0u);

  raw->Send(wire::StageMove{1, true, 0, {{buf.addr(), 10}}});  // before any slots were lent
  auto early = Await<wire::StageMoved>(*raw, 1);
  ASSERT_EQ(early.size(), 1u);
  EXPECT_EQ(early[1].code, xfer::StatusCode::kInvalidArgument) << early[1].why;

  raw->Send(wire::StageOpen{2});
  auto opened = Await<wire::StageOpened>(*raw, 1);
  ASSERT_EQ(opened.size(), 1u);
  ASSERT_EQ(opened[2].code, xfer::StatusCode::kOk) << opened[2].why;
  EXPECT_EQ(opened[2].slots, 2u);
  EXPECT_EQ(opened[2].slot_bytes, 64u << 10);
  EXPECT_GE(opened[2].region.info.len, 128u << 10);

  raw->Send(wire::StageMove{3, true, 2, {{buf.addr(), 10}}});                                // no slot 2
  raw->Send(wire::StageMove{4, true, 0, {{buf.addr(), 40 << 10}, {buf.addr(), 40 << 10}}});  // past the slot
  raw->Send(wire::StageMove{5, true, 0, {{buf.addr(), UINT64_MAX}}});                        // past it too
  auto moved = Await<wire::StageMoved>(*raw, 3);
  // Each of these is copied (or not) in turn: at most one move per slot waits.
  auto one = [&](const wire::StageMove& m) {
    raw->Send(m);
    auto a = Await<wire::StageMoved>(*raw, 1);
    moved.insert(a.begin(), a.end());
  };
  one({6, true, 0, {{other.addr(), 10}}});                             // not registered
  one({7, true, 1, {{ro.addr(), 10}}});                                // read-only
  one({8, true, 1, {{buf.addr() + (1 << 20) - 5, 10}}});               // past its region's end
  one({9, false, 1, {{ro.addr(), 10}}});                               // reading it is fine
  raw->Send(wire::StageMove{10, false, 0, {{buf.addr(), 64 << 10}}});  // a whole slot each
  raw->Send(wire::StageMove{11, false, 1, {{buf.addr(), 64 << 10}}});
  auto more = Await<wire::StageMoved>(*raw, 2);
  moved.insert(more.begin(), more.end());
  ASSERT_EQ(moved.size(), 9u);
  EXPECT_EQ(moved[3].code, xfer::StatusCode::kInvalidArgument) << moved[3].why;
  EXPECT_EQ(moved[4].code, xfer::StatusCode::kInvalidArgument) << moved[4].why;
  EXPECT_EQ(moved[5].code, xfer::StatusCode::kInvalidArgument) << moved[5].why;
  EXPECT_EQ(moved[6].code, xfer::StatusCode::kRemoteAccessDenied) << moved[6].why;
  EXPECT_EQ(moved[7].code, xfer::StatusCode::kRemoteAccessDenied) << moved[7].why;
  EXPECT_EQ(moved[8].code, xfer::StatusCode::kRemoteAccessDenied) << moved[8].why;
  EXPECT_EQ(moved[9].code, xfer::StatusCode::kOk) << moved[9].why;
  EXPECT_EQ(moved[10].code, xfer::StatusCode::kOk) << moved[10].why;
  EXPECT_EQ(moved[11].code, xfer::StatusCode::kOk) << moved[11].why;
  EXPECT_EQ(buf.data()[0], 0);  // (nothing written by the refused moves)
  raw.reset();
  target.Finalize();
}

// One pool per session, EngineOptions::staging_pools in all: the next session is refused
// RESOURCE_EXHAUSTED, and gets the pool of a session that ended.
TEST(StageSlots, PoolsAreBoundedAndGoToTheNextSessionWhenOneEnds) {
  xfer::EngineOptions o;
  o.staging_buffers = 1;
  o.staging_buffer_bytes = 64 << 10;
  o.heartbeat_timeout = 60s;  // (the raw sessions send none)
  o.staging_pools = 3;
  xfer::Engine target;
  XT_ASSERT_OK(target.Initialize("127.0.0.1:0", o));
  std::vector<std::unique_ptr<RawSession>> raws;
  auto open = [&](uint64_t incarnation) {
    raws.push_back(std::make_unique<RawSession>(target.LocalName()));
    EXPECT_FALSE(raws.back()
                     ->Hello(HelloOf("10.9.8.7:" + std::to_string(6000 + incarnation), incarnation))
                     .name.empty());
    raws.back()->Send(wire::StageOpen{1});
    auto a = Await<wire::StageOpened>(*raws.back(), 1);
    return a.empty() ? xfer::StatusCode::kInternal : a[1].code;
  };
  for (uint64_t i = 1; i <= 3; ++i) EXPECT_EQ(open(i), xfer::StatusCode::kOk) << i;
  EXPECT_EQ(open(4), xfer::StatusCode::kResourceExhausted);
  raws.front().reset();  // (its session ends: its pool goes back)
  bool again = false;
  for (auto until = Clock::now() + 5s; !again && Clock::now() < until; std::this_thread::sleep_for(20ms)) {
    again = open(10 + raws.size()) == xfer::StatusCode::kOk;
  }
  EXPECT_TRUE(again) << "the pool of a session that ended was not lent again";
  raws.clear();
  target.Finalize();
}

}  // namespace
}  // namespace xfer_test
