// Serves an engine's metrics over HTTP (EngineOptions::metrics_listen): GET /metrics answers
// with the Prometheus text format (503 while the engine is not running), on the server's own
// threads (a listener and two workers: a scraper that stalls holds a worker, never the
// engine; its destruction waits for them two seconds at most).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "xfer/status.h"

namespace xfer {

class MetricsServer {
 public:
  using Render = std::function<std::string()>;  // the body of /metrics; "" answers 503

  // listen: "host:port" (port 0: a free one). kUnsupported in a build without cpp-httplib.
  static Status Start(const std::string& listen, Render render, std::unique_ptr<MetricsServer>* out);
  virtual ~MetricsServer() = default;       // stops serving
  virtual std::string address() const = 0;  // "host:port" as bound
};

}  // namespace xfer
