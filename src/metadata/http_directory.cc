// The HTTP directory: engines' entries in a key-value server that speaks Mooncake's HTTP
// metadata protocol (GET, PUT and DELETE of URL?key=KEY; the value is the body; 404: no such
// key), the protocol of Mooncake's mooncake_http_metadata_server. The entry of engine NAME is
// the key "xfer/engines/NAME". The protocol has no leases and no listing:
// - at start the entry is put, replacing whatever held the name (a dead engine's entry, as a
//   restarted engine replaces its own in etcd);
// - from then on, every third of the ttl and when the tags change, it is put again only while
//   the name is still this engine's or has gone (a server that restarted lost it): an engine
//   that took the name since keeps it, and this one says so once and stops publishing;
// - Stop deletes the entry while it is still this engine's;
// - the entry of an engine that died stays until another engine takes the name (looking it up
//   gives an address that refuses connections);
// - List is kUnsupported.
#include <curl/curl.h>

#include <cctype>

#include "metadata/entry.h"
#include "metadata/http_call.h"
#include "metadata/publishing_directory.h"
#include "util/log.h"

namespace xfer::metadata {

using namespace std::chrono_literals;

namespace {

constexpr auto kCallTimeout = 1000ms;
constexpr size_t kMaxEntry = 64 << 10;  // (an entry is a few hundred bytes: more is not an engine's)
constexpr size_t kMaxQuoted = 200;      // of a server's answer, in errors and log lines

using Url = std::unique_ptr<CURLU, void (*)(CURLU*)>;

// url checked by curl's URL parser (http or https, a host, no query or fragment), or
// kInvalidArgument saying what is wrong.
Status ParseHttpUrl(const std::string& url, Url* out) {
  auto bad = [&](const std::string& why) {
    return Status{StatusCode::kInvalidArgument, "metadata '" + url + "': " + why +
                                                    " (expected http://host:port/path, e.g. Mooncake's " +
                                                    "http://host:8080/metadata)"};
  };
  CurlInit();
  Url u(curl_url(), curl_url_cleanup);
  if (!u) return {StatusCode::kResourceExhausted, "curl_url failed"};
  if (curl_url_set(u.get(), CURLUPART_URL, url.c_str(), 0) != CURLUE_OK) return bad("not a URL");
  for (auto [part, what] : {std::pair{CURLUPART_QUERY, "a query (the key goes there)"},
                            std::pair{CURLUPART_FRAGMENT, "a fragment"}}) {
    char* text = nullptr;
    const bool has = curl_url_get(u.get(), part, &text, 0) == CURLUE_OK;
    curl_free(text);
    if (has || (part == CURLUPART_QUERY && url.find('?') != std::string::npos)) {
      return bad(std::string("it has ") + what);
    }
  }
  *out = std::move(u);
  return Status::Ok();
}

// At most kMaxQuoted bytes of a server's answer, control bytes as '?': fit for a log line.
std::string Quoted(const std::string& body) {
  std::string out = body.substr(0, kMaxQuoted);
  for (char& c : out) {
    if (std::iscntrl(static_cast<unsigned char>(c))) c = '?';
  }
  return body.size() > kMaxQuoted ? out + "..." : out;
}

bool Success(long status) { return status >= 200 && status < 300; }

}  // namespace

class HttpDirectory final : public PublishingDirectory {
 public:
  HttpDirectory(Options options, Url base)
      : PublishingDirectory(options, options.url, "the metadata server"), base_(std::move(base)) {}
  ~HttpDirectory() override { Stop(); }
  using PublishingDirectory::StartPublishing;
  void Stop() override;
  Status Lookup(const std::string& name, ClusterPeer* peer) override;
  Status List(std::vector<ClusterPeer>* peers) override;

 private:
  static std::string KeyOf(const std::string& name) { return "xfer/engines/" + name; }
  Status Publish() override;  // the first time unconditionally; then only while the name is ours
  Status Renew() override { return KeepName(false); }  // put again when the server lost it
  // After the first put: puts the entry again where the name has gone (the server lost it), or
  // is still ours and put_ours (the tags changed); where another engine holds it, yields the
  // name (once, logged). One GET, and a PUT where needed.
  Status KeepName(bool put_ours);
  // Whose the entry under this engine's name is: kOurs, kGone (no entry), or kTheirs
  // (another engine's, or what is no engine's entry).
  enum class Holder { kOurs, kGone, kTheirs };
  Status HolderOfName(Holder* holder, ClusterPeer* there);
  Status Put();
  // GET, PUT or DELETE of key; *reply: the server's answer, whatever its status.
  Status Call(const char* method, const std::string& key, const std::string* body, HttpReply* reply);
  Status Get(const std::string& key, std::string* value, bool* found);

