// Metrics (Engine::GetMetrics, EngineOptions::metrics_listen) against a real peer process:
// the counts move by exactly what was transferred, failures are counted by status, the
// endpoint serves the Prometheus text format, and scrapers that stall block nothing.
#include <sys/socket.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>

#include "test_common.h"
#include "util/net.h"

#ifdef XFER_TEST_HTTPLIB
#include <httplib.h>
#endif

namespace xfer_test {
namespace {

using namespace std::chrono_literals;

xfer::MetricsSnapshot Snapshot(xfer::Engine& e) {
  xfer::MetricsSnapshot s;
  XT_EXPECT_OK(e.GetMetrics(&s));
  return s;
}

// ---------------------------------------------------------------- counts per backend
struct Setup {
  std::string name;
  std::string forced;       // EngineOptions::transport
  bool shm_region = false;  // the peer's memory from AllocMem (same host: "shm")
  std::string backend;      // the backend label the bytes must carry
};
void PrintTo(const Setup& s, std::ostream* os) { *os << s.name; }

class MetricsOver : public PeerFixture, public ::testing::WithParamInterface<Setup> {
 protected:
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o;
    o.transport = GetParam().forced;
    return o;
  }
  PeerRegion Region(uint64_t len) { return GetParam().shm_region ? peer_.ShmAlloc(len) : peer_.Alloc(len); }
};

TEST_P(MetricsOver, CountBytesRequestsAndDurationsOfEveryTransfer) {
  constexpr uint64_t kBlock = 16 << 10, kWrites = 200, kReads = 50, kBatch = 64;
  const PeerRegion r = Region(kBatch * kBlock);
  LocalBuffer buf(kBatch * kBlock);
  buf.Fill(7);
  for (uint64_t i = 0; i < kWrites; ++i) XT_ASSERT_OK(Write({{buf.addr(), r.addr, kBlock}}));
  std::vector<TransferDesc> batch;
  for (uint64_t i = 0; i < kBatch; ++i)
    batch.push_back({buf.addr() + i * kBlock, r.addr + i * kBlock, kBlock});
  for (uint64_t i = 0; i < kReads; ++i) XT_ASSERT_OK(Read(batch));

  const auto m = Snapshot(engine_);
  const std::string& b = GetParam().backend;
  const std::string& peer = peer_.name();
  EXPECT_EQ(m.Sum("xfer_transferred_bytes_total", {{"op", "write"}, {"backend", b}, {"peer", peer}}),
            kWrites * kBlock);
  EXPECT_EQ(m.Sum("xfer_transferred_bytes_total", {{"op", "read"}, {"backend", b}, {"peer", peer}}),
            kReads * kBatch * kBlock);
  EXPECT_EQ(m.Sum("xfer_transferred_bytes_total"), (kWrites + kReads * kBatch) * kBlock)
      << "bytes counted under another backend or peer";
  EXPECT_EQ(m.Sum("xfer_requests_total", {{"op", "write"}, {"status", "ok"}, {"peer", peer}}), kWrites);
  EXPECT_EQ(m.Sum("xfer_requests_total", {{"op", "read"}, {"status", "ok"}, {"backend", b}}), kReads);
  EXPECT_EQ(m.Sum("xfer_requests_total"), kWrites + kReads);
  // Every read went through the engine's threads and is timed; writes copied on the caller
  // (shm) are timed one in 64, each standing for 64.
  const double reads_timed = m.Sum("xfer_request_duration_seconds", {{"op", "read"}, {"backend", b}});
  EXPECT_EQ(reads_timed, kReads);
  const double writes_timed = m.Sum("xfer_request_duration_seconds", {{"op", "write"}, {"backend", b}});
  EXPECT_NEAR(writes_timed, kWrites, 63.0);
  const xfer::Metric* duration = m.Find("xfer_request_duration_seconds");
  ASSERT_NE(duration, nullptr);
  for (const auto& s : duration->samples) {
    ASSERT_FALSE(s.buckets.empty());
    EXPECT_TRUE(std::isinf(s.buckets.back().first));
    EXPECT_EQ(s.buckets.back().second, s.value);
    EXPECT_GT(s.sum, 0.0);
    EXPECT_LT(s.sum / s.value, 1.0) << "a 16 KiB..1 MiB request took a second on average";
  }
  EXPECT_EQ(m.Sum("xfer_request_descriptors", {{"op", "read"}}), kReads);
  const xfer::Metric* descs = m.Find("xfer_request_descriptors");
  ASSERT_NE(descs, nullptr);
  for (const auto& s : descs->samples) {
    if (s.Label("op") == "read") {
      EXPECT_EQ(s.sum, kReads * kBatch);
    }
  }
  EXPECT_EQ(m.Sum("xfer_requests_in_flight"), 0);
  EXPECT_EQ(m.Sum("xfer_request_bytes_in_flight"), 0);
  EXPECT_EQ(m.Sum("xfer_sessions"), 1);
  EXPECT_EQ(m.Sum("xfer_sessions_opened_total"), 1);
}

INSTANTIATE_TEST_SUITE_P(Backends, MetricsOver,
                         ::testing::Values(Setup{"tcp", "tcp", false, "tcp"}, Setup{"cma", "", false, "cma"},
                                           Setup{"shm", "", true, "shm"}),
                         [](const auto& info) { return info.param.name; });

// ---------------------------------------------------------------- failures, sessions, events
class Metrics : public PeerFixture {
 protected:
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o;
    o.heartbeat_interval = 100ms;
    o.heartbeat_timeout = 3000ms;  // (late: 1.5 s silent; the peer beats every 500 ms)
    return o;
  }
};

