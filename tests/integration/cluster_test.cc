// Cluster metadata with a real etcd (tests/integration/etcd_server.h): engines publish their
// cluster names under leases, find each other by name, and keep transferring while etcd is
// away. Skips where etcd is not installed or the build has no libcurl.
#include <signal.h>

#include <algorithm>

#include "etcd_server.h"
#ifdef XFER_TEST_ETCD
#include "metadata/etcd_client.h"
#endif
#include "test_common.h"

namespace xfer_test {
namespace {

using namespace std::chrono_literals;
using xfer::ClusterPeer;

constexpr auto kHeartbeatTimeout = 2000ms;  // the lease: an entry outlives its engine by ~2 s

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (EtcdServer::Binary().empty()) GTEST_SKIP() << "etcd is not installed (apt-get install etcd-server)";
    xfer::Engine probe;
    xfer::EngineOptions o;
    o.metadata = "etcd://127.0.0.1:1";
    if (probe.Initialize("127.0.0.1", o).code() == StatusCode::kUnsupported) {
      GTEST_SKIP() << "this build has no cluster metadata (libcurl)";
    }
    std::string err;
    ASSERT_TRUE(etcd_.Start(&err)) << err;
  }

  xfer::EngineOptions Named(const std::string& name, const std::string& url = "") {
    xfer::EngineOptions o;
    o.metadata = url.empty() ? etcd_.url("test") : url;
    o.cluster_name = name;
    o.heartbeat_interval = 200ms;
    o.heartbeat_timeout = kHeartbeatTimeout;
    return o;
  }
  PeerOptions PeerNamed(const std::string& name) {
    PeerOptions p;
    p.heartbeat_ms = 200;
    p.heartbeat_timeout_ms = static_cast<int>(kHeartbeatTimeout.count());
    p.extra_args = {"--metadata", etcd_.url("test"), "--cluster-name", name};
    return p;
  }
  // The entry of `name` in engine's ListPeers (nullopt: not listed; the list must succeed).
  static std::optional<ClusterPeer> Entry(xfer::Engine& engine, const std::string& name) {
    std::vector<ClusterPeer> peers;
    const xfer::Status s = engine.ListPeers(&peers);
    EXPECT_TRUE(s.ok()) << s.ToString();
    for (auto& p : peers) {
      if (p.name == name) return p;
    }
    return std::nullopt;
  }
  static uint64_t IncarnationOf(xfer::Engine& engine, const std::string& remote) {
    xfer::PeerInfo info;
    const xfer::Status s = engine.GetPeerInfo(remote, &info);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return info.incarnation;
  }

  EtcdServer etcd_;
};

TEST_F(ClusterTest, EnginesFindEachOtherByNameAndTransfer) {
  PeerProcess prefill;
  std::string err;
  ASSERT_TRUE(prefill.Start(PeerNamed("prefill-0"), &err)) << err;
  const PeerRegion kv = prefill.Alloc(1 << 20, "kv");
  prefill.Fill(kv, 7);

  xfer::Engine decode;
  XT_ASSERT_OK(decode.Initialize("127.0.0.1:0", Named("decode-0")));
  XT_ASSERT_OK(decode.Connect("prefill-0", 10s));
  LocalBuffer into(1 << 20);
  XT_ASSERT_OK(decode.TransferSync("prefill-0", Op::kRead, {{into.addr(), kv.addr, kv.len}}, 10s));
  EXPECT_EQ(into.Hash(), prefill.Sum(kv));
  xfer::PeerInfo info;
  XT_ASSERT_OK(decode.GetPeerInfo("prefill-0", &info));
  EXPECT_EQ(info.name, prefill.name());  // (the session is the address's: one peer, two names)
  XT_EXPECT_CODE(decode.Connect(prefill.name(), 5s), StatusCode::kAlreadyConnected);

  // The list: both engines, with addresses, incarnations, host ids and (once published) tags.
  const auto me = Entry(decode, "decode-0");
  ASSERT_TRUE(me.has_value());
  EXPECT_EQ(me->address, decode.LocalName());
  ASSERT_TRUE(PollUntil(
      [&] {
        auto p = Entry(decode, "prefill-0");
        return p && p->tags == std::vector<std::string>{"kv"};
      },
      5s))
      << "prefill-0's region tag never appeared";
  const auto p = Entry(decode, "prefill-0");
  EXPECT_EQ(p->address, prefill.name());
  EXPECT_EQ(p->incarnation, info.incarnation);
  EXPECT_EQ(p->host_id, info.host_id);

  // The other way: the peer names us, and WRITEs by name.
  LocalBuffer landing(4096);
  xfer::MemHandle h = 0;
  XT_ASSERT_OK(decode.RegisterMem(landing.data(), landing.len(), xfer::MemType::kHost, &h, "landing"));
  const Reply c = prefill.Call("connect decode-0");  // (the session exists: decode connected)
  ASSERT_TRUE(c.ok || c.code() == "ALREADY_CONNECTED") << c.line;
  const Reply w = prefill.Xfer("write", "decode-0", 10000, kv.addr, landing.addr(), 4096);
  ASSERT_TRUE(w.ok) << w.line;
  EXPECT_EQ(landing.Hash(), prefill.SumRange(kv.addr, 4096));

  // A clean Finalize takes the entry out at once (the lease is revoked, not left to run out).
  xfer::Engine observer;
  xfer::EngineOptions o = Named("");
  XT_ASSERT_OK(observer.Initialize("127.0.0.1", o));  // (client-only: looks up, is not listed)
  EXPECT_TRUE(Entry(observer, "decode-0").has_value());
  decode.Finalize();
  // (The observer's list follows a watch: the deletion arrives a moment after; the lease, 2 s,
  // would take longer.)
  EXPECT_TRUE(PollUntil([&] { return !Entry(observer, "decode-0").has_value(); }, 1s));
  EXPECT_TRUE(Entry(observer, "prefill-0").has_value());
}

