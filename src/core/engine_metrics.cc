// Metrics: what the engine's own state adds to EngineMetrics' counts (regions, sessions,
// queues), and the server that exposes them (docs/metrics.md).
#include "core/engine_impl.h"

namespace xfer {
namespace {

void AddValue(MetricsSnapshot* out, std::string name, MetricType type, std::string help,
              double value, MetricLabels labels = {}) {
  for (auto& m : out->metrics) {
    if (m.name == name) {
      m.samples.push_back(ValueSample(std::move(labels), value));
      return;
    }
  }
  out->metrics.push_back({std::move(name), type, std::move(help), {ValueSample(std::move(labels), value)}});
}

}  // namespace

Status EngineImpl::StartMetricsServer() {
  if (opts_.metrics_listen.empty()) return Status::Ok();
  Status s = MetricsServer::Start(
      opts_.metrics_listen,
      [this] {
        MetricsSnapshot snapshot;  // (until the engine runs: "", which answers 503)
        if (!running_.load() || !GetMetrics(&snapshot).ok()) return std::string();
        return snapshot.PrometheusText();
      },
      &metrics_server_);
  if (s.ok()) metrics_address_ = metrics_server_->address();
  return s;
}

void EngineImpl::LabelPeer(PeerState& state) {
  if (!opts_.metrics) return;
  state.metrics = metrics_;
  state.metrics_slot = metrics_->SlotOf(state.info.name);
}

Status EngineImpl::GetMetrics(MetricsSnapshot* out) const {
  if (out == nullptr) return {StatusCode::kInvalidArgument, "GetMetrics: null output"};
  if (!metrics_) return {StatusCode::kInvalidArgument, "GetMetrics: engine is not initialized"};
  out->metrics.clear();
  metrics_->Snapshot(out);
  AddEngineGauges(out);
  return Status::Ok();
}

void EngineImpl::AddEngineGauges(MetricsSnapshot* out) const {
  uint64_t regions[2] = {}, bytes[2] = {};
  for (const auto& r : regions_.registry().Snapshot()) {
    const int t = r.info.type == MemType::kCuda ? 1 : 0;
    ++regions[t];
    bytes[t] += r.info.len;
  }
  for (int t = 0; t < 2; ++t) {
    const std::string type(MemTypeName(static_cast<MemType>(t)));
    AddValue(out, "xfer_registered_regions", MetricType::kGauge,
             "Local regions registered (RegisterMem, AllocMem), by memory type.", regions[t],
             {{"type", type}});
    AddValue(out, "xfer_registered_bytes", MetricType::kGauge,
             "Bytes of the registered regions, by memory type.", static_cast<double>(bytes[t]),
             {{"type", type}});
  }
  AddValue(out, "xfer_sessions", MetricType::kGauge, "Peers with a control session now.",
           static_cast<double>(peers_.States().size()));
  if (loop_) {
    const auto& c = loop_->counters();
    AddValue(out, "xfer_heartbeats_missed_total", MetricType::kCounter,
             "Times a peer stayed silent for half the heartbeat timeout (heartbeats late or missed).",
             static_cast<double>(c.peers_late.load()));
    AddValue(out, "xfer_peers_declared_dead_total", MetricType::kCounter,
             "Sessions ended because the peer stayed silent for the heartbeat timeout.",
             static_cast<double>(c.peers_declared_dead.load()));
  }
  uint64_t queued = 0, queued_bytes = 0, in_rings = 0, in_rings_bytes = 0;
  notifies_->Queued(&queued, &queued_bytes);
  inbox_->Pending(&in_rings, &in_rings_bytes);
  queued += in_rings;
  queued_bytes += in_rings_bytes;
  AddValue(out, "xfer_notifications_queued", MetricType::kGauge,
           "Notifications received and not yet taken (GetNotifies), rings included.",
           static_cast<double>(queued));
  AddValue(out, "xfer_notifications_queued_bytes", MetricType::kGauge,
           "The queued notifications' bytes.", static_cast<double>(queued_bytes));
  AddValue(out, "xfer_staging_waits_total", MetricType::kCounter,
           "Times a batch waited for a staging buffer (all of them were in use).",
           static_cast<double>(staging_ ? staging_->waits() : 0));
}

}  // namespace xfer