TEST_F(Metrics, FailuresAreCountedByStatus) {
  const PeerRegion r = peer_.Alloc(64 << 20);
  LocalBuffer buf(64 << 20);
  // Refused before it starts: past the end of the peer's region.
  XT_EXPECT_CODE(Write({{buf.addr(), r.addr + 4096, 64 << 20}}), StatusCode::kRemoteAccessDenied);
  // Ended by its deadline: 64 MiB in 16 descriptors with a 1 ms timeout.
  std::vector<TransferDesc> many(64, TransferDesc{buf.addr(), r.addr, 64 << 20});
  xfer::RequestStatus st;
  (void)engine_.TransferSync(peer_.name(), Op::kWrite, many, 1ms, {}, &st);
  ASSERT_EQ(st.state, RequestState::kTimeout) << "64 x 64 MiB moved within 1 ms?";
  // Canceled.
  xfer::RequestHandle h = 0;
  XT_ASSERT_OK(engine_.TransferAsync(peer_.name(), Op::kRead, many, 60s, &h));
  XT_ASSERT_OK(engine_.Cancel(h));
  const Outcome o = WaitFor(engine_, h, 30s);

  const auto m = Snapshot(engine_);
  EXPECT_EQ(m.Sum("xfer_requests_refused_total", {{"op", "write"}, {"status", "remote_access_denied"}}), 1);
  EXPECT_EQ(m.Sum("xfer_requests_total", {{"op", "write"}, {"status", "timeout"}, {"peer", peer_.name()}}),
            1);
  if (o.status.state == RequestState::kCanceled) {
    EXPECT_EQ(m.Sum("xfer_requests_total", {{"op", "read"}, {"status", "canceled"}}), 1);
  }
  EXPECT_EQ(m.Sum("xfer_requests_total", {{"status", "ok"}}),
            o.status.state == RequestState::kCompleted ? 1 : 0);
  EXPECT_EQ(m.Sum("xfer_requests_in_flight"), 0);
}

TEST_F(Metrics, SessionsReconnectsHeartbeatsAndDeadPeers) {
  XT_ASSERT_OK(engine_.Disconnect(peer_.name()));
  XT_ASSERT_OK(engine_.Connect(peer_.name(), 10s));
  auto m = Snapshot(engine_);
  EXPECT_EQ(m.Sum("xfer_sessions_opened_total"), 2);
  EXPECT_EQ(m.Sum("xfer_reconnects_total"), 1);
  EXPECT_EQ(m.Sum("xfer_peers_declared_dead_total"), 0);
  EXPECT_EQ(m.Sum("xfer_heartbeats_missed_total"), 0) << "a live peer (heartbeats every 500 ms) counted late";
  // A frozen peer misses heartbeats, then is declared dead.
  peer_.Signal(SIGSTOP);
  EXPECT_TRUE(PollUntil([&] { return Snapshot(engine_).Sum("xfer_peers_declared_dead_total") == 1; }, 10s));
  peer_.Signal(SIGCONT);
  m = Snapshot(engine_);
  EXPECT_EQ(m.Sum("xfer_heartbeats_missed_total"), 1);  // (late once, then dead)
  EXPECT_EQ(m.Sum("xfer_sessions"), 0);
}