#ifdef XFER_TEST_ETCD
// An entry rewritten to an address where no engine answers (a rogue with write access to etcd,
// or a stale one): the Connect by that name fails, and transfers by the name still go to the
// engine it was connected to.
TEST_F(ClusterTest, AFailedConnectByNameLeavesTheNameWithItsEngine) {
  PeerProcess prefill;
  std::string err;
  ASSERT_TRUE(prefill.Start(PeerNamed("prefill-0"), &err)) << err;
  const PeerRegion kv = prefill.Alloc(1 << 20, "kv");
  prefill.Fill(kv, 3);
  xfer::Engine decode;
  XT_ASSERT_OK(decode.Initialize("127.0.0.1:0", Named("decode-0")));
  XT_ASSERT_OK(decode.Connect("prefill-0", 10s));

  xfer::metadata::EtcdClient etcd({etcd_.endpoint()}, 2s);
  const std::string dead = "127.0.0.1:1";  // (nothing listens on port 1)
  XT_ASSERT_OK(etcd.Put("/test/engines/prefill-0", R"({"name":"prefill-0","address":")" + dead +
                                                       R"(","incarnation":7,"host_id":"x","tags":[]})"));
  const xfer::Status c = decode.Connect("prefill-0", 3s);
  EXPECT_EQ(c.code(), StatusCode::kConnectionLost) << c.ToString();  // (nothing at the dead address)
  LocalBuffer into(1 << 20);
  XT_EXPECT_OK(decode.TransferSync("prefill-0", Op::kRead, {{into.addr(), kv.addr, kv.len}}, 10s));
  EXPECT_EQ(into.Hash(), prefill.Sum(kv));

  // An entry naming another engine: the Connect reaches it, finds another incarnation than the
  // entry's and says so; connected to it already, "already connected". Either way the name
  // stays with its engine.
  PeerProcess other;
  ASSERT_TRUE(other.Start(PeerOptions{}, &err)) << err;
  XT_ASSERT_OK(etcd.Put("/test/engines/prefill-0", R"({"name":"prefill-0","address":")" + other.name() +
                                                       R"(","incarnation":7,"host_id":"x","tags":[]})"));
  XT_EXPECT_CODE(decode.Connect("prefill-0", 3s), StatusCode::kRemoteAccessDenied);
  XT_EXPECT_CODE(decode.Connect("prefill-0", 3s), StatusCode::kAlreadyConnected);
  xfer::PeerInfo info;
  XT_ASSERT_OK(decode.GetPeerInfo("prefill-0", &info));
  EXPECT_EQ(info.name, prefill.name()) << "the name went to the engine the rogue entry named";
}
#endif

