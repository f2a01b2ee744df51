// The peer table's Find answers from what the calling thread found last only while the table
// is unchanged: a peer removed, replaced by its restart or installed anew is seen at once.
#include "core/peers/peer_table.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace xfer {
namespace {

PeerTable::Peer MakePeer(uint64_t incarnation, bool outbound) {
  PeerTable::Peer p;
  p.session = std::make_shared<control::Session>(net::Fd(), outbound, "127.0.0.1:1");
  p.state = std::make_shared<PeerState>();
  p.state->info.incarnation = incarnation;
  return p;
}

TEST(PeerTable, FindSeesEveryChangeOfTheTable) {
  PeerTable table;
  table.set_incarnation(1);
  const auto deadline = PeerTable::Clock::now() + std::chrono::seconds(1);
  PeerTable::Peer found;
  EXPECT_FALSE(table.Find("a", &found));

  const PeerTable::Peer first = MakePeer(10, true);
  ASSERT_TRUE(table.Claim("a", deadline).ok());
  ASSERT_TRUE(table.InstallClaimed("a", first));
  for (int i = 0; i < 2; ++i) {  // (the second from what this thread found last)
    ASSERT_TRUE(table.Find("a", &found));
    EXPECT_EQ(found.state, first.state);
  }
  EXPECT_FALSE(table.Find("b", &found)) << "another name answered with the last one's peer";

  // The peer restarts: its new incarnation's session takes the old one's place.
  ASSERT_TRUE(table.RemoveSession("a", first.session));
  EXPECT_FALSE(table.Find("a", &found)) << "a removed peer was found";
  const PeerTable::Peer second = MakePeer(20, false);
  PeerTable::Peer replaced;
  ASSERT_TRUE(table.BeginAccept("a", "a", 20, "10.0.0.1", nullptr, &replaced).ok());
  table.FinishAccept("a", second);
  ASSERT_TRUE(table.Find("a", &found));
  EXPECT_EQ(found.state, second.state);
  const PeerTable::Peer third = MakePeer(30, false);
  ASSERT_TRUE(table.BeginAccept("a", "a", 30, "10.0.0.1", nullptr, &replaced).ok());
  EXPECT_EQ(replaced.state, second.state);
  EXPECT_FALSE(table.Find("a", &found)) << "found while its restart is being accepted";
  table.FinishAccept("a", third);
  ASSERT_TRUE(table.Find("a", &found));
  EXPECT_EQ(found.state, third.state);

  ASSERT_TRUE(table.Take("a", &found));
  EXPECT_FALSE(table.Find("a", &found)) << "a peer taken by Disconnect was found";
}

// A hello under the name and incarnation of a peer we dialled at another address (its name a
// wildcard's, say): that peer's own session to us only where the caller vouched for it (found
// that it comes from that engine); a name and an incarnation alone are anyone's to state.
TEST(PeerTable, AHelloWithTheIncarnationOfAPeerWeDialledElsewhereNeedsItsVoucher) {
  PeerTable table;
  table.set_incarnation(1);
  PeerTable::Peer dialled = MakePeer(10, true);
  dialled.state->info.name = "0.0.0.0:5";
  ASSERT_TRUE(table.Claim("127.0.0.1:5", PeerTable::Clock::now() + std::chrono::seconds(1)).ok());
  ASSERT_TRUE(table.InstallClaimed("127.0.0.1:5", dialled));
  PeerTable::Peer found;
  ASSERT_TRUE(table.DialledUnderAnotherKey("0.0.0.0:5", "0.0.0.0:5", 10, &found));
  EXPECT_EQ(found.session, dialled.session);
  EXPECT_FALSE(table.DialledUnderAnotherKey("0.0.0.0:5", "0.0.0.0:6", 10, &found)) << "another name";
  EXPECT_FALSE(table.DialledUnderAnotherKey("0.0.0.0:5", "0.0.0.0:5", 11, &found)) << "another incarnation";
  EXPECT_FALSE(table.DialledUnderAnotherKey("127.0.0.1:5", "0.0.0.0:5", 10, &found)) << "its own key";

  PeerTable::Peer replaced;
  EXPECT_EQ(table.BeginAccept("0.0.0.0:5", "0.0.0.0:5", 10, "127.0.0.1", nullptr, &replaced).code(),
            StatusCode::kInvalidArgument);
  const PeerTable::Peer other = MakePeer(10, true);  // (a session the caller vouched for, not ours)
  EXPECT_EQ(
      table.BeginAccept("0.0.0.0:5", "0.0.0.0:5", 10, "127.0.0.1", other.session.get(), &replaced).code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(
      table.BeginAccept("0.0.0.0:6", "0.0.0.0:6", 10, "127.0.0.1", dialled.session.get(), &replaced).code(),
      StatusCode::kInvalidArgument)
      << "vouched for, under another name";
  ASSERT_TRUE(
      table.BeginAccept("0.0.0.0:5", "0.0.0.0:5", 10, "127.0.0.1", dialled.session.get(), &replaced).ok());
  EXPECT_EQ(replaced.session, nullptr);
  const PeerTable::Peer back = MakePeer(10, false);
  table.FinishAccept("0.0.0.0:5", back);
  ASSERT_TRUE(table.Find("0.0.0.0:5", &found));
  EXPECT_EQ(found.state, back.state);
  ASSERT_TRUE(table.Find("127.0.0.1:5", &found));
  EXPECT_EQ(found.state, dialled.state);
}

// Data connections prove the key of the session they were opened for: AuthKeysOf gives those of
// every live session of the incarnation (a peer we dialled elsewhere that dialled us too has
// two), never an empty one (anyone could prove it).
TEST(PeerTable, TheAuthKeysOfAnIncarnationAreThoseOfEachOfItsLiveSessions) {
  PeerTable table;
  table.set_incarnation(1);
  PeerTable::Peer dialled = MakePeer(10, true);
  dialled.state->info.name = "0.0.0.0:5";
  dialled.state->auth_key = "ours";
  ASSERT_TRUE(table.Claim("127.0.0.1:5", PeerTable::Clock::now() + std::chrono::seconds(1)).ok());
  ASSERT_TRUE(table.InstallClaimed("127.0.0.1:5", dialled));
  PeerTable::Peer replaced;
  ASSERT_TRUE(
      table.BeginAccept("0.0.0.0:5", "0.0.0.0:5", 10, "127.0.0.1", dialled.session.get(), &replaced).ok());
  PeerTable::Peer its_own = MakePeer(10, false);
  its_own.state->auth_key = "its own";
  table.FinishAccept("0.0.0.0:5", its_own);
  ASSERT_TRUE(table.BeginAccept("127.0.0.1:6", "127.0.0.1:6", 20, "127.0.0.1", nullptr, &replaced).ok());
  table.FinishAccept("127.0.0.1:6", MakePeer(20, false));  // (no key)

  using Keys = std::vector<std::string>;
  EXPECT_EQ(table.AuthKeysOf(10), (Keys{"its own", "ours"}));  // (in key order)
  EXPECT_EQ(table.AuthKeysOf(20), Keys{});
  EXPECT_EQ(table.AuthKeysOf(30), Keys{});
  dialled.state->alive.store(false);  // (its session ended)
  EXPECT_EQ(table.AuthKeysOf(10), Keys{"its own"});
}

TEST(PeerTable, APeerThatWentAwayIsNotKeptAliveByAThreadThatFoundIt) {
  PeerTable table;
  const auto deadline = PeerTable::Clock::now() + std::chrono::seconds(1);
  std::weak_ptr<PeerState> gone;
  {
    PeerTable::Peer p = MakePeer(10, true);
    gone = p.state;
    ASSERT_TRUE(table.Claim("a", deadline).ok());
    ASSERT_TRUE(table.InstallClaimed("a", p));
    PeerTable::Peer found;
    ASSERT_TRUE(table.Find("a", &found));
    PeerTable::Peer taken;
    ASSERT_TRUE(table.Take("a", &taken));
  }
  EXPECT_TRUE(gone.expired());
}

TEST(PeerTable, FindFromADestructorAfterTheThreadsCacheIsGone) {
  // A thread_local destroyed after Find's own (constructed before it) may still call Find: it
  // takes the lock then (ASan saw the destroyed cache used before).
  PeerTable table;
  const PeerTable::Peer p = MakePeer(10, true);
  ASSERT_TRUE(table.Claim("a", PeerTable::Clock::now() + std::chrono::seconds(1)).ok());
  ASSERT_TRUE(table.InstallClaimed("a", p));
  std::atomic<int> found_at_exit{0};
  std::thread([&] {
    struct AtExit {
      PeerTable* table;
      std::atomic<int>* found;
      ~AtExit() {
        PeerTable::Peer f;
        if (table->Find("a", &f) && f.state != nullptr) ++*found;
      }
    };
    thread_local AtExit at_exit{&table, &found_at_exit};
    (void)at_exit;
    PeerTable::Peer f;
    EXPECT_TRUE(table.Find("a", &f));
  }).join();
  EXPECT_EQ(found_at_exit.load(), 1);
}

}  // namespace
}  // namespace xfer
