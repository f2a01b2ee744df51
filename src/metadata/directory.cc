#include "metadata/directory.h"

#include <algorithm>

#include "metadata/entry.h"
#include "metadata/publishing_directory.h"
#include "util/log.h"

namespace xfer::metadata {

using namespace std::chrono_literals;

namespace {
constexpr auto kFirstRetry = 100ms;  // back-off while the service is unreachable: doubles up to ttl/3
}  // namespace

Status Directory::Start(Options options, std::unique_ptr<Directory>* out) {
  if (!options.self.name.empty()) {
    if (Status s = CheckClusterName(options.self.name); !s.ok()) return s;
  }
  const std::string& url = options.url;
  if (url.rfind("etcd://", 0) == 0) return StartEtcdDirectory(std::move(options), out);
  if (url.rfind("http://", 0) == 0 || url.rfind("https://", 0) == 0) {
    return StartHttpDirectory(std::move(options), out);
  }
  return {StatusCode::kInvalidArgument, "metadata '" + url +
                                            "': expected etcd://host:port[,host:port...][/prefix] or an HTTP "
                                            "metadata server's http://host:port/path"};
}

PublishingDirectory::PublishingDirectory(Options options, std::string url, std::string service)
    : options_(std::move(options)), url_(std::move(url)), service_(std::move(service)) {}

Status PublishingDirectory::StartPublishing() {
  if (options_.self.name.empty()) return Status::Ok();
  Status s = Publish();
  start_published_ = s.ok();
  if (!s.ok()) {
    if (options_.required) {
      return {s.code(), "cannot publish '" + options_.self.name + "' at " + url_ + ": " + s.message() +
                            " (EngineOptions::start_without_metadata starts anyway)"};
    }
    XLOG(WARN) << "cluster metadata: cannot publish '" << options_.self.name << "' at " << url_ << " now ("
               << s.message() << "); starting anyway, publishing as soon as " << service_ << " answers";
  }
  thread_ = std::thread([this] { Keep(); });
  return Status::Ok();
}

bool PublishingDirectory::StopPublishing() {
  {
    std::lock_guard lock(mu_);
    if (stop_) return false;
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  return true;
}

bool PublishingDirectory::Stopping() {
  std::lock_guard lock(mu_);
  return stop_;
}

void PublishingDirectory::TagsChanged() {
  {
    std::lock_guard lock(mu_);
    dirty_ = true;
  }
  wake_.notify_all();
}

std::string PublishingDirectory::Entry() const {
  return WriteEntry(options_.self, options_.tags ? options_.tags() : std::vector<std::string>{});
}

void PublishingDirectory::Keep() {
  // Renewed every third of the ttl whatever else happens; tag changes are published as they
  // come (those close together once).
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
      s = Publish();  // (renews too)
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
                   << "publishing '" << options_.self.name << "' again when " << service_ << " answers";
      }
      down = true;
      retry = std::min<std::chrono::milliseconds>(retry * 2, period);
    } else if (down) {
      XLOG(WARN) << "cluster metadata: " << service_ << " answers again (" << url_ << "); '"
                 << options_.self.name << "' is published";
      down = false;
      retry = kFirstRetry;
    }
  }
}

}  // namespace xfer::metadata
