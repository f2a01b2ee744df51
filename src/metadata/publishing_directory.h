// PublishingDirectory: what every metadata service's Directory shares, the thread that keeps
// this engine's entry published. It publishes at start, renews every third of the ttl, publishes
// again soon after the tags change, and while the service cannot be reached retries with
// back-off (logged once per outage). A service supplies Publish and Renew, and withdraws the
// entry in its Stop after StopPublishing; its destructor calls Stop (the thread calls Publish
// and Renew: it must end before the service's part of the object goes).
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "metadata/directory.h"

namespace xfer::metadata {

class PublishingDirectory : public Directory {
 public:
  void TagsChanged() override;
  const std::string& url() const override { return url_; }

 protected:
  // url: the service as url() shows it; service: how log lines name it ("etcd").
  PublishingDirectory(Options options, std::string url, std::string service);

  // Publishes once (with options_.required, failing says why), then starts the thread.
  // Nothing to do when self has no name.
  Status StartPublishing();
  // Ends the thread; false when it had already been called.
  bool StopPublishing();
  bool Stopping();
  std::string Entry() const;  // this engine's entry, with its tags as they are now

  virtual Status Publish() = 0;  // the entry, as it is now
  virtual Status Renew() = 0;    // between changes, every third of the ttl

  const Options options_;
  const std::string url_;
  const std::string service_;
  std::mutex mu_;
  std::condition_variable wake_;  // (mu_) stop_ or dirty_ set
  bool stop_ = false;             // (mu_)

 private:
  void Keep();  // the thread

  bool dirty_ = false;            // (mu_) the tags changed since the last Publish
  bool start_published_ = false;  // StartPublishing's Publish succeeded
  std::thread thread_;
};

// The services (Directory::Start picks one by the URL's scheme).
Status StartEtcdDirectory(Directory::Options options, std::unique_ptr<Directory>* out);
Status StartHttpDirectory(Directory::Options options, std::unique_ptr<Directory>* out);

}  // namespace xfer::metadata
