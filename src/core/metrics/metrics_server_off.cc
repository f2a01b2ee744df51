// MetricsServer in a build without cpp-httplib: EngineOptions::metrics_listen is refused.
#include "core/metrics/metrics_server.h"

namespace xfer {

Status MetricsServer::Start(const std::string& listen, Render, std::unique_ptr<MetricsServer>*) {
  return {StatusCode::kUnsupported,
          "metrics_listen '" + listen +
              "': this build has no HTTP server (apt-get install "
              "libcpp-httplib-dev, then rebuild); Engine::GetMetrics works without it"};
}

}  // namespace xfer