TEST_F(Metrics, NotificationsSentReceivedAndQueued) {
  XT_ASSERT_OK(engine_.SendNotify(peer_.name(), "one", 10s));
  const PeerRegion r = peer_.Alloc(4096);
  LocalBuffer buf(4096);
  xfer::TransferOptions with;
  with.notify = "two";
  XT_ASSERT_OK(engine_.TransferSync(peer_.name(), Op::kWrite, {{buf.addr(), r.addr, 4096}}, 10s, with));
  EXPECT_EQ(Snapshot(engine_).Sum("xfer_notifications_sent_total"), 2);
  // (Through this engine's ring, on one host: queued there, and received once taken.)
  EXPECT_EQ(peer_.Call("metric xfer_notifications_queued").u64(0), 2u);
  EXPECT_EQ(peer_.Call("metric xfer_notifications_queued_bytes").u64(0), 6u);
  ASSERT_TRUE(peer_.Call("notifies").ok);
  EXPECT_EQ(peer_.Call("metric xfer_notifications_received_total").u64(0), 2u);
  EXPECT_EQ(peer_.Call("metric xfer_notifications_queued").u64(0), 0u);
  // The peer's view of the same bytes: nothing it moved itself.
  EXPECT_EQ(peer_.Call("metric xfer_transferred_bytes_total").u64(0), 0u);
  EXPECT_EQ(peer_.Call("metric xfer_registered_bytes type=host").u64(0), 4096u);
}

TEST(MetricsOptions, PeersPastTheCapAreOtherAndCountingCanBeOff) {
  PeerProcess peer;
  std::string err;
  ASSERT_TRUE(peer.Start({}, &err)) << err;
  const PeerRegion r = peer.Alloc(4096);
  LocalBuffer buf(4096);
  for (bool counting : {true, false}) {
    SCOPED_TRACE(counting);
    xfer::Engine e;
    xfer::EngineOptions o;
    o.metrics_max_peers = 1;  // taken by the engine itself
    o.metrics = counting;
    XT_ASSERT_OK(e.Initialize("127.0.0.1:0", o));
    XT_ASSERT_OK(e.Connect(peer.name(), 10s));
    XT_ASSERT_OK(e.TransferSync(peer.name(), Op::kWrite, {{buf.addr(), r.addr, 4096}}, 10s));
    const auto m = Snapshot(e);
    EXPECT_EQ(m.Sum("xfer_transferred_bytes_total", {{"peer", "other"}}), counting ? 4096 : 0);
    EXPECT_EQ(m.Sum("xfer_transferred_bytes_total", {{"peer", peer.name()}}), 0);
    EXPECT_EQ(m.Sum("xfer_sessions_opened_total"), 1);  // (counted either way)
  }
}

TEST(MetricsOptions, BadValuesAreRefused) {
  // Values that are not host:port are refused as such in every build; one that parses but
  // cannot be bound only where the build serves metrics (elsewhere: kUnsupported).
#ifdef XFER_TEST_HTTPLIB
  constexpr bool serves = true;
#else
  constexpr bool serves = false;
#endif
  for (const char* listen : {"nonsense", "127.0.0.1", "999.1.1.1:80"}) {
    xfer::Engine e;
    xfer::EngineOptions o;
    o.metrics_listen = listen;
    SCOPED_TRACE(listen);
    const bool unbindable = std::string(listen) == "999.1.1.1:80";
    XT_EXPECT_CODE(e.Initialize("127.0.0.1:0", o),
                   unbindable && !serves ? StatusCode::kUnsupported : StatusCode::kInvalidArgument);
  }
  xfer::Engine e;
  xfer::EngineOptions o;
  o.metrics_max_peers = 0;
  XT_EXPECT_CODE(e.Initialize("127.0.0.1:0", o), StatusCode::kInvalidArgument);
  xfer::MetricsSnapshot s;
  XT_EXPECT_CODE(e.GetMetrics(&s), StatusCode::kInvalidArgument);
}

