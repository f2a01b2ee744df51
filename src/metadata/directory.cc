#include "metadata/directory.h"

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "metadata/etcd_client.h"
#include "util/log.h"

namespace xfer::metadata {

using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

constexpr auto kCallTimeout = 1000ms;  // per etcd endpoint and call
constexpr auto kFirstRetry = 100ms;    // back-off while etcd is unreachable: doubles up to ttl/3

bool ReadEntry(const std::string& value, ClusterPeer* peer) {
  const json j = json::parse(value, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return false;
  try {
    peer->name = j.at("name").get<std::string>();
    peer->address = j.at("address").get<std::string>();
    peer->incarnation = j.at("incarnation").get<uint64_t>();
    peer->host_id = j.value("host_id", std::string());
    peer->tags = j.value("tags", std::vector<std::string>());
  } catch (const json::exception&) {
    return false;
  }
  return !peer->name.empty() && !peer->address.empty();
}

}  // namespace

// The etcd directory (directory.h has the contract).
class EtcdDirectory final : public Directory {
 public:
  EtcdDirectory(Options options, EtcdUrl url);
  ~EtcdDirectory() override { Stop(); }
  Status StartPublishing();
  void Stop() override;
  void TagsChanged() override;
  Status Lookup(const std::string& name, ClusterPeer* peer) override;
  Status List(std::vector<ClusterPeer>* peers) override;
  const std::string& url() const override { return url_; }

 private:
  std::string KeyOf(const std::string& name) const { return prefix_ + "/engines/" + name; }
  std::string Entry() const;  // this engine's value (JSON)
  Status Publish();           // a lease when there is none (else renewed), then the entry under it
  Status Renew();             // the lease kept alive (published again when it ran out)
  void Keep();                // the thread

  void Watch();  // the watcher thread: keeps view_ current
  bool Stopping() {
    std::lock_guard lock(mu_);
    return stop_;
  }