  const Url base_;          // the parsed URL (copied for each call: thread-safe)
  bool took_name_ = false;  // the first Publish put the entry (publishing thread only)
  bool yielded_ = false;    // another engine took the name: no more puts (publishing thread only)
};

Status StartHttpDirectory(Directory::Options options, std::unique_ptr<Directory>* out) {
  Url base(nullptr, curl_url_cleanup);
  if (Status s = ParseHttpUrl(options.url, &base); !s.ok()) return s;
  auto d = std::make_unique<HttpDirectory>(std::move(options), std::move(base));
  if (Status s = d->StartPublishing(); !s.ok()) return s;
  *out = std::move(d);
  return Status::Ok();
}

Status HttpDirectory::Call(const char* method, const std::string& key, const std::string* body,
                           HttpReply* reply) {
  Url u(curl_url_dup(base_.get()), curl_url_cleanup);
  char* url = nullptr;
  const std::string query = "key=" + key;
  if (!u ||
      curl_url_set(u.get(), CURLUPART_QUERY, query.c_str(), CURLU_APPENDQUERY | CURLU_URLENCODE) !=
          CURLUE_OK ||
      curl_url_get(u.get(), CURLUPART_URL, &url, 0) != CURLUE_OK) {
    return {StatusCode::kResourceExhausted, "cannot make the URL of key " + key};
  }
  HttpRequest request;
  request.method = method;
  request.url = url;
  curl_free(url);
  request.body = body;
  request.timeout = kCallTimeout;
  request.max_reply = kMaxEntry;
  Status s = HttpCall(request, reply);
  if (s.code() == StatusCode::kNotConnected)
    return {s.code(), "the metadata server is unreachable (" + s.message() + ")"};
  if (!s.ok())
    return {s.code(), "the metadata server's answer to " + std::string(method) + ": " + s.message()};
  return s;
}

Status HttpDirectory::Get(const std::string& key, std::string* value, bool* found) {
  HttpReply reply;
  if (Status s = Call("GET", key, nullptr, &reply); !s.ok()) return s;
  *found = Success(reply.status);
  if (!*found && reply.status != 404) {
    return {StatusCode::kInternal, "the metadata server answered GET of " + key + " with HTTP " +
                                       std::to_string(reply.status) + ": " + Quoted(reply.body)};
  }
  if (*found) *value = std::move(reply.body);
  return Status::Ok();
}

Status HttpDirectory::Put() {
  const std::string entry = Entry();
  HttpReply reply;
  if (Status s = Call("PUT", KeyOf(options_.self.name), &entry, &reply); !s.ok()) return s;
  if (!Success(reply.status)) {
    return {StatusCode::kInternal, "the metadata server refused the entry (HTTP " +
                                       std::to_string(reply.status) + ": " + Quoted(reply.body) + ")"};
  }
  return Status::Ok();
}

Status HttpDirectory::HolderOfName(Holder* holder, ClusterPeer* there) {
  std::string value;
  bool found = false;
  if (Status s = Get(KeyOf(options_.self.name), &value, &found); !s.ok()) return s;
  const bool ours = found && ReadEntry(value, there) && there->incarnation == options_.self.incarnation &&
                    there->address == options_.self.address;
  *holder = !found ? Holder::kGone : ours ? Holder::kOurs : Holder::kTheirs;
  return Status::Ok();
}

Status HttpDirectory::Publish() {
  if (yielded_) return Status::Ok();
  if (!took_name_) {
    Status s = Put();
    took_name_ = s.ok();
    return s;
  }
  return KeepName(true);
}

Status HttpDirectory::KeepName(bool put_ours) {
  if (yielded_) return Status::Ok();
  Holder holder = Holder::kGone;
  ClusterPeer there;
  if (Status s = HolderOfName(&holder, &there); !s.ok()) return s;
  if (holder == Holder::kGone || (holder == Holder::kOurs && put_ours)) return Put();
  if (holder == Holder::kTheirs) {
    yielded_ = true;
    XLOG(WARN) << "cluster metadata: the name '" << options_.self.name << "' at " << url_
               << " was taken by another engine ("
               << (there.address.empty() ? "an entry no engine wrote" : there.address)
               << "); this engine no longer publishes it";
  }
  return Status::Ok();
}

void HttpDirectory::Stop() {
  if (!StopPublishing() || options_.self.name.empty()) return;
  Holder holder = Holder::kGone;
  ClusterPeer there;
  Status s = HolderOfName(&holder, &there);
  if (s.ok() && holder == Holder::kOurs) {
    HttpReply reply;
    s = Call("DELETE", KeyOf(options_.self.name), nullptr, &reply);
    if (s.ok() && !Success(reply.status) && reply.status != 404) {
      s = {StatusCode::kInternal, "HTTP " + std::to_string(reply.status) + ": " + Quoted(reply.body)};
    }
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
    return {s.code(), "cannot look up '" + name + "' at " + url_ + ": " + s.message()};
  }
  if (!found) return {StatusCode::kNotConnected, "no engine named '" + name + "' at " + url_};
  if (!ReadEntry(value, peer) || peer->name != name) {
    return {StatusCode::kInternal,
            "the entry of '" + name + "' at " + url_ + " is not an xfer engine's: " + Quoted(value)};
  }
  return Status::Ok();
}

Status HttpDirectory::List(std::vector<ClusterPeer>*) {
  return {StatusCode::kUnsupported, "the HTTP metadata protocol at " + url_ +
                                        " cannot list keys (ListPeers needs etcd; look engines up by name)"};
}

}  // namespace xfer::metadata