#ifdef XFER_TEST_HTTPLIB
// ---------------------------------------------------------------- the HTTP endpoint
class MetricsEndpoint : public PeerFixture {
 protected:
  xfer::EngineOptions LocalOptions() override {
    xfer::EngineOptions o;
    o.metrics_listen = "127.0.0.1:0";
    return o;
  }
  // The value of an unlabelled sample, or of the sum of a labelled metric's samples, as the
  // endpoint serves it.
  static double Scraped(const std::string& body, const std::string& name) {
    double sum = 0;
    std::istringstream in(body);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind(name, 0) != 0) continue;
      const char next = line.size() > name.size() ? line[name.size()] : '\0';
      if (next != ' ' && next != '{') continue;
      sum += std::stod(line.substr(line.rfind(' ') + 1));
    }
    return sum;
  }
  std::string Scrape() {
    httplib::Client c(engine_.MetricsAddress());
    auto res = c.Get("/metrics");
    if (!res) {
      ADD_FAILURE() << "no answer from " << engine_.MetricsAddress();
      return "";
    }
    EXPECT_EQ(res->status, 200);
    EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
    return res->body;
  }
};

TEST_F(MetricsEndpoint, ScrapesFollowTheBytesDuringAndAfterTransfers) {
  ASSERT_FALSE(engine_.MetricsAddress().empty());
  constexpr uint64_t kBlock = 1 << 20;
  const PeerRegion r = peer_.Alloc(kBlock);
  LocalBuffer buf(kBlock);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> written{0};
  std::thread writer([&] {
    for (int i = 0; i < 20000 && !stop.load(); ++i) {
      if (!Write({{buf.addr(), r.addr, kBlock}}).ok()) break;
      written += kBlock;
    }
  });
  double last = 0;
  int rose = 0;
  for (int i = 0; i < 10; ++i) {
    std::this_thread::sleep_for(50ms);
    const double now = Scraped(Scrape(), "xfer_transferred_bytes_total");
    EXPECT_GE(now, last) << "a counter went down";
    rose += now > last ? 1 : 0;
    last = now;
  }
  stop = true;
  writer.join();
  EXPECT_GE(rose, 3) << "the byte counter did not move while bytes did";
  const std::string body = Scrape();
  EXPECT_EQ(Scraped(body, "xfer_transferred_bytes_total"), written.load());
  EXPECT_EQ(Scraped(body, "xfer_transferred_bytes_total"),
            Snapshot(engine_).Sum("xfer_transferred_bytes_total"));
  EXPECT_NE(body.find("# TYPE xfer_request_duration_seconds histogram"), std::string::npos);
  EXPECT_NE(body.find("xfer_request_duration_seconds_bucket{op=\"write\",backend=\"cma\",le=\"+Inf\"}"),
            std::string::npos)
      << body;
  httplib::Client c(engine_.MetricsAddress());
  auto other = c.Get("/nothing-here");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
}

