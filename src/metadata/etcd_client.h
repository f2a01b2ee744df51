// EtcdClient: the few calls of etcd's v3 API that cluster metadata needs, over etcd's JSON
// gateway (HTTP POST to /v3/...; keys and values base64 in the JSON), through libcurl. Each
// call tries the endpoints in turn, starting with the one that answered last, and gives up
// after one round; every call is bounded by the client's timeout per endpoint. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "xfer/status.h"

namespace xfer::metadata {

// "etcd://host:port[,host:port...][/prefix]": the endpoints, and the prefix of every key
// ("/prefix", "/xfer" when none is given). kInvalidArgument, saying what is wrong, for anything else.
struct EtcdUrl {
  std::vector<std::string> endpoints;  // "host:port"
  std::string prefix;                  // starts with '/', no '/' at the end
};
Status ParseEtcdUrl(const std::string& url, EtcdUrl* out);

std::string Base64Encode(const std::string& bytes);
bool Base64Decode(const std::string& text, std::string* bytes);  // false: not base64

class EtcdClient {
 public:
  using KeyValues = std::vector<std::pair<std::string, std::string>>;

  EtcdClient(std::vector<std::string> endpoints, std::chrono::milliseconds timeout);

  // A lease of ttl seconds (etcd may raise a short one to its minimum).
  Status Grant(int64_t ttl_s, int64_t* lease);
  // Renews the lease; *ttl_left is 0 when the lease is gone (expired or revoked).
  Status KeepAlive(int64_t lease, int64_t* ttl_left);
  Status Revoke(int64_t lease);  // deletes the keys attached to it
  Status Put(const std::string& key, const std::string& value, int64_t lease = 0);
  Status Get(const std::string& key, std::string* value, bool* found);
  // Every key that starts with prefix; *revision (when given): etcd's revision at the time.
  Status List(const std::string& prefix, KeyValues* out, int64_t* revision = nullptr);
  Status Delete(const std::string& key);

  // A change under a watched prefix.
  struct WatchEvent {
    bool put = true;  // false: deleted (a lease ran out, a revoke, a delete)
    std::string key, value;
  };
  // Streams every change under prefix from start_revision on to on_event (on this thread),
  // until the stream ends: etcd went away (kNotConnected), canceled it, e.g. because that
  // revision was compacted (kInternal: list again), or StopWatch (kCanceled). One watch at a
  // time per client.
  Status Watch(const std::string& prefix, int64_t start_revision,
               const std::function<void(const WatchEvent&)>& on_event);
  // Ends the watch under way, and every later one, at once (any thread).
  void StopWatch();

  // The endpoint that answered last ("host:port").
  std::string endpoint() const { return endpoints_[current_.load() % endpoints_.size()]; }

 private:
  // POSTs body to path on one endpoint after another, then hands the answer (a JSON object)
  // to read, whose json errors become kInternal. An answer carrying an error (etcd's "error"
  // field) is returned as that error.
  Status Call(const char* path, const nlohmann::json& body,
              const std::function<Status(const nlohmann::json&)>& read = nullptr);

  Status Range(const nlohmann::json& request, KeyValues* out, int64_t* revision = nullptr);

  const std::vector<std::string> endpoints_;
  const std::chrono::milliseconds timeout_;
  std::atomic<size_t> current_{0};

 public:
  struct WatchSockets {  // (the watch's stream: etcd_client.cc)
    std::mutex mu;
    bool stopped = false;  // (mu) StopWatch was called
    std::set<int> open;    // (mu) the watch's sockets, from their opening to their closing
  };

 private:
  bool WatchStopped();
  WatchSockets watch_sockets_;
};

}  // namespace xfer::metadata
