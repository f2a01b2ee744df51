#include "row.h"

#include <algorithm>
#include <cstdio>

namespace xfer::bench {

json OptNum(double v) { return v >= 0 ? json(v) : json(nullptr); }

json RowToJson(const Row& r) {
  return {{"test", r.test},
          {"op", TestOp(r.test) == Op::kWrite ? "WRITE" : "READ"},
          {"dir", r.dir.empty() ? json(nullptr) : json(r.dir)},
          {"transport", r.transport},
          {"direction", r.direction},
          {"path", r.path},
          {"bytes", r.bytes},
          {"iters", r.requests},
          {"descriptors", r.descs},
          {"seconds", r.seconds},
          {"bw_avg_GBps", r.bw_avg},
          {"bw_avg_Gbps", r.bw_avg * 8},
          {"bw_peak_GBps", r.bw_peak},
          {"msg_rate_Mops", r.msg_rate},
          {"lat_us",
           {{"samples", r.lat.n},
            {"min", r.lat.min},
            {"max", r.lat.max},
            {"typical", r.lat.median},
            {"avg", r.lat.avg},
            {"stdev", r.lat.stdev},
            {"p50", r.lat.p50},
            {"p99", r.lat.p99},
            {"p99_9", r.lat.p999}}},
          {"cpu_pct", OptNum(r.cpu)},
          {"server_cpu_pct", OptNum(r.srv_cpu)},
          {"verify", r.verify.empty() ? json(nullptr) : json(r.verify)},
          {"shm_bytes", r.shm_bytes >= 0 ? json(r.shm_bytes) : json(nullptr)},
          {"transport_bytes", r.transport_bytes >= 0 ? json(r.transport_bytes) : json(nullptr)},
          {"cuda_bytes", r.cuda_bytes >= 0 ? json(r.cuda_bytes) : json(nullptr)},
          {"staged_bytes", r.staged_bytes >= 0 ? json(r.staged_bytes) : json(nullptr)},
          {"staged_via", r.staged_via},
          {"nic_bytes", r.nic_bytes}};
}

Row RowFromJson(const json& j) {
  Row r;
  r.test = j.at("test");
  r.transport = j.value("transport", "");
  r.bytes = j.at("bytes");
  r.requests = j.at("iters");
  r.descs = j.at("descriptors");
  r.seconds = j.at("seconds");
  r.bw_avg = j.at("bw_avg_GBps");
  r.bw_peak = j.at("bw_peak_GBps");
  r.msg_rate = j.at("msg_rate_Mops");
  const json& l = j.at("lat_us");
  r.lat.n = l.at("samples");
  r.lat.min = l.at("min");
  r.lat.max = l.at("max");
  r.lat.median = l.at("typical");
  r.lat.avg = l.at("avg");
  r.lat.stdev = l.at("stdev");
  r.lat.p50 = l.at("p50");
  r.lat.p99 = l.at("p99");
  r.lat.p999 = l.at("p99_9");
  r.cpu = j.at("cpu_pct").is_null() ? -1 : j.at("cpu_pct").get<double>();
  r.verify = j.at("verify").is_null() ? "" : j.at("verify").get<std::string>();
  r.shm_bytes = j.at("shm_bytes").is_null() ? -1 : j.at("shm_bytes").get<int64_t>();
  r.transport_bytes = j.at("transport_bytes").is_null() ? -1 : j.at("transport_bytes").get<int64_t>();
  r.cuda_bytes = j.at("cuda_bytes").is_null() ? -1 : j.at("cuda_bytes").get<int64_t>();
  r.staged_bytes = j.at("staged_bytes").is_null() ? -1 : j.at("staged_bytes").get<int64_t>();
  r.staged_via = j.value("staged_via", "");
  if (j.contains("nic_bytes"))
    r.nic_bytes = j.at("nic_bytes").get<std::vector<std::pair<std::string, int64_t>>>();
  return r;
}

std::string PathText(const PathTotals& p) {
  if (!p.known) return "unknown (the engine did not report it)";
  const int64_t total = p.total();
  auto pct = [&](int64_t v) {
    if (total <= 0) return std::string("0%");
    double x = 100.0 * double(v) / double(total);
    if (v > 0 && v < total) x = std::min(99.0, std::max(1.0, x));  // never "100%" unless all
    char b[16];
    std::snprintf(b, sizeof b, "%.0f%%", x);
    return std::string(b);
  };
  auto item = [&](const std::string& name, int64_t v, const std::string& via = "") {
    return name + " " + pct(v) + " (" + std::to_string(v) + " bytes" +
           (v > 0 && !via.empty() ? " via " + via : "") + ")";
  };
  std::string s = item("shm", p.shm);
  if (p.transport != "shm" && p.transport != "cuda")
    s += ", " + item(p.transport.empty() ? std::string("transport") : p.transport, p.link);
  else if (p.link > 0)
    s += ", " + item("transport", p.link);
  s += ", " + item("cuda", p.cuda) + ", " + item("staged", p.staged, p.staged_via);
  if (total != p.moved)
    s += "; WARNING: the engine accounted " + std::to_string(total) + " bytes of the " +
         std::to_string(p.moved) + " moved";
  return s;
}

PathTotals SumPaths(const std::vector<Row>& rows, const std::string& test, const std::string& dir,
                    uint64_t batch) {
  PathTotals p;
  bool any = false;
  for (const Row& r : rows) {
    if (r.test != test || r.dir != dir) continue;
    any = true;
    p.transport = r.transport;
    if (r.shm_bytes < 0 || r.transport_bytes < 0 || r.cuda_bytes < 0 || r.staged_bytes < 0) p.known = false;
    p.shm += std::max<int64_t>(0, r.shm_bytes);
    p.link += std::max<int64_t>(0, r.transport_bytes);
    p.cuda += std::max<int64_t>(0, r.cuda_bytes);
    p.staged += std::max<int64_t>(0, r.staged_bytes);
    if (p.staged_via.empty()) p.staged_via = r.staged_via;
    p.moved += int64_t(r.requests * batch * r.bytes);
  }
  if (!any) p.known = false;
  return p;
}

std::string NicText(const std::vector<Row>& rows, const std::string& test, const std::string& dir) {
  std::vector<std::pair<std::string, int64_t>> sum;
  int64_t total = 0;
  for (const Row& r : rows) {
    if (r.test != test || r.dir != dir) continue;
    for (const auto& nic : r.nic_bytes) {  // (not a structured binding: clang 14 cannot capture one)
      auto it = std::find_if(sum.begin(), sum.end(), [&](const auto& e) { return e.first == nic.first; });
      if (it == sum.end()) it = sum.insert(sum.end(), {nic.first, 0});
      it->second += nic.second;
      total += nic.second;
    }
  }
  std::string s;
  for (const auto& [pair, bytes] : sum) {
    char pct[16];
    std::snprintf(pct, sizeof pct, "%.0f%%", total > 0 ? 100.0 * double(bytes) / double(total) : 0.0);
    s += (s.empty() ? "" : ", ") + pair + " " + pct + " (" + std::to_string(bytes) + " bytes)";
  }
  return s;
}

Row SumRows(const Row& a, const Row& b) {
  Row s = a;
  s.dir = "sum";
  s.requests = a.requests + b.requests;
  s.descs = a.descs + b.descs;
  s.seconds = std::max(a.seconds, b.seconds);
  s.bw_avg = a.bw_avg + b.bw_avg;
  s.bw_peak = a.bw_peak + b.bw_peak;
  s.msg_rate = a.msg_rate + b.msg_rate;
  s.lat.p50 = std::max(a.lat.p50, b.lat.p50);  // the worse side's figures
  s.lat.p99 = std::max(a.lat.p99, b.lat.p99);
  s.lat.p999 = std::max(a.lat.p999, b.lat.p999);
  s.lat.min = std::min(a.lat.min, b.lat.min);
  s.lat.max = std::max(a.lat.max, b.lat.max);
  s.lat.median = std::max(a.lat.median, b.lat.median);
  s.lat.avg = (a.lat.avg * double(a.lat.n) + b.lat.avg * double(b.lat.n)) /
              double(std::max<uint64_t>(1, a.lat.n + b.lat.n));
  s.lat.stdev = std::max(a.lat.stdev, b.lat.stdev);
  s.lat.n = a.lat.n + b.lat.n;
  s.verify.clear();
  auto add = [](int64_t x, int64_t y) { return x >= 0 && y >= 0 ? x + y : -1; };
  s.shm_bytes = add(a.shm_bytes, b.shm_bytes);
  s.transport_bytes = add(a.transport_bytes, b.transport_bytes);
  s.cuda_bytes = add(a.cuda_bytes, b.cuda_bytes);
  s.staged_bytes = add(a.staged_bytes, b.staged_bytes);
  s.staged_via = a.staged_via.empty() ? b.staged_via : a.staged_via;
  return s;
}

}  // namespace xfer::bench
