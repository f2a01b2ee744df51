// The HTTP directory: engines' entries in a key-value server that speaks Mooncake's HTTP
// metadata protocol (GET, PUT and DELETE of URL?key=KEY; the value is the body; 404: no such
// key), the protocol of Mooncake's mooncake_http_metadata_server. The entry of engine NAME is
// the key "xfer/engines/NAME". The protocol has no leases and no listing: the entry is put again
// every third of the ttl (a server that restarted has it back within that) and deleted by Stop
// when it is still this engine's; the entry of an engine that died stays until another engine
// takes the name (looking it up gives an address that refuses connections); List is kUnsupported.
#include <curl/curl.h>

#include "metadata/entry.h"
#include "metadata/http_call.h"
#include "metadata/publishing_directory.h"
#include "util/log.h"

namespace xfer::metadata {

using namespace std::chrono_literals;

namespace {

constexpr auto kCallTimeout = 1000ms;
constexpr size_t kMaxEntry = 64 << 10;  // (an entry is a few hundred bytes: more is not an engine's)

// url checked by curl's URL parser: http or https, a host, a path. kInvalidArgument else.
Status CheckHttpUrl(const std::string& url) {
  auto bad = [&](const std::string& why) {
    return Status{StatusCode::kInvalidArgument, "metadata '" + url + "': " + why +
                                                    " (expected http://host:port/path, e.g. Mooncake's " +
                                                    "http://host:8080/metadata)"};
  };
  std::unique_ptr<CURLU, void (*)(CURLU*)> u(curl_url(), curl_url_cleanup);
  if (!u) return {StatusCode::kResourceExhausted, "curl_url failed"};
  if (curl_url_set(u.get(), CURLUPART_URL, url.c_str(), 0) != CURLUE_OK) return bad("not a URL");
  char* query = nullptr;
  if (curl_url_get(u.get(), CURLUPART_QUERY, &query, 0) == CURLUE_OK) {
    curl_free(query);
    return bad("it has a query already (the key goes there)");
  }
  char* host = nullptr;
  if (curl_url_get(u.get(), CURLUPART_HOST, &host, 0) != CURLUE_OK || host == nullptr || *host == '\0') {
    curl_free(host);
    return bad("no host");
  }
  curl_free(host);
  return Status::Ok();
}

}  // namespace

class HttpDirectory final : public PublishingDirectory {
 public:
  explicit HttpDirectory(Options options)
      : PublishingDirectory(options, options.url, "the metadata server") {}
  ~HttpDirectory() override { Stop(); }
  using PublishingDirectory::StartPublishing;
  void Stop() override;
  Status Lookup(const std::string& name, ClusterPeer* peer) override;
  Status List(std::vector<ClusterPeer>* peers) override;

 private:
  static std::string KeyOf(const std::string& name) { return "xfer/engines/" + name; }
  Status Publish() override;
  Status Renew() override { return Publish(); }
  // GET, PUT or DELETE of key; *reply: the server's answer, whatever its status.
  Status Call(const char* method, const std::string& key, const std::string* body, HttpReply* reply);
  Status Get(const std::string& key, std::string* value, bool* found);
};

Status StartHttpDirectory(Directory::Options options, std::unique_ptr<Directory>* out) {
  if (Status s = CheckHttpUrl(options.url); !s.ok()) return s;
  auto d = std::make_unique<HttpDirectory>(std::move(options));
  if (Status s = d->StartPublishing(); !s.ok()) return s;
  *out = std::move(d);
  return Status::Ok();
}

Status HttpDirectory::Call(const char* method, const std::string& key, const std::string* body,
                           HttpReply* reply) {
  HttpRequest request;
  request.method = method;
  request.url = url_ + "?key=" + UrlEscape(key);
  request.body = body;
  request.timeout = kCallTimeout;
  request.max_reply = kMaxEntry;
  Status s = HttpCall(request, reply);
  if (s.code() == StatusCode::kNotConnected) {
    return {s.code(), "the metadata server " + url_ + " is unreachable (" + s.message() + ")"};
  }
  if (!s.ok()) return {s.code(), "the metadata server " + url_ + ": " + s.message()};
  return s;
}

Status HttpDirectory::Get(const std::string& key, std::string* value, bool* found) {
  HttpReply reply;
  if (Status s = Call("GET", key, nullptr, &reply); !s.ok()) return s;
  *found = reply.status == 200;
  if (reply.status != 200 && reply.status != 404) {
    return {StatusCode::kInternal, "the metadata server " + url_ + " answered GET of " + key + " with HTTP " +
                                       std::to_string(reply.status) + ": " + reply.body};
  }
  if (*found) *value = std::move(reply.body);
  return Status::Ok();
}

Status HttpDirectory::Publish() {
  const std::string entry = Entry();
  HttpReply reply;
  if (Status s = Call("PUT", KeyOf(options_.self.name), &entry, &reply); !s.ok()) return s;
  if (reply.status != 200) {
    return {StatusCode::kInternal, "the metadata server " + url_ + " refused the entry (HTTP " +
                                       std::to_string(reply.status) + ": " + reply.body + ")"};
  }
  return Status::Ok();
}

void HttpDirectory::Stop() {
  if (!StopPublishing() || options_.self.name.empty()) return;
  // Deleted only while it is still this engine's: an engine that took the name since keeps it.
  const std::string key = KeyOf(options_.self.name);
  std::string value;
  bool found = false;
  ClusterPeer there;
  Status s = Get(key, &value, &found);
  if (s.ok() && found && ReadEntry(value, &there) && there.incarnation == options_.self.incarnation &&
      there.address == options_.self.address) {
    HttpReply reply;
    s = Call("DELETE", key, nullptr, &reply);
  }
  if (!s.ok()) {
    XLOG(INFO) << "cluster metadata: could not delete the entry of '" << options_.self.name << "' at " << url_
               << " (it stays until another engine takes the name): " << s.message();
  }
}

Status HttpDirectory::Lookup(const std::string& name, ClusterPeer* peer) {
  std::string value;
  bool found = false;
  if (Status s = Get(KeyOf(name), &value, &found); !s.ok()) {
    return {s.code(), "cannot look up '" + name + "': " + s.message()};
  }
  if (!found) return {StatusCode::kNotConnected, "no engine named '" + name + "' at " + url_};
  if (!ReadEntry(value, peer)) {
    return {StatusCode::kInternal,
            "the entry of '" + name + "' at " + url_ + " is not an xfer engine's: " + value};
  }
  return Status::Ok();
}

Status HttpDirectory::List(std::vector<ClusterPeer>*) {
  return {StatusCode::kUnsupported, "ListPeers needs etcd: the HTTP metadata protocol at " + url_ +
                                        " cannot list keys (look engines up by name instead)"};
}

}  // namespace xfer::metadata
