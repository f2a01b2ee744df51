// Serves an engine's metrics over HTTP (EngineOptions::metrics_listen): GET /metrics answers
// with the Prometheus text format, on the server's own threads (two: a scraper that stalls
// holds one of them, for a second at most, and never the engine).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "xfer/status.h"

namespace xfer {

class MetricsServer {
 public:
  using Render = std::function<std::string()>;  // the body of /metrics

  // listen: "host:port" (port 0: a free one). kUnsupported in a build without cpp-httplib.
  static Status Start(const std::string& listen, Render render, std::unique_ptr<MetricsServer>* out);
  virtual ~MetricsServer() = default;  // stops serving
  virtual std::string address() const = 0;  // "host:port" as bound
};

}  // namespace xfer
