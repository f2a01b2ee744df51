// The etcd directory (directory.h has the contract): the entry lives under a lease that the
// publishing thread keeps alive, and ListPeers answers from a watch of the engines' keys.
#include <map>

#include "metadata/entry.h"
#include "metadata/etcd_client.h"
#include "metadata/publishing_directory.h"
#include "util/log.h"

namespace xfer::metadata {

using namespace std::chrono_literals;

namespace {

constexpr auto kCallTimeout = 1000ms;     // per etcd endpoint and call
constexpr auto kFirstWatchRetry = 100ms;  // the watch's back-off: doubles up to 1 s

std::string UrlOf(const EtcdUrl& url) {
  std::string u = "etcd://";
  for (size_t i = 0; i < url.endpoints.size(); ++i) u += (i ? "," : "") + url.endpoints[i];
  return u + url.prefix;
}

}  // namespace

class EtcdDirectory final : public PublishingDirectory {
 public:
  EtcdDirectory(Options options, const EtcdUrl& url)
      : PublishingDirectory(std::move(options), UrlOf(url), "etcd"),
        prefix_(url.prefix),
        etcd_(url.endpoints, kCallTimeout) {}
  ~EtcdDirectory() override { Stop(); }
  using PublishingDirectory::StartPublishing;
  void Stop() override;
  Status Lookup(const std::string& name, ClusterPeer* peer) override;
  Status List(std::vector<ClusterPeer>* peers) override;

 private:
  std::string KeyOf(const std::string& name) const { return prefix_ + "/engines/" + name; }
  Status Publish() override;  // a lease when there is none (else renewed), then the entry under it
  Status Renew() override;    // the lease kept alive (published again when it ran out)
  void Watch();               // the watcher thread: keeps view_ current

  const std::string prefix_;
  EtcdClient etcd_;
  int64_t lease_ = 0;    // the publishing thread's (StartPublishing's before it runs; Stop's after)
  std::thread watcher_;  // (mu_) started by the first List
  std::mutex view_mu_;
  std::map<std::string, ClusterPeer> view_;  // (view_mu_) key -> entry, as the watch saw them
  bool view_current_ = false;                // (view_mu_) the watch runs: view_ is current
};

Status StartEtcdDirectory(Directory::Options options, std::unique_ptr<Directory>* out) {
  EtcdUrl url;
  if (Status s = ParseEtcdUrl(options.url, &url); !s.ok()) return s;
  auto d = std::make_unique<EtcdDirectory>(std::move(options), url);
  if (Status s = d->StartPublishing(); !s.ok()) return s;
  *out = std::move(d);
  return Status::Ok();
}

void EtcdDirectory::Stop() {
  etcd_.StopWatch();  // (before the join: the watch may be waiting on etcd)
  if (!StopPublishing()) return;
  if (watcher_.joinable()) watcher_.join();  // (List starts none once stop_ is set)
  if (lease_ != 0) {
    if (Status s = etcd_.Revoke(lease_); !s.ok()) {
      XLOG(INFO) << "cluster metadata: could not revoke the lease of '" << options_.self.name
                 << "' (its entry goes when the lease runs out): " << s.message();
    }
    lease_ = 0;
  }
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
  auto retry = kFirstWatchRetry;
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
      retry = kFirstWatchRetry;
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
    if (retry == kFirstWatchRetry) {  // (once per outage: then it retries quietly, with back-off)
      XLOG(INFO) << "cluster metadata: the watch of " << url_ << " ended (" << s.message()
                 << "); ListPeers asks etcd itself until it runs again";
    }
    std::unique_lock lock(mu_);
    wake_.wait_for(lock, retry, [&] { return stop_; });
    retry = std::min<std::chrono::milliseconds>(retry * 2, 1000ms);
  }
}

}  // namespace xfer::metadata
