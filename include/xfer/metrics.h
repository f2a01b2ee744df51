// A snapshot of an engine's metrics (Engine::GetMetrics), shaped as Prometheus sees them:
// each metric has a name, a type, help text and samples told apart by their labels.
// docs/metrics.md lists every metric.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace xfer {

enum class MetricType : uint8_t { kCounter, kGauge, kHistogram };

struct MetricSample {
  std::vector<std::pair<std::string, std::string>> labels;  // in the order they are printed
  // A counter's or gauge's value; a histogram's count of observations.
  double value = 0;
  // Histograms only: the cumulative count of observations at or below each upper bound,
  // ascending (the last bound is +Inf and its count is `value`), and the observations' sum.
  std::vector<std::pair<double, uint64_t>> buckets;
  double sum = 0;

  // The label's value, or "" when the sample has no such label.
  std::string_view Label(std::string_view name) const;
};

struct Metric {
  std::string name;  // e.g. "xfer_transferred_bytes_total"
  MetricType type = MetricType::kCounter;
  std::string help;
  std::vector<MetricSample> samples;  // a labelled metric lists those that were ever touched
};

struct MetricsSnapshot {
  std::vector<Metric> metrics;

  // The metric of that name, or null.
  const Metric* Find(std::string_view name) const;
  // The sum of the values of the metric's samples that carry every given label with the given
  // value (none given: all of them); 0 when there is no such metric.
  using LabelFilter = std::initializer_list<std::pair<std::string_view, std::string_view>>;
  double Sum(std::string_view name, LabelFilter labels = {}) const;
  // The Prometheus text exposition format (version 0.0.4), with HELP and TYPE lines.
  std::string PrometheusText() const;
};

}  // namespace xfer
