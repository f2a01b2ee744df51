// EtcdClient: the few calls of etcd's v3 API that cluster metadata needs, over etcd's JSON
// gateway (HTTP POST to /v3/...; keys and values base64 in the JSON), through libcurl. Each
// call tries the endpoints in turn, starting with the one that answered last, and gives up
// after one round; every call is bounded by the client's timeout per endpoint. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
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
  std::string prefix;  // starts with '/', no '/' at the end
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
  Status List(const std::string& prefix, KeyValues* out);  // every key that starts with prefix
  Status Delete(const std::string& key);

  // The endpoint that answered last ("host:port").
  std::string endpoint() const { return endpoints_[current_.load() % endpoints_.size()]; }

 private:
  // POSTs body to path on one endpoint after another, then hands the answer (a JSON object)
  // to read, whose json errors become kInternal. An answer carrying an error (etcd's "error"
  // field) is returned as that error.
  Status Call(const char* path, const nlohmann::json& body,
              const std::function<Status(const nlohmann::json&)>& read = nullptr);

  Status Range(const nlohmann::json& request, KeyValues* out);

  const std::vector<std::string> endpoints_;
  const std::chrono::milliseconds timeout_;
  std::atomic<size_t> current_{0};
};

}  // namespace xfer::metadata
