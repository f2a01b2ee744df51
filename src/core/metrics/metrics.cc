#include "core/metrics/metrics.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <limits>

namespace xfer {

void AddValue(MetricsSnapshot* out, std::string name, MetricType type, std::string help, double value,
              MetricLabels labels) {
  for (auto& m : out->metrics) {
    if (m.name == name) {
      m.samples.push_back(ValueSample(std::move(labels), value));
      return;
    }
  }
  out->metrics.push_back({std::move(name), type, std::move(help), {ValueSample(std::move(labels), value)}});
}
namespace {

std::atomic<uint64_t> next_metrics_id{1};

// The duration buckets' upper bounds in the clock's ticks, compared as integers.
constexpr auto kDurationTicks = [] {
  std::array<int64_t, EngineMetrics::kDurationBuckets - 1> ticks{};
  for (size_t i = 0; i < ticks.size(); ++i) {
    ticks[i] = std::chrono::duration_cast<EngineMetrics::Clock::duration>(
                   std::chrono::duration<double>(EngineMetrics::kDurationBounds[i]))
                   .count();
  }
  return ticks;
}();

int DurationBucket(EngineMetrics::Clock::duration took) {
  // (A bucket counts durations up to and including its bound, as Prometheus' "le" says.)
  return static_cast<int>(std::lower_bound(kDurationTicks.begin(), kDurationTicks.end(), took.count()) -
                          kDurationTicks.begin());
}

int DescriptorBucket(uint64_t descriptors) {
  // Upper bounds 1, 2, 4, ...: the bucket is ceil(log2(descriptors)).
  const int b = std::bit_width(std::max<uint64_t>(descriptors, 1) - 1);
  return std::min(b, EngineMetrics::kDescBuckets - 1);
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

EngineMetrics::EngineMetrics(uint32_t max_peers, std::vector<std::string> backends)
    : id_(next_metrics_id.fetch_add(1)),
      max_peers_(max_peers),
      backends_(std::move(backends)),
      shared_shard_(std::make_unique<Shard>(max_peers + 1, true)) {
  if (backends_.size() > kBackends) std::abort();  // (a build with more backends: raise kBackends)
}

EngineMetrics::PeerSlot EngineMetrics::SlotOf(const std::string& peer) {
  std::lock_guard lock(mu_);
  if (auto it = slots_.find(peer); it != slots_.end()) return it->second;
  if (peer_names_.size() >= max_peers_) return static_cast<PeerSlot>(max_peers_);  // "other"
  // (A label value must be UTF-8: a peer's name is whatever its hello said.)
  std::string label;
  for (unsigned char c : peer) label.push_back(c >= 0x20 && c < 0x7f ? static_cast<char>(c) : '?');
  peer_names_.push_back(label);
  return slots_.emplace(peer, static_cast<PeerSlot>(peer_names_.size() - 1)).first->second;
}

void EngineMetrics::SessionOpened(const std::string& key) {
  ++events_.sessions_opened;
  std::lock_guard lock(mu_);
  if (session_keys_.count(key) != 0) {
    ++events_.reconnects;
  } else if (session_keys_.size() < (64u << 10)) {
    session_keys_.insert(key);
  }
}

EngineMetrics::Shard& EngineMetrics::MineSlow() {
  std::lock_guard lock(mu_);
  Shard*& shard = shard_of_thread_[std::this_thread::get_id()];
  if (shard == nullptr) {
    if (shards_.size() < kMaxShards) {
      shards_.push_back(std::make_unique<Shard>(max_peers_ + 1, false));
      shard = shards_.back().get();
    } else {
      shard = shared_shard_.get();
    }
  }
  this_thread_shards_[this_thread_next_shard_++ % kCachedShards] = {id_, shard};
  return *shard;
}

void EngineMetrics::Moved(PeerSlot peer, Op op, int backend, uint64_t bytes) {
  Shard& s = Mine();
  s.bytes[Cell(peer, op, backend)].Add(bytes, s.shared);
}

void EngineMetrics::Started(Op op, uint64_t bytes) {
  Shard& s = Mine();
  const int o = static_cast<int>(op);
  s.started[o].Add(1, s.shared);
  s.started_bytes[o].Add(bytes, s.shared);
}

void EngineMetrics::Observe(Shard& s, Op op, int backend, Clock::duration took, uint64_t weight) {
  Histogram& h = s.duration[static_cast<int>(op)][backend];
  h.buckets[DurationBucket(took)].Add(weight, s.shared);
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(took).count();
  h.sum_ns.Add(static_cast<uint64_t>(std::max<int64_t>(ns, 0)) * weight, s.shared);
}

void EngineMetrics::Ended(PeerSlot peer, Op op, int backend, uint64_t bytes, uint64_t descriptors,
                          Clock::time_point start, StatusCode code) {
  Shard& s = Mine();
  const int o = static_cast<int>(op);
  Observe(s, op, backend, Clock::now() - start, 1);
  s.descriptors[o][DescriptorBucket(descriptors)].Add(1, s.shared);
  s.descriptors_sum[o].Add(descriptors, s.shared);
  s.ended[o].Add(1, s.shared);
  s.ended_bytes[o].Add(bytes, s.shared);
  if (code == StatusCode::kOk) {
    s.ok[Cell(peer, op, backend)].Add(1, s.shared);
  } else {
    std::lock_guard lock(mu_);
    ++failed_[{peer, o, backend, static_cast<int>(code)}];
  }
}

void EngineMetrics::Refused(Op op, StatusCode code) {
  std::lock_guard lock(mu_);
  ++refused_[{static_cast<int>(op), static_cast<int>(code)}];
}

// ------------------------------------------------------------------------------ snapshot
struct EngineMetrics::Totals {
  std::vector<uint64_t> bytes, ok;
  uint64_t duration[kOps][kBackends][kDurationBuckets] = {};
  uint64_t duration_ns[kOps][kBackends] = {};
  uint64_t descriptors[kOps][kDescBuckets] = {};
  uint64_t descriptors_sum[kOps] = {};
  uint64_t started[kOps] = {}, started_bytes[kOps] = {}, ended[kOps] = {}, ended_bytes[kOps] = {};
};

EngineMetrics::Totals EngineMetrics::Sum() const {
  Totals t;
  t.bytes.assign(shared_shard_->bytes.size(), 0);
  t.ok.assign(shared_shard_->ok.size(), 0);
  auto add = [&t](const Shard& s) {
    for (size_t i = 0; i < s.bytes.size(); ++i) {
      t.bytes[i] += s.bytes[i].Get();
      t.ok[i] += s.ok[i].Get() + s.inline_ok[i].Get();
      // (An inline copy is a request of one descriptor.)
      const int o = static_cast<int>(i / kBackends % kOps);
      t.descriptors[o][0] += s.inline_ok[i].Get();
      t.descriptors_sum[o] += s.inline_ok[i].Get();
    }
    for (int o = 0; o < kOps; ++o) {
      for (int b = 0; b < kBackends; ++b) {
        for (int k = 0; k < kDurationBuckets; ++k) t.duration[o][b][k] += s.duration[o][b].buckets[k].Get();
        t.duration_ns[o][b] += s.duration[o][b].sum_ns.Get();
      }
      for (int k = 0; k < kDescBuckets; ++k) t.descriptors[o][k] += s.descriptors[o][k].Get();
      t.descriptors_sum[o] += s.descriptors_sum[o].Get();
      t.started[o] += s.started[o].Get();
      t.started_bytes[o] += s.started_bytes[o].Get();
      t.ended[o] += s.ended[o].Get();
      t.ended_bytes[o] += s.ended_bytes[o].Get();
    }
  };
  for (const auto& s : shards_) add(*s);
  add(*shared_shard_);
  return t;
}

namespace {

Metric NewMetric(std::string name, MetricType type, std::string help) {
  return {std::move(name), type, std::move(help), {}};
}

MetricSample HistogramSample(MetricLabels labels, const uint64_t* counts, int n, const double* bounds,
                             double sum) {
  MetricSample s = ValueSample(std::move(labels), 0);
  s.sum = sum;
  uint64_t cumulative = 0;
  for (int k = 0; k < n; ++k) {
    cumulative += counts[k];
    s.buckets.emplace_back(k + 1 < n ? bounds[k] : std::numeric_limits<double>::infinity(), cumulative);
  }
  s.value = static_cast<double>(cumulative);
  return s;
}

}  // namespace

void EngineMetrics::Snapshot(MetricsSnapshot* out) const {
  std::lock_guard lock(mu_);
  const Totals t = Sum();
  auto peer_name = [this](size_t slot) { return slot < peer_names_.size() ? peer_names_[slot] : "other"; };
  auto op_name = [](int o) { return Lower(OpName(static_cast<Op>(o))); };

  Metric bytes = NewMetric("xfer_transferred_bytes_total", MetricType::kCounter,
                           "Bytes this engine moved to (write) or from (read) peers, by backend and peer.");
  Metric requests = NewMetric("xfer_requests_total", MetricType::kCounter,
                              "Requests that ended, by how they ended (status: ok or the failure's code).");
  for (size_t p = 0; p <= max_peers_; ++p) {
    for (int o = 0; o < kOps; ++o) {
      for (size_t b = 0; b < backends_.size(); ++b) {
        const size_t cell = (p * kOps + o) * kBackends + b;
        if (t.bytes[cell] == 0 && t.ok[cell] == 0) continue;
        MetricLabels labels{{"op", op_name(o)}, {"backend", backends_[b]}, {"peer", peer_name(p)}};
        if (t.bytes[cell] != 0)
          bytes.samples.push_back(ValueSample(labels, static_cast<double>(t.bytes[cell])));
        if (t.ok[cell] != 0) {
          labels.emplace_back("status", "ok");
          requests.samples.push_back(ValueSample(std::move(labels), static_cast<double>(t.ok[cell])));
        }
      }
    }
  }
  for (const auto& [key, n] : failed_) {
    const auto [p, o, b, code] = key;
    requests.samples.push_back(ValueSample({{"op", op_name(o)},
                                            {"backend", backends_[b]},
                                            {"peer", peer_name(p)},
                                            {"status", Lower(StatusCodeName(static_cast<StatusCode>(code)))}},
                                           static_cast<double>(n)));
  }
  Metric refused =
      NewMetric("xfer_requests_refused_total", MetricType::kCounter,
                "Requests refused before they started (bad input, unknown or lost peer), by status.");
  for (const auto& [key, n] : refused_) {
    refused.samples.push_back(ValueSample(
        {{"op", op_name(key.first)}, {"status", Lower(StatusCodeName(static_cast<StatusCode>(key.second)))}},
        static_cast<double>(n)));
  }

  Metric duration = NewMetric("xfer_request_duration_seconds", MetricType::kHistogram,
                              "Time from submission to the end of a request, by op and backend.");
  for (int o = 0; o < kOps; ++o) {
    for (size_t b = 0; b < backends_.size(); ++b) {
      const uint64_t* counts = t.duration[o][b];
      if (std::all_of(counts, counts + kDurationBuckets, [](uint64_t c) { return c == 0; })) continue;
      duration.samples.push_back(HistogramSample({{"op", op_name(o)}, {"backend", backends_[b]}}, counts,
                                                 kDurationBuckets, kDurationBounds,
                                                 t.duration_ns[o][b] * 1e-9));
    }
  }
  Metric descs =
      NewMetric("xfer_request_descriptors", MetricType::kHistogram, "Descriptors per request, by op.");
  static const auto desc_bounds = [] {
    std::vector<double> v;
    for (int k = 0; k + 1 < kDescBuckets; ++k) v.push_back(static_cast<double>(uint64_t{1} << k));
    return v;
  }();
  for (int o = 0; o < kOps; ++o) {
    descs.samples.push_back(HistogramSample({{"op", op_name(o)}}, t.descriptors[o], kDescBuckets,
                                            desc_bounds.data(), static_cast<double>(t.descriptors_sum[o])));
  }
  Metric in_flight = NewMetric("xfer_requests_in_flight", MetricType::kGauge,
                               "Requests submitted and not yet ended, by op.");
  Metric bytes_in_flight = NewMetric("xfer_request_bytes_in_flight", MetricType::kGauge,
                                     "Bytes of the requests in flight, by op.");
  for (int o = 0; o < kOps; ++o) {
    // (Shards are read one after another: clamped, as an end may be seen before its start.)
    auto gap = [](uint64_t a, uint64_t b) { return static_cast<double>(a > b ? a - b : 0); };
    in_flight.samples.push_back(ValueSample({{"op", op_name(o)}}, gap(t.started[o], t.ended[o])));
    bytes_in_flight.samples.push_back(
        ValueSample({{"op", op_name(o)}}, gap(t.started_bytes[o], t.ended_bytes[o])));
  }

  for (Metric* m : {&bytes, &requests, &refused, &duration, &descs, &in_flight, &bytes_in_flight}) {
    out->metrics.push_back(std::move(*m));
  }
  auto counter = [out](std::string name, std::string help, const std::atomic<uint64_t>& v) {
    out->metrics.push_back(NewMetric(std::move(name), MetricType::kCounter, std::move(help)));
    out->metrics.back().samples.push_back(
        ValueSample({}, static_cast<double>(v.load(std::memory_order_relaxed))));
  };
  counter("xfer_sessions_opened_total", "Control sessions opened with peers, both ways.",
          events_.sessions_opened);
  counter("xfer_reconnects_total", "Sessions opened with a peer (by name) that had one before.",
          events_.reconnects);
  counter("xfer_notifications_sent_total", "Notifications that peers queued.", events_.notifies_sent);
  counter("xfer_notifications_unsent_total",
          "Notifications that peers refused (queue full) or that were lost with the session.",
          events_.notifies_unsent);
  counter("xfer_notifications_received_total",
          "Notifications from peers queued here (from a same-host peer's ring: once taken).",
          events_.notifies_received);
  counter("xfer_notifications_refused_total",
          "Notifications from peers refused here (queue full, or over the size limit).",
          events_.notifies_refused);
}

}  // namespace xfer