TEST_F(ClusterTest, AKilledEngineLeavesTheListWithinItsLeaseAndItsRestartIsFound) {
  xfer::Engine decode;
  XT_ASSERT_OK(decode.Initialize("127.0.0.1:0", Named("decode-0")));
  PeerProcess prefill;
  std::string err;
  ASSERT_TRUE(prefill.Start(PeerNamed("prefill-0"), &err)) << err;
  XT_ASSERT_OK(decode.Connect("prefill-0", 10s));
  const uint64_t first = IncarnationOf(decode, "prefill-0");

  prefill.KillNow();
  const auto killed = Clock::now();
  ASSERT_TRUE(PollUntil([&] { return !Entry(decode, "prefill-0").has_value(); }, 10s))
      << "a killed engine stayed listed";
  // The lease is the heartbeat timeout (2 s); etcd checks expiries every 500 ms.
  EXPECT_LT(SecondsSince(killed), 4.0);

  PeerProcess again;
  ASSERT_TRUE(again.Start(PeerNamed("prefill-0"), &err)) << err;
  const PeerRegion r = again.Alloc(4096);
  again.Fill(r, 3);
  std::optional<ClusterPeer> entry;
  ASSERT_TRUE(
      PollUntil([&] { return (entry = Entry(decode, "prefill-0")) && entry->incarnation != first; }, 5s));
  EXPECT_EQ(entry->address, again.name());
  // The old session is gone by now or soon; a transfer by name reaches the new engine.
  ASSERT_TRUE(PollUntil(
      [&] {
        xfer::Status s = decode.Connect("prefill-0", 5s);
        return s.ok() || s.code() == StatusCode::kAlreadyConnected;
      },
      10s));
  LocalBuffer into(4096);
  XT_ASSERT_OK(decode.TransferSync("prefill-0", Op::kRead, {{into.addr(), r.addr, 4096}}, 10s));
  EXPECT_EQ(into.Hash(), again.Sum(r));
  EXPECT_EQ(IncarnationOf(decode, "prefill-0"), entry->incarnation);
}

