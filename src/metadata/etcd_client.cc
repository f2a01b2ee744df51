#include "metadata/etcd_client.h"

#include <curl/curl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "metadata/http_call.h"
#include "util/log.h"

namespace xfer::metadata {

using json = nlohmann::json;

Status ParseEtcdUrl(const std::string& url, EtcdUrl* out) {
  const std::string scheme = "etcd://";
  auto bad = [&](const std::string& why) {
    return Status{StatusCode::kInvalidArgument,
                  "metadata '" + url + "': " + why + " (expected etcd://host:port[,host:port...][/prefix])"};
  };
  if (url.rfind(scheme, 0) != 0) return bad("not an etcd:// URL");
  if (url.find("https://") != std::string::npos) return bad("TLS (https) to etcd is not supported");
  std::string rest = url.substr(scheme.size());
  EtcdUrl u;
  const size_t slash = rest.find('/');
  std::string prefix = slash == std::string::npos ? "" : rest.substr(slash);
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  while (prefix.size() > 1 && prefix[1] == '/') prefix.erase(0, 1);
  u.prefix = prefix.empty() ? "/xfer" : prefix;
  rest = rest.substr(0, slash);
  for (size_t begin = 0; begin <= rest.size();) {
    size_t end = rest.find_first_of(",;", begin);  // (Mooncake's and NIXL's lists take either)
    if (end == std::string::npos) end = rest.size();
    const std::string ep = rest.substr(begin, end - begin);
    const size_t colon = ep.rfind(':');
    if (ep.empty() || colon == std::string::npos || colon == 0 || colon + 1 == ep.size() ||
        ep.find_first_not_of("0123456789", colon + 1) != std::string::npos) {
      return bad("endpoint '" + ep + "' is not host:port");
    }
    u.endpoints.push_back(ep);
    begin = end + 1;
  }
  *out = std::move(u);
  return Status::Ok();
}

namespace {

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

constexpr size_t kMaxReply = 64 << 20;  // (a List of every engine's entry fits many times over)

// etcd's JSON renders 64-bit integers as strings ("TTL": "5"); absent means 0.
int64_t Int(const json& j, const char* field) {
  if (!j.contains(field)) return 0;
  const json& v = j.at(field);
  return v.is_string() ? std::stoll(v.get<std::string>()) : v.get<int64_t>();  // (throws: Call catches)
}

}  // namespace

std::string Base64Encode(const std::string& bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t v = static_cast<uint8_t>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) v |= static_cast<uint8_t>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) v |= static_cast<uint8_t>(bytes[i + 2]);
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kB64[(v >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kB64[v & 63] : '=';
  }
  return out;
}

bool Base64Decode(const std::string& text, std::string* bytes) {
  if (text.size() % 4 != 0) return false;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    uint32_t v = 0;
    int pad = 0;
    for (size_t k = 0; k < 4; ++k) {
      const char c = text[i + k];
      const char* at = c == '\0' ? nullptr : std::strchr(kB64, c);
      if (c == '=' && i + 4 == text.size() && k >= 2) {
        ++pad;
      } else if (at == nullptr || pad > 0) {
        return false;
      }
      v = v << 6 | (at != nullptr && c != '=' ? static_cast<uint32_t>(at - kB64) : 0);
    }
    out += static_cast<char>(v >> 16);
    if (pad < 2) out += static_cast<char>((v >> 8) & 255);
    if (pad < 1) out += static_cast<char>(v & 255);
  }
  *bytes = std::move(out);
  return true;
}

EtcdClient::EtcdClient(std::vector<std::string> endpoints, std::chrono::milliseconds timeout)
    : endpoints_(std::move(endpoints)), timeout_(timeout) {
  CurlInit();
}