  const Options options_;
  const std::string prefix_;
  const std::string url_;
  EtcdClient etcd_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;             // (mu_)
  bool dirty_ = false;            // (mu_) the tags changed since the last Put
  int64_t lease_ = 0;             // the thread's (and StartPublishing's, before it runs; Stop's after)
  bool start_published_ = false;  // StartPublishing's Publish succeeded
  std::thread thread_;
  std::thread watcher_;  // (mu_) started by the first List
  std::mutex view_mu_;
  std::map<std::string, ClusterPeer> view_;  // (view_mu_) key -> entry, as the watch saw them
  bool view_current_ = false;                // (view_mu_) the watch runs: view_ is current
};

EtcdDirectory::EtcdDirectory(Options options, EtcdUrl url)
    : options_(std::move(options)),
      prefix_(url.prefix),
      url_([&] {
        std::string u = "etcd://";
        for (size_t i = 0; i < url.endpoints.size(); ++i) u += (i ? "," : "") + url.endpoints[i];
        return u + url.prefix;
      }()),
      etcd_(url.endpoints, kCallTimeout) {}

Status Directory::Start(Options options, std::unique_ptr<Directory>* out) {
  EtcdUrl url;
  if (Status s = ParseEtcdUrl(options.url, &url); !s.ok()) return s;
  if (!options.self.name.empty()) {
    if (Status s = CheckClusterName(options.self.name); !s.ok()) return s;
  }
  auto d = std::make_unique<EtcdDirectory>(std::move(options), std::move(url));
  if (Status s = d->StartPublishing(); !s.ok()) return s;
  *out = std::move(d);
  return Status::Ok();
}

Status EtcdDirectory::StartPublishing() {
  if (options_.self.name.empty()) return Status::Ok();
  Status s = Publish();
  start_published_ = s.ok();
  if (!s.ok()) {
    if (options_.required) {
      return {s.code(), "cannot publish '" + options_.self.name + "' at " + url_ + ": " + s.message() +
                            " (EngineOptions::start_without_metadata starts anyway)"};
    }
    XLOG(WARN) << "cluster metadata: cannot publish '" << options_.self.name << "' at " << url_ << " now ("
               << s.message() << "); starting anyway, publishing as soon as etcd answers";
  }
  thread_ = std::thread([this] { Keep(); });
  return Status::Ok();
}

void EtcdDirectory::Stop() {
  {
    std::lock_guard lock(mu_);
    if (stop_) return;
    stop_ = true;
  }
  wake_.notify_all();
  etcd_.StopWatch();
  if (watcher_.joinable()) watcher_.join();
  if (thread_.joinable()) thread_.join();
  if (lease_ != 0) {
    if (Status s = etcd_.Revoke(lease_); !s.ok()) {
      XLOG(INFO) << "cluster metadata: could not revoke the lease of '" << options_.self.name
                 << "' (its entry goes when the lease runs out): " << s.message();
    }
    lease_ = 0;
  }
}

void EtcdDirectory::TagsChanged() {
  {
    std::lock_guard lock(mu_);
    dirty_ = true;
  }
  wake_.notify_all();
}

std::string EtcdDirectory::Entry() const {
  std::vector<std::string> tags = options_.tags ? options_.tags() : std::vector<std::string>{};
  std::sort(tags.begin(), tags.end());
  tags.erase(std::unique(tags.begin(), tags.end()), tags.end());
  tags.erase(std::remove(tags.begin(), tags.end(), std::string()), tags.end());
  const ClusterPeer& me = options_.self;
  return json{{"name", me.name},
              {"address", me.address},
              {"incarnation", me.incarnation},
              {"host_id", me.host_id},
              {"tags", tags}}
      .dump();
}

Status EtcdDirectory::Publish() {
  const std::string key = KeyOf(options_.self.name);
  // (The entry of an engine that had this name before, if its lease still runs, is replaced.)
  if (lease_ != 0) {  // renewed first: after an outage it may be about to run out, or gone
    int64_t ttl_left = 0;
    Status s = etcd_.KeepAlive(lease_, &ttl_left);
    if (s.code() == StatusCode::kNotConnected) return s;
    if (s.ok() && ttl_left > 0) {
      s = etcd_.Put(key, Entry(), lease_);
      if (s.ok() || s.code() == StatusCode::kNotConnected) return s;
    }
    lease_ = 0;  // (gone, or refused: the lease ran out while etcd was away, or etcd lost it)
  }
  if (Status s = etcd_.Grant(options_.ttl.count(), &lease_); !s.ok()) return s;
  return etcd_.Put(key, Entry(), lease_);
}

Status EtcdDirectory::Renew() {
  int64_t ttl_left = 0;
  Status s = etcd_.KeepAlive(lease_, &ttl_left);
  if (s.ok() && ttl_left == 0) {  // (etcd was away longer than the lease: it expired)
    XLOG(WARN) << "cluster metadata: the lease of '" << options_.self.name << "' expired; publishing again";
    lease_ = 0;
    s = Publish();
  }
  return s;
}

void EtcdDirectory::Keep() {
  // The lease is renewed every third of its time to live whatever else happens; tag changes
  // are published as they come (those close together once).
  const auto period = std::max<std::chrono::milliseconds>(
      std::chrono::duration_cast<std::chrono::milliseconds>(options_.ttl) / 3, 100ms);
  bool published = start_published_;
  bool down = !published;  // logged once per outage
  auto retry = kFirstRetry;
  auto next_renewal = std::chrono::steady_clock::now() + period;
  std::unique_lock lock(mu_);
  for (;;) {
    const auto until = published ? next_renewal : std::chrono::steady_clock::now() + retry;
    wake_.wait_until(lock, until, [&] { return stop_ || (published && dirty_); });
    if (stop_) return;
    const bool republish = !published || dirty_;
    dirty_ = false;
    lock.unlock();
    const bool renew = !republish && std::chrono::steady_clock::now() >= next_renewal;
    Status s;
    if (republish) {
      s = Publish();  // (renews the lease too)
    } else if (renew) {
      s = Renew();
    }
    if (s.ok() && (republish || renew)) next_renewal = std::chrono::steady_clock::now() + period;
    lock.lock();
    published = s.ok();
    if (!s.ok()) {
      if (republish) dirty_ = true;  // (the tags still need to go out)
      if (!down) {
        XLOG(WARN) << "cluster metadata: " << s.message() << "; transfers go on; retrying, and "
                   << "publishing '" << options_.self.name << "' again when etcd answers";
      }
      down = true;
      retry = std::min<std::chrono::milliseconds>(retry * 2, period);
    } else if (down) {
      XLOG(WARN) << "cluster metadata: etcd answers again (" << etcd_.endpoint() << "); '"
                 << options_.self.name << "' is published";
      down = false;
      retry = kFirstRetry;
    }
  }
}

Status EtcdDirectory::Lookup(const std::string& name, ClusterPeer* peer) {
  std::string value;
  bool found = false;
  if (Status s = etcd_.Get(KeyOf(name), &value, &found); !s.ok()) {
    return {s.code(), "cannot look up '" + name + "' at " + url_ + ": " + s.message()};
  }
  if (!found) return {StatusCode::kNotConnected, "no engine named '" + name + "' at " + url_};
  if (!ReadEntry(value, peer)) {
    return {StatusCode::kInternal,
            "the entry of '" + name + "' at " + url_ + " is not an xfer engine's: " + value};
  }
  return Status::Ok();
}

Status EtcdDirectory::List(std::vector<ClusterPeer>* peers) {
  {
    std::lock_guard lock(view_mu_);
    if (view_current_) {
      peers->clear();
      for (const auto& [key, p] : view_) peers->push_back(p);
      return Status::Ok();
    }
  }
  {
    std::lock_guard lock(mu_);
    if (!stop_ && !watcher_.joinable()) watcher_ = std::thread([this] { Watch(); });
  }
  EtcdClient::KeyValues kvs;
  if (Status s = etcd_.List(KeyOf(""), &kvs); !s.ok()) {
    return {s.code(), "cannot list the engines at " + url_ + ": " + s.message()};
  }
  peers->clear();
  for (const auto& [key, value] : kvs) {
    ClusterPeer p;
    if (ReadEntry(value, &p)) {
      peers->push_back(std::move(p));
    } else {
      XLOG(WARN) << "cluster metadata: skipped " << key << " at " << url_ << ": not an xfer engine's entry";
    }
  }
  return Status::Ok();
}

void EtcdDirectory::Watch() {
  auto retry = kFirstRetry;
  auto apply = [this](const std::string& key, const std::string* value) {  // (view_mu_ held)
    ClusterPeer p;
    if (value != nullptr && ReadEntry(*value, &p)) {
      view_[key] = std::move(p);
    } else {
      view_.erase(key);  // (deleted, or not an engine's entry)
    }
  };
  while (!Stopping()) {
    EtcdClient::KeyValues kvs;
    int64_t revision = 0;
    Status s = etcd_.List(KeyOf(""), &kvs, &revision);
    if (s.ok()) {
      {
        std::lock_guard lock(view_mu_);
        view_.clear();
        for (const auto& [key, value] : kvs) apply(key, &value);
        view_current_ = true;
      }
      retry = kFirstRetry;
      // (From the next revision on: nothing between the list and the watch is missed.)
      s = etcd_.Watch(KeyOf(""), revision + 1, [&](const EtcdClient::WatchEvent& e) {
        std::lock_guard lock(view_mu_);
        apply(e.key, e.put ? &e.value : nullptr);
      });
    }
    {
      std::lock_guard lock(view_mu_);
      view_current_ = false;  // (ListPeers asks etcd itself until the watch runs again)
    }
    if (s.code() == StatusCode::kCanceled) return;
    if (retry == kFirstRetry) {  // (once per outage: then it retries quietly, with back-off)
      XLOG(INFO) << "cluster metadata: the watch of " << url_ << " ended (" << s.message()
                 << "); ListPeers asks etcd itself until it runs again";
    }
    std::unique_lock lock(mu_);
    wake_.wait_for(lock, retry, [&] { return stop_; });
    retry = std::min<std::chrono::milliseconds>(retry * 2, 1000ms);
  }
}

}  // namespace xfer::metadata