// Connections that send half a request, or ask and never read, hold the server's threads
// for a second at most: transfers go on meanwhile, and Finalize does not wait on them.
TEST_F(MetricsEndpoint, StalledScrapersBlockNeitherTransfersNorFinalize) {
  namespace net = xfer::net;
  net::Address at;
  XT_ASSERT_OK(net::ParseAddress(engine_.MetricsAddress(), &at));
  std::vector<net::Fd> stalled;
  for (int i = 0; i < 8; ++i) {
    net::Fd fd;
    XT_ASSERT_OK(net::ConnectTcp(at, Clock::now() + 5s, &fd));
    int tiny = 1024;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUF, &tiny, sizeof(tiny));
    const std::string half = i % 2 ? "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" : "GET /met";
    ASSERT_EQ(::send(fd.get(), half.data(), half.size(), MSG_NOSIGNAL), static_cast<ssize_t>(half.size()));
    stalled.push_back(std::move(fd));
  }
  // And one that trickles a request a byte every 300 ms: each read is within httplib's
  // timeout, so it holds its worker as long as it goes on.
  std::atomic<bool> stop{false};
  net::Fd trickle;
  XT_ASSERT_OK(net::ConnectTcp(at, Clock::now() + 5s, &trickle));
  std::thread trickler([&] {
    const std::string req = "GET /metrics HTTP/1.1\r\nX-Slow: " + std::string(100, 'x');
    for (size_t i = 0; i < req.size() && !stop.load(); ++i) {
      if (::send(trickle.get(), &req[i], 1, MSG_NOSIGNAL) != 1) break;
      for (int k = 0; k < 30 && !stop.load(); ++k) std::this_thread::sleep_for(10ms);
    }
  });
  const PeerRegion r = peer_.Alloc(1 << 20);
  LocalBuffer buf(1 << 20);
  const auto t0 = Clock::now();
  for (int i = 0; i < 200; ++i) XT_ASSERT_OK(Write({{buf.addr(), r.addr, 1 << 20}}, 5s));
  EXPECT_LT(SecondsSince(t0), 10.0);
  EXPECT_EQ(Snapshot(engine_).Sum("xfer_requests_total"), 200);
  std::this_thread::sleep_for(1s);  // (the trickler's request is well under way)
  const auto t1 = Clock::now();
  engine_.Finalize();
  EXPECT_LT(SecondsSince(t1), 4.0) << "Finalize waited on the stalled scrapers";
  stop = true;
  trickler.join();
}

// The open file descriptors of this process.
int OpenFds() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) n += e.is_symlink() ? 1 : 0;
  return n;
}

// Scrapers that connect and say nothing: the endpoint holds a few of their connections (two
// served, four waiting, one on the listen thread), the kernel's backlog the rest, and the
// engine's descriptors stay for the engine (before, every connection was accepted and queued,
// a descriptor each: slow scrapers could exhaust them, and then sessions and AllocMem failed).
TEST_F(MetricsEndpoint, SilentScrapersHoldFewOfTheEnginesDescriptors) {
  namespace net = xfer::net;
  net::Address at;
  XT_ASSERT_OK(net::ParseAddress(engine_.MetricsAddress(), &at));
  const int before = OpenFds();
  constexpr int kScrapers = 12;  // (7 held at most, 5 in httplib's listen backlog)
  std::vector<net::Fd> silent;
  for (int i = 0; i < kScrapers; ++i) {
    net::Fd fd;
    XT_ASSERT_OK(net::ConnectTcp(at, Clock::now() + 5s, &fd));  // (the backlog completes it)
    silent.push_back(std::move(fd));
  }
  std::this_thread::sleep_for(300ms);  // (the server accepts what it will)
  const int held = OpenFds() - before - kScrapers;
  EXPECT_LE(held, 8) << "the metrics server accepted and queued the silent scrapers' connections";
  // The engine meanwhile: memory and transfers.
  xfer::MemHandle h = 0;
  void* p = nullptr;
  XT_EXPECT_OK(engine_.AllocMem(1 << 20, xfer::MemType::kHost, &p, &h));
  const PeerRegion r = peer_.Alloc(1 << 20);
  LocalBuffer buf(1 << 20);
  XT_EXPECT_OK(Write({{buf.addr(), r.addr, 1 << 20}}, 5s));
  silent.clear();
  // Once they are gone the endpoint answers again (each held worker waits out its read timeout).
  const auto t0 = Clock::now();
  EXPECT_TRUE(PollUntil(
      [&] {
        httplib::Client c(engine_.MetricsAddress());
        c.set_connection_timeout(1, 0);
        c.set_read_timeout(1, 0);
        auto res = c.Get("/metrics");
        return res && res->status == 200;
      },
      15s));
  EXPECT_LT(SecondsSince(t0), 5.0);
  XT_EXPECT_OK(engine_.FreeMem(h));
}

TEST(MetricsEndpointPort, InUseIsRefused) {
  xfer::Engine first, second;
  xfer::EngineOptions o;
  o.metrics_listen = "127.0.0.1:0";
  XT_ASSERT_OK(first.Initialize("127.0.0.1:0", o));
  o.metrics_listen = first.MetricsAddress();
  const xfer::Status s = second.Initialize("127.0.0.1:0", o);
  XT_EXPECT_CODE(s, StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("metrics_listen"), std::string::npos) << s.ToString();
}
#endif  // XFER_TEST_HTTPLIB

}  // namespace
}  // namespace xfer_test