Status EtcdClient::Call(const char* path, const json& request,
                        const std::function<Status(const json&)>& read) {
  const std::string body = request.dump();
  std::string last_error;
  const size_t first = current_.load();
  for (size_t k = 0; k < endpoints_.size(); ++k) {
    const size_t at = (first + k) % endpoints_.size();
    HttpRequest call;
    call.method = "POST";
    call.url = "http://" + endpoints_[at] + path;
    call.body = &body;
    call.timeout = timeout_;
    call.max_reply = kMaxReply;
    HttpReply answer;
    if (Status s = HttpCall(call, &answer); !s.ok()) {
      last_error = endpoints_[at] + ": " + s.message();
      continue;
    }
    const long http = answer.status;
    const std::string& reply = answer.body;
    const std::string where = "etcd at " + endpoints_[at] + path;
    const json j = json::parse(reply, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {  // (not etcd, or a proxy's error page: the next one)
      last_error = where + " answered HTTP " + std::to_string(http) + " with no JSON object";
      continue;
    }
    if (j.contains("error") || http != 200) {
      const auto message = j.find("message");
      const std::string what =
          message != j.end() && message->is_string() ? message->get<std::string>() : j.dump();
      // A member that cannot serve now (no leader, a timeout: gRPC's UNAVAILABLE 14 and
      // DEADLINE_EXCEEDED 4, or an HTTP 5xx): the next endpoint may.
      const auto code_field = j.find("code");
      const int64_t code =
          code_field != j.end() && code_field->is_number_integer() ? code_field->get<int64_t>() : 0;
      if (http >= 500 || code == 14 || code == 4) {
        last_error = where + ": " + what;
        continue;
      }
      current_.store(at);
      return {StatusCode::kInternal, where + " refused: " + what};
    }
    current_.store(at);
    if (!read) return Status::Ok();
    try {
      return read(j);
    } catch (const json::exception& e) {
      return {StatusCode::kInternal, where + " answered what it should not (" + e.what() + "): " + reply};
    } catch (const std::logic_error& e) {  // (std::stoll)
      return {StatusCode::kInternal, where + " answered a bad number: " + reply};
    }
  }
  return {StatusCode::kNotConnected, "etcd unreachable (" + last_error +
                                         (endpoints_.size() > 1 ? "; and every other endpoint" : "") + ")"};
}

Status EtcdClient::Grant(int64_t ttl_s, int64_t* lease) {
  return Call("/v3/lease/grant", json{{"TTL", ttl_s}}, [&](const json& j) {
    *lease = Int(j, "ID");
    return *lease != 0 ? Status::Ok() : Status{StatusCode::kInternal, "etcd granted no lease: " + j.dump()};
  });
}

Status EtcdClient::KeepAlive(int64_t lease, int64_t* ttl_left) {
  return Call("/v3/lease/keepalive", json{{"ID", std::to_string(lease)}}, [&](const json& j) {
    *ttl_left = j.contains("result") ? Int(j.at("result"), "TTL") : 0;
    return Status::Ok();
  });
}

Status EtcdClient::Revoke(int64_t lease) {
  return Call("/v3/lease/revoke", json{{"ID", std::to_string(lease)}});
}

Status EtcdClient::Put(const std::string& key, const std::string& value, int64_t lease) {
  json body{{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  if (lease != 0) body["lease"] = std::to_string(lease);
  return Call("/v3/kv/put", body);
}

Status EtcdClient::Get(const std::string& key, std::string* value, bool* found) {
  KeyValues kvs;
  Status s = Range(json{{"key", Base64Encode(key)}}, &kvs);
  *found = s.ok() && !kvs.empty();
  if (*found) *value = std::move(kvs[0].second);
  return s;
}

namespace {

// The end of the key range that holds every key starting with prefix.
std::string RangeEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty() && static_cast<uint8_t>(end.back()) == 0xff) end.pop_back();
  if (!end.empty()) end.back() = static_cast<char>(end.back() + 1);
  return end.empty() ? std::string(1, '\0') : end;
}

}  // namespace

Status EtcdClient::List(const std::string& prefix, KeyValues* out, int64_t* revision) {
  return Range(json{{"key", Base64Encode(prefix)}, {"range_end", Base64Encode(RangeEnd(prefix))}}, out,
               revision);
}

Status EtcdClient::Range(const json& request, KeyValues* out, int64_t* revision) {
  out->clear();
  return Call("/v3/kv/range", request, [&](const json& j) {
    if (revision != nullptr) *revision = Int(j.at("header"), "revision");
    if (!j.contains("kvs")) return Status::Ok();
    for (const json& kv : j.at("kvs")) {
      std::string key, value;
      if (!Base64Decode(kv.at("key").get<std::string>(), &key) ||
          !Base64Decode(kv.value("value", std::string()), &value)) {
        return Status{StatusCode::kInternal, "etcd: a key or value is not base64"};
      }
      out->emplace_back(std::move(key), std::move(value));
    }
    return Status::Ok();
  });
}

namespace {

constexpr size_t kMaxWatchLine = 64 << 20;  // a watch answer longer than this ends the watch

// A watch stream as curl delivers it: newline-delimited JSON objects, each a WatchResponse.
struct WatchStream {
  const std::function<void(const EtcdClient::WatchEvent&)>* on_event;
  std::string pending;  // a line not complete yet
  Status ended;         // why the stream is to end (set: the write callback aborts it)

  // One WatchResponse; false ends the stream (ended says why).
  bool Take(const std::string& line) {
    const json j = json::parse(line, nullptr, false);
    try {
      if (j.is_discarded() || !j.contains("result")) {
        const std::string what =
            !j.is_discarded() && j.contains("error") ? j.at("error").dump() : line.substr(0, 200);
        ended = {StatusCode::kInternal, "etcd watch: " + what};
        return false;
      }
      const json& r = j.at("result");
      if (r.value("canceled", false)) {  // (e.g. its start was compacted away: list again)
        ended = {StatusCode::kInternal,
                 "etcd canceled the watch: " + r.value("cancel_reason", std::string("compacted"))};
        return false;
      }
      if (!r.contains("events")) return true;
      for (const json& ev : r.at("events")) {
        EtcdClient::WatchEvent e;
        e.put = ev.value("type", std::string("PUT")) != "DELETE";
        const json& kv = ev.at("kv");
        if (!Base64Decode(kv.at("key").get<std::string>(), &e.key) ||
            !Base64Decode(kv.value("value", std::string()), &e.value)) {
          ended = {StatusCode::kInternal, "etcd watch: a key or value is not base64"};
          return false;
        }
        (*on_event)(e);
      }
    } catch (const json::exception& e) {
      ended = {StatusCode::kInternal, std::string("etcd watch: an answer it should not give: ") + e.what()};
      return false;
    }
    return true;
  }

  static size_t Write(char* data, size_t size, size_t n, void* self) {
    auto* w = static_cast<WatchStream*>(self);
    size_t scanned = w->pending.size();  // (no newline before: only the new bytes are searched)
    w->pending.append(data, size * n);
    for (size_t eol; (eol = w->pending.find('\n', scanned)) != std::string::npos; scanned = 0) {
      const std::string line = w->pending.substr(0, eol);
      w->pending.erase(0, eol + 1);
      if (!line.empty() && !w->Take(line)) return 0;  // (curl then ends the transfer)
    }
    if (w->pending.size() > kMaxWatchLine) {
      w->ended = {StatusCode::kInternal, "etcd watch: an answer of more than 64 MiB"};
      return 0;
    }
    return size * n;
  }

  // The watch's own sockets, known (under the client's lock) from their opening to their
  // closing, so that StopWatch can shut them down and never touches a descriptor reused by
  // then; none opens once the watch was stopped.
  EtcdClient::WatchSockets* sockets;
  static curl_socket_t Open(void* self, curlsocktype, curl_sockaddr* a) {
    EtcdClient::WatchSockets& ws = *static_cast<WatchStream*>(self)->sockets;
    std::lock_guard lock(ws.mu);
    if (ws.stopped) return CURL_SOCKET_BAD;
    const int fd = ::socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
    if (fd < 0) return CURL_SOCKET_BAD;
    ws.open.insert(fd);
    return fd;
  }
  // (A socket still connecting when StopWatch shut it down is not stopped by that: curl asks
  // this about once a second, and the watch ends then.)
  static int Progress(void* self, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
    EtcdClient::WatchSockets& ws = *static_cast<WatchStream*>(self)->sockets;
    std::lock_guard lock(ws.mu);
    return ws.stopped ? 1 : 0;
  }
  static int Close(void* self, curl_socket_t fd) {
    EtcdClient::WatchSockets& ws = *static_cast<WatchStream*>(self)->sockets;
    std::lock_guard lock(ws.mu);
    ws.open.erase(fd);
    return ::close(fd);
  }
};

}  // namespace

Status EtcdClient::Watch(const std::string& prefix, int64_t start_revision,
                         const std::function<void(const WatchEvent&)>& on_event) {
  const json request{{"create_request",
                      {{"key", Base64Encode(prefix)},
                       {"range_end", Base64Encode(RangeEnd(prefix))},
                       {"start_revision", std::to_string(start_revision)}}}};
  const std::string body = request.dump();
  std::string last_error;
  const size_t first = current_.load();
  for (size_t k = 0; k < endpoints_.size() && !WatchStopped(); ++k) {
    const size_t at = (first + k) % endpoints_.size();
    const std::string url = "http://" + endpoints_[at] + "/v3/watch";
    std::unique_ptr<CURL, void (*)(CURL*)> curl(curl_easy_init(), curl_easy_cleanup);
    std::unique_ptr<curl_slist, void (*)(curl_slist*)> headers(
        curl_slist_append(nullptr, "Content-Type: application/json"), curl_slist_free_all);
    if (!curl) return {StatusCode::kResourceExhausted, "etcd: curl_easy_init failed"};
    WatchStream w{&on_event, {}, {}, &watch_sockets_};
    curl_easy_setopt(curl.get(), CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl.get(), CURLOPT_HTTPHEADER, headers.get());
    curl_easy_setopt(curl.get(), CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(curl.get(), CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
    curl_easy_setopt(curl.get(), CURLOPT_WRITEFUNCTION, WatchStream::Write);
    curl_easy_setopt(curl.get(), CURLOPT_WRITEDATA, &w);
    curl_easy_setopt(curl.get(), CURLOPT_OPENSOCKETFUNCTION, WatchStream::Open);
    curl_easy_setopt(curl.get(), CURLOPT_OPENSOCKETDATA, &w);
    curl_easy_setopt(curl.get(), CURLOPT_CLOSESOCKETFUNCTION, WatchStream::Close);
    curl_easy_setopt(curl.get(), CURLOPT_CLOSESOCKETDATA, &w);
    curl_easy_setopt(curl.get(), CURLOPT_XFERINFOFUNCTION, WatchStream::Progress);
    curl_easy_setopt(curl.get(), CURLOPT_XFERINFODATA, &w);
    curl_easy_setopt(curl.get(), CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(curl.get(), CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(timeout_.count()));
    curl_easy_setopt(curl.get(), CURLOPT_TCP_KEEPALIVE, 1L);  // (an etcd host that vanished: ~25 s)
    curl_easy_setopt(curl.get(), CURLOPT_TCP_KEEPIDLE, 5L);
    curl_easy_setopt(curl.get(), CURLOPT_TCP_KEEPINTVL, 2L);
    curl_easy_setopt(curl.get(), CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl.get(), CURLOPT_NOPROXY, "*");
    const CURLcode rc = curl_easy_perform(curl.get());
    curl.reset();  // (closes its socket now, while w is alive)
    if (WatchStopped()) return {StatusCode::kCanceled, "etcd watch: stopped"};
    if (!w.ended.ok()) return w.ended;
    if (rc == CURLE_COULDNT_CONNECT || rc == CURLE_OPERATION_TIMEDOUT || rc == CURLE_COULDNT_RESOLVE_HOST) {
      last_error = endpoints_[at] + ": " + curl_easy_strerror(rc);
      continue;  // (the next endpoint)
    }
    current_.store(at);
    return {StatusCode::kNotConnected,
            "etcd watch at " + endpoints_[at] +
                " ended: " + (rc == CURLE_OK ? std::string("the server closed it") : curl_easy_strerror(rc))};
  }
  if (WatchStopped()) return {StatusCode::kCanceled, "etcd watch: stopped"};
  return {StatusCode::kNotConnected, "etcd unreachable (" + last_error + ")"};
}

void EtcdClient::StopWatch() {
  std::lock_guard lock(watch_sockets_.mu);
  watch_sockets_.stopped = true;
  for (int fd : watch_sockets_.open) ::shutdown(fd, SHUT_RDWR);  // (curl owns them, and closes them)
}

bool EtcdClient::WatchStopped() {
  std::lock_guard lock(watch_sockets_.mu);
  return watch_sockets_.stopped;
}

Status EtcdClient::Delete(const std::string& key) {
  return Call("/v3/kv/deleterange", json{{"key", Base64Encode(key)}});
}

}  // namespace xfer::metadata
