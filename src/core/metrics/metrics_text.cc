// MetricsSnapshot's lookups, and its Prometheus text exposition format (version 0.0.4).
#include <charconv>
#include <cmath>

#include "xfer/metrics.h"

namespace xfer {
namespace {

std::string_view TypeName(MetricType t) {
  switch (t) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

// The shortest text that reads back as v; "+Inf" for infinity.
void AppendNumber(std::string* out, double v) {
  if (std::isinf(v)) {
    out->append(v > 0 ? "+Inf" : "-Inf");
    return;
  }
  if (std::isnan(v)) {
    out->append("NaN");
    return;
  }
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  out->append(buf, end);
}

// HELP text escapes backslash and newline; label values also the double quote.
void AppendEscaped(std::string* out, std::string_view s, bool quote) {
  for (char c : s) {
    if (c == '\\') {
      out->append("\\\\");
    } else if (c == '\n') {
      out->append("\\n");
    } else if (c == '"' && quote) {
      out->append("\\\"");
    } else {
      out->push_back(c);
    }
  }
}

using Labels = std::vector<std::pair<std::string, std::string>>;

void AppendSample(std::string* out, std::string_view name, std::string_view suffix, const Labels& labels,
                  const std::pair<std::string, std::string>* extra, double v) {
  out->append(name).append(suffix);
  if (!labels.empty() || extra != nullptr) {
    out->push_back('{');
    bool first = true;
    auto label = [&](const std::pair<std::string, std::string>& l) {
      if (!first) out->push_back(',');
      first = false;
      out->append(l.first).append("=\"");
      AppendEscaped(out, l.second, true);
      out->push_back('"');
    };
    for (const auto& l : labels) label(l);
    if (extra != nullptr) label(*extra);
    out->push_back('}');
  }
  out->push_back(' ');
  AppendNumber(out, v);
  out->push_back('\n');
}

}  // namespace

std::string_view MetricSample::Label(std::string_view name) const {
  for (const auto& [k, v] : labels) {
    if (k == name) return v;
  }
  return {};
}

const Metric* MetricsSnapshot::Find(std::string_view name) const {
  for (const auto& m : metrics) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

double MetricsSnapshot::Sum(std::string_view name, LabelFilter labels) const {
  const Metric* m = Find(name);
  if (m == nullptr) return 0;
  double sum = 0;
  for (const auto& s : m->samples) {
    bool match = true;
    for (const auto& [k, v] : labels) match = match && s.Label(k) == v;
    if (match) sum += s.value;
  }
  return sum;
}

std::string MetricsSnapshot::PrometheusText() const {
  std::string out;
  for (const auto& m : metrics) {
    out.append("# HELP ").append(m.name).push_back(' ');
    AppendEscaped(&out, m.help, false);
    out.append("\n# TYPE ").append(m.name).push_back(' ');
    out.append(TypeName(m.type)).push_back('\n');
    for (const auto& s : m.samples) {
      if (m.type != MetricType::kHistogram) {
        AppendSample(&out, m.name, "", s.labels, nullptr, s.value);
        continue;
      }
      for (const auto& [bound, count] : s.buckets) {
        std::pair<std::string, std::string> le{"le", ""};
        AppendNumber(&le.second, bound);
        AppendSample(&out, m.name, "_bucket", s.labels, &le, static_cast<double>(count));
      }
      AppendSample(&out, m.name, "_sum", s.labels, nullptr, s.sum);
      AppendSample(&out, m.name, "_count", s.labels, nullptr, s.value);
    }
  }
  return out;
}

}  // namespace xfer
