// Cluster metadata in an HTTP metadata server (EngineOptions::metadata "http://host:port/path"):
// a real HTTP server here, speaking the protocol of Mooncake's mooncake_http_metadata_server
// (GET, PUT and DELETE of /metadata?key=KEY), and real engines that publish, find each other
// by name, transfer, and withdraw. Skips where the build has no libcurl or no cpp-httplib.
#ifdef XFER_TEST_HTTPLIB
#include <httplib.h>

#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "test_common.h"

namespace xfer_test {
namespace {

using namespace std::chrono_literals;

// The protocol's server: a key-value store in memory, as Mooncake's is. Answers can be
// replaced to play a broken or hostile server.
class MetadataServer {
 public:
  // port 0: any free one.
  explicit MetadataServer(int port = 0) {
    server_.Get("/metadata", [this](const httplib::Request& rq, httplib::Response& rs) {
      std::lock_guard lock(mu_);
      if (!override_body_.empty()) return rs.set_content(override_body_, "application/json");
      auto it = store_.find(rq.get_param_value("key"));
      if (it == store_.end()) {
        rs.status = 404;
        return rs.set_content("metadata not found", "application/json");
      }
      rs.set_content(it->second, "application/json");
    });
    server_.Put("/metadata", [this](const httplib::Request& rq, httplib::Response& rs) {
      std::lock_guard lock(mu_);
      ++puts_;
      if (refuse_puts_) {
        rs.status = 500;
        return rs.set_content("full", "application/json");
      }
      store_[rq.get_param_value("key")] = rq.body;
      rs.set_content("metadata updated", "application/json");
    });
    server_.Delete("/metadata", [this](const httplib::Request& rq, httplib::Response& rs) {
      std::lock_guard lock(mu_);
      rs.status = store_.erase(rq.get_param_value("key")) ? 200 : 404;
    });
    server_.set_keep_alive_timeout(1);  // (stop waits for idle connections that long)
    port_ = port == 0 ? server_.bind_to_any_port("127.0.0.1")
                      : (server_.bind_to_port("127.0.0.1", port) ? port : -1);
    thread_ = std::thread([this] { server_.listen_after_bind(); });  // (bound: connects queue until then)
  }
  ~MetadataServer() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/metadata"; }
  std::optional<std::string> Get(const std::string& key) {
    std::lock_guard lock(mu_);
    auto it = store_.find(key);
    return it == store_.end() ? std::nullopt : std::optional(it->second);
  }
  void Set(const std::string& key, const std::string& value) {
    std::lock_guard lock(mu_);
    store_[key] = value;
  }
  void Clear() {  // (as a restart of Mooncake's server loses everything)
    std::lock_guard lock(mu_);
    store_.clear();
  }
  void RefusePuts() {
    std::lock_guard lock(mu_);
    refuse_puts_ = true;
  }
  void AnswerEveryGetWith(std::string body) {
    std::lock_guard lock(mu_);
    override_body_ = std::move(body);
  }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::map<std::string, std::string> store_;  // (mu_)
  int puts_ = 0;                              // (mu_)
  bool refuse_puts_ = false;                  // (mu_)
  std::string override_body_;                 // (mu_)
};

class HttpMetadataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    xfer::Engine probe;
    xfer::EngineOptions o;
    o.metadata = "http://127.0.0.1:1/metadata";
    if (probe.Initialize("127.0.0.1", o).code() == StatusCode::kUnsupported) {
      GTEST_SKIP() << "this build has no cluster metadata (libcurl)";
    }
  }
  xfer::EngineOptions Named(const std::string& name) {
    xfer::EngineOptions o;
    o.metadata = server_.url();
    o.cluster_name = name;
    o.heartbeat_interval = 200ms;
    o.heartbeat_timeout = 1500ms;  // (a ttl of 2 s: the entry is renewed every 667 ms)
    return o;
  }
  static std::string Key(const std::string& name) { return "xfer/engines/" + name; }