TEST_F(ClusterTest, TransfersGoOnWhileEtcdIsDownAndEnginesPublishAgainWhenItReturns) {
  xfer::Engine decode;
  XT_ASSERT_OK(decode.Initialize("127.0.0.1:0", Named("decode-0")));
  PeerProcess prefill;
  std::string err;
  ASSERT_TRUE(prefill.Start(PeerNamed("prefill-0"), &err)) << err;
  const PeerRegion r = prefill.Alloc(64 << 10);
  prefill.Fill(r, 11);
  XT_ASSERT_OK(decode.Connect("prefill-0", 10s));

  etcd_.Kill();
  // Longer than the lease: the engines' keep-alives fail all along.
  LocalBuffer into(64 << 10);
  const auto until = Clock::now() + kHeartbeatTimeout + 1s;
  int moved = 0;
  while (Clock::now() < until) {
    XT_ASSERT_OK(decode.TransferSync("prefill-0", Op::kRead, {{into.addr(), r.addr, r.len}}, 5s));
    ++moved;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(into.Hash(), prefill.Sum(r));
  EXPECT_GT(moved, 10);
  std::vector<ClusterPeer> peers;
  XT_EXPECT_CODE(decode.ListPeers(&peers), StatusCode::kNotConnected);

  // etcd comes back having lost everything: both engines publish again.
  ASSERT_TRUE(etcd_.Restart(/*fresh=*/true, &err)) << err;
  EXPECT_TRUE(PollUntil(
      [&] {
        std::vector<ClusterPeer> now;
        if (!decode.ListPeers(&now).ok()) return false;
        return std::count_if(now.begin(), now.end(), [](const ClusterPeer& p) {
                 return p.name == "decode-0" || p.name == "prefill-0";
               }) == 2;
      },
      15s))
      << "the engines did not publish again after etcd came back";
  XT_EXPECT_OK(decode.TransferSync("prefill-0", Op::kRead, {{into.addr(), r.addr, r.len}}, 5s));
}

TEST_F(ClusterTest, ListPeersAnswersFromAWatchThatFollowsEveryChange) {
  xfer::Engine decode;
  XT_ASSERT_OK(decode.Initialize("127.0.0.1:0", Named("decode-0")));
  ASSERT_TRUE(Entry(decode, "decode-0").has_value());  // (the first ListPeers starts the watch)
  PeerProcess prefill;
  std::string err;
  ASSERT_TRUE(prefill.Start(PeerNamed("prefill-0"), &err)) << err;
  ASSERT_TRUE(PollUntil([&] { return Entry(decode, "prefill-0").has_value(); }, 5s));
  prefill.Alloc(4096, "kv");  // (its tags change: the watch sees the new entry)
  ASSERT_TRUE(PollUntil(
      [&] {
        auto p = Entry(decode, "prefill-0");
        return p && p->tags == std::vector<std::string>{"kv"};
      },
      5s));

  // etcd hangs: the watch's view still answers, at once; an engine without a watch yet waits
  // for etcd (a second per endpoint) and fails.
  ASSERT_TRUE(etcd_.Freeze());
  const auto t0 = Clock::now();
  EXPECT_TRUE(Entry(decode, "prefill-0").has_value());
  EXPECT_LT(SecondsSince(t0), 0.5);
  xfer::Engine newcomer;
  XT_ASSERT_OK(newcomer.Initialize("127.0.0.1", Named("")));
  std::vector<ClusterPeer> peers;
  XT_EXPECT_CODE(newcomer.ListPeers(&peers), StatusCode::kNotConnected);
  etcd_.Thaw();

  // A killed engine leaves the view when etcd deletes its entry (its lease ran out).
  prefill.KillNow();
  const auto killed = Clock::now();
  ASSERT_TRUE(PollUntil([&] { return !Entry(decode, "prefill-0").has_value(); }, 10s));
  EXPECT_LT(SecondsSince(killed), 4.0);
}

// The frozen etcd above must answer nothing: a stop signal stops etcd's threads one by one,
// and one still running served the newcomer's ListPeers in a loaded parallel run.
TEST_F(ClusterTest, FreezeReturnsOnceEveryThreadOfEtcdHasStopped) {
  for (int round = 0; round < 10; ++round) {
    ASSERT_TRUE(etcd_.Freeze());
    EXPECT_TRUE(EveryThreadStopped(etcd_.pid())) << "round " << round;
    etcd_.Thaw();
  }
}

TEST_F(ClusterTest, OneEndpointOfTwoDownIsPassedOver) {
  const std::string url =
      "etcd://127.0.0.1:" + std::to_string(UnusedPort()) + "," + etcd_.endpoint() + "/test";
  xfer::Engine a, b;
  XT_ASSERT_OK(a.Initialize("127.0.0.1:0", Named("a", url)));
  XT_ASSERT_OK(b.Initialize("127.0.0.1:0", Named("b", url)));
  XT_ASSERT_OK(a.Connect("b", 5s));
  EXPECT_TRUE(Entry(b, "a").has_value());
}

TEST_F(ClusterTest, StartingWithoutEtcdPublishesOnceItAnswers) {
  etcd_.Kill();
  xfer::Engine e;
  const xfer::Status refused = e.Initialize("127.0.0.1:0", Named("early"));
  EXPECT_EQ(refused.code(), StatusCode::kNotConnected) << refused.ToString();
  EXPECT_NE(refused.message().find("start_without_metadata"), std::string::npos) << refused.message();

  xfer::Engine early;
  xfer::EngineOptions o = Named("early");
  o.start_without_metadata = true;
  XT_ASSERT_OK(early.Initialize("127.0.0.1:0", o));
  std::string err;
  ASSERT_TRUE(etcd_.Restart(/*fresh=*/false, &err)) << err;
  EXPECT_TRUE(PollUntil(
      [&] {
        std::vector<ClusterPeer> peers;
        return early.ListPeers(&peers).ok() && peers.size() == 1 && peers[0].address == early.LocalName();
      },
      10s));
}

TEST_F(ClusterTest, BadNamesUrlsAndOptionsGetClearErrors) {
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0", Named("e")));
  const xfer::Status unknown = e.Connect("nobody", 2s);
  EXPECT_EQ(unknown.code(), StatusCode::kNotConnected) << unknown.ToString();
  EXPECT_NE(unknown.message().find("no engine named 'nobody'"), std::string::npos) << unknown.message();
  LocalBuffer buf(64);
  XT_EXPECT_CODE(e.TransferSync("nobody", Op::kRead, {{buf.addr(), 0x1000, 64}}, 2s),
                 StatusCode::kNotConnected);
  // Itself, by its own name.
  XT_EXPECT_OK(e.Connect("e", 2s));
  LocalBuffer src(64);
  src.Fill(5);
  xfer::MemHandle h = 0;
  XT_ASSERT_OK(e.RegisterMem(src.data(), src.len(), xfer::MemType::kHost, &h));
  XT_EXPECT_OK(e.TransferSync("e", Op::kRead, {{buf.addr(), src.addr(), 64}}, 2s));
  EXPECT_EQ(buf.Hash(), src.Hash());

  auto init = [](xfer::EngineOptions o) {
    xfer::Engine x;
    return x.Initialize("127.0.0.1:0", o);
  };
  xfer::EngineOptions o;
  o.cluster_name = "alone";
  XT_EXPECT_CODE(init(o), StatusCode::kInvalidArgument);  // a name needs metadata
  o = Named("a:b");
  XT_EXPECT_CODE(init(o), StatusCode::kInvalidArgument);  // it would read as host:port
  o = Named("x", etcd_.endpoint());
  XT_EXPECT_CODE(init(o), StatusCode::kInvalidArgument);  // no scheme
  o = Named("x", "etcd://127.0.0.1");
  XT_EXPECT_CODE(init(o), StatusCode::kInvalidArgument);  // no port
  o = Named("x", "etcd://127.0.0.1:" + std::to_string(UnusedPort()));
  XT_EXPECT_CODE(init(o), StatusCode::kNotConnected);

  xfer::Engine plain;
  XT_ASSERT_OK(plain.Initialize("127.0.0.1:0"));
  std::vector<ClusterPeer> peers;
  XT_EXPECT_CODE(plain.ListPeers(&peers), StatusCode::kInvalidArgument);
  XT_EXPECT_CODE(plain.Connect("prefill-0", 1s), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace xfer_test