  MetadataServer server_;
};

TEST_F(HttpMetadataTest, EnginesFindEachOtherByNameTransferAndWithdraw) {
  PeerProcess prefill;
  std::string err;
  PeerOptions p;
  p.extra_args = {"--metadata", server_.url(), "--cluster-name", "prefill-0"};
  ASSERT_TRUE(prefill.Start(p, &err)) << err;
  const PeerRegion kv = prefill.Alloc(1 << 20, "kv");
  prefill.Fill(kv, 7);

  xfer::Engine decode;
  XT_ASSERT_OK(decode.Initialize("127.0.0.1:0", Named("decode-0")));
  XT_ASSERT_OK(decode.Connect("prefill-0", 10s));
  LocalBuffer into(1 << 20);
  XT_ASSERT_OK(decode.TransferSync("prefill-0", Op::kRead, {{into.addr(), kv.addr, kv.len}}, 10s));
  EXPECT_EQ(into.Hash(), prefill.Sum(kv));

  // The entries, under the protocol's keys; and the tag of prefill's region once published.
  const auto mine = server_.Get(Key("decode-0"));
  ASSERT_TRUE(mine.has_value());
  EXPECT_NE(mine->find(decode.LocalName()), std::string::npos) << *mine;
  EXPECT_TRUE(PollUntil(
      [&] { return server_.Get(Key("prefill-0")).value_or("").find("\"kv\"") != std::string::npos; }, 5s));

  // The protocol cannot list: ListPeers says so.
  std::vector<xfer::ClusterPeer> peers;
  const xfer::Status list = decode.ListPeers(&peers);
  EXPECT_EQ(list.code(), StatusCode::kUnsupported) << list.ToString();
  EXPECT_NE(list.message().find("cannot list"), std::string::npos) << list.message();

  // A clean Finalize deletes the entry; Connect by a name nobody has fails clearly.
  decode.Finalize();
  EXPECT_FALSE(server_.Get(Key("decode-0")).has_value());
  xfer::Engine other;
  XT_ASSERT_OK(other.Initialize("127.0.0.1:0", Named("other")));
  const xfer::Status gone = other.Connect("decode-0", 2s);
  EXPECT_EQ(gone.code(), StatusCode::kNotConnected) << gone.ToString();
  EXPECT_NE(gone.message().find("no engine named 'decode-0'"), std::string::npos) << gone.message();
}

TEST_F(HttpMetadataTest, AServerThatLostItsStoreGetsTheEntryBack) {
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0", Named("e")));
  ASSERT_TRUE(server_.Get(Key("e")).has_value());
  server_.Clear();
  EXPECT_TRUE(PollUntil([&] { return server_.Get(Key("e")).has_value(); }, 3s))
      << "the entry was not put again after the server lost it";
}

// Two live engines with one name: the later one keeps it (the earlier one stops putting its
// entry back, over several renewals), and the earlier one's Finalize leaves it.
TEST_F(HttpMetadataTest, ANameTakenByALaterEngineStaysItsThroughRenewalsAndFinalize) {
  xfer::Engine first;
  XT_ASSERT_OK(first.Initialize("127.0.0.1:0", Named("shared")));
  xfer::Engine second;
  XT_ASSERT_OK(second.Initialize("127.0.0.1:0", Named("shared")));
  auto holder = [&] {
    const std::string entry = server_.Get(Key("shared")).value_or("");
    return entry.find(second.LocalName()) != std::string::npos  ? "second"
           : entry.find(first.LocalName()) != std::string::npos ? "first"
                                                                : "nobody";
  };
  const auto until = Clock::now() + 2500ms;  // (three renewals and more)
  while (Clock::now() < until) {
    ASSERT_STREQ(holder(), "second") << "the earlier engine took the name back";
    std::this_thread::sleep_for(20ms);
  }
  first.Finalize();
  EXPECT_STREQ(holder(), "second") << "the earlier engine's Finalize deleted the later one's entry";
}

// An engine started while the server is down (start_without_metadata) publishes once it is up.
TEST_F(HttpMetadataTest, AnEngineThatStartedWithoutTheServerPublishesOnceItIsUp) {
  const int port = UnusedPort();
  xfer::EngineOptions o = Named("early");
  o.metadata = "http://127.0.0.1:" + std::to_string(port) + "/metadata";
  o.start_without_metadata = true;
  xfer::Engine early;
  XT_ASSERT_OK(early.Initialize("127.0.0.1:0", o));
  MetadataServer late(port);
  ASSERT_EQ(late.url(), o.metadata);
  EXPECT_TRUE(PollUntil([&] { return late.Get(Key("early")).has_value(); }, 5s))
      << "the entry did not appear once the server was up";
}

TEST_F(HttpMetadataTest, BadUrlsServersAndEntriesGetClearErrors) {
  auto init = [](const std::string& url, const std::string& name = "x") {
    xfer::Engine e;
    xfer::EngineOptions o;
    o.metadata = url;
    o.cluster_name = name;
    return e.Initialize("127.0.0.1:0", o);
  };
  XT_EXPECT_CODE(init(server_.url() + "?key=a"), StatusCode::kInvalidArgument);  // the key goes there
  XT_EXPECT_CODE(init(server_.url() + "?"), StatusCode::kInvalidArgument);
  XT_EXPECT_CODE(init(server_.url() + "#x"), StatusCode::kInvalidArgument);      // (it would hide the key)
  XT_EXPECT_CODE(init("http://a host/metadata"), StatusCode::kInvalidArgument);  // not a URL
  const xfer::Status unreachable = init("http://127.0.0.1:" + std::to_string(UnusedPort()) + "/metadata");
  EXPECT_EQ(unreachable.code(), StatusCode::kNotConnected) << unreachable.ToString();
  EXPECT_NE(unreachable.message().find("unreachable"), std::string::npos) << unreachable.message();

  // An entry that is not an engine's, and a server whose answers never end: clear errors.
  server_.Set(Key("junk"), "{\"not\": \"an entry\"}");
  server_.Set(Key("alias"), "{\"name\":\"other\",\"address\":\"127.0.0.1:1\",\"incarnation\":1}");
  xfer::Engine e;
  XT_ASSERT_OK(e.Initialize("127.0.0.1:0", Named("e")));
  const xfer::Status junk = e.Connect("junk", 2s);
  EXPECT_EQ(junk.code(), StatusCode::kInternal) << junk.ToString();
  EXPECT_NE(junk.message().find("not an xfer engine's"), std::string::npos) << junk.message();
  const xfer::Status alias = e.Connect("alias", 2s);  // (an entry of another name)
  EXPECT_EQ(alias.code(), StatusCode::kInternal) << alias.ToString();
  server_.AnswerEveryGetWith(std::string(8 << 20, 'x'));
  const xfer::Status huge = e.Connect("anyone", 2s);
  EXPECT_EQ(huge.code(), StatusCode::kResourceExhausted) << huge.ToString();

  // A server that refuses the entry: Initialize fails saying so, unless told to start anyway.
  server_.RefusePuts();
  const xfer::Status refused = init(server_.url(), "y");
  EXPECT_EQ(refused.code(), StatusCode::kInternal) << refused.ToString();
  EXPECT_NE(refused.message().find("refused the entry (HTTP 500"), std::string::npos) << refused.message();
  xfer::Engine anyway;
  xfer::EngineOptions o = Named("y");
  o.start_without_metadata = true;
  XT_EXPECT_OK(anyway.Initialize("127.0.0.1:0", o));
}

}  // namespace
}  // namespace xfer_test
#endif  // XFER_TEST_HTTPLIB
