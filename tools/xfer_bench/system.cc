#include "system.h"

#include <sys/utsname.h>

#include <fstream>

namespace xfer::bench {
namespace {

std::string CpuModel() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      if (p != std::string::npos) return line.substr(p + 2);
    }
  }
  return "unknown CPU";
}

// Transports with links per peer (EngineOptions::tcp.links, ucx.endpoints).
bool TransportHasLinks(const std::string& t) { return t == "tcp" || t == "ucx"; }

}  // namespace

std::string MachineLine() {
  utsname u{};
  uname(&u);
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s, %ld CPUs (%s), kernel %s", u.nodename, sysconf(_SC_NPROCESSORS_ONLN),
                CpuModel().c_str(), u.release);
  return buf;
}

std::string SelfExe() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  buf[n] = 0;
  return buf;
}

std::string LinksNote(const Config& c, const std::string& transport) {
  const int def = EngineOptions{}.tcp.links;
  if (!transport.empty() && transport != "any" && !TransportHasLinks(transport))
    return c.links == 0 ? "n/a for transport " + transport
                        : std::to_string(c.links) + " requested: n/a for transport " + transport;
  if (transport == "any")
    return (c.links ? std::to_string(c.links) : std::to_string(def) + " (default)") +
           " for tcp and ucx; n/a for the other transports";
  return c.links ? std::to_string(c.links) : std::to_string(def) + " (default)";
}

EngineOptions MakeEngineOptions(const Config& c) {
  EngineOptions o;
  if (c.streams > 0) o.streams = c.streams;
  if (c.slice_bytes > 0) o.slice_bytes = c.slice_bytes;
  if (c.batch_bytes > 0) o.batch_bytes = c.batch_bytes;
  if (c.spin_us >= 0) o.spin = std::chrono::microseconds(c.spin_us);
  if (c.links > 0) o.tcp.links = o.ucx.endpoints = c.links;  // connections or endpoints per peer
  o.transport = c.transport;
  o.host_id = c.host_id;
  o.secret_file = c.secret_file;
  o.metrics = !c.no_metrics;
  o.metrics_listen = c.metrics_listen;
  o.staging = c.buffer_pool ? Staging::kAlways : Staging::kAuto;
  o.tcp.checksum = c.checksum;
  o.tcp.nics = SplitList(c.nics);
  if (c.staging_buffers > 0) o.staging_buffers = c.staging_buffers;
  if (c.staging_bytes > 0) o.staging_buffer_bytes = c.staging_bytes;
  for (const std::string& kv : c.set) {
    const size_t eq = kv.find('=');  // (checked when parsed: SetOptionArg)
    (void)SetOption(&o, kv.substr(0, eq), eq == std::string::npos ? "" : kv.substr(eq + 1));
  }
  return o;
}

std::string SetOptionArg(const std::string& kv) {
  const size_t eq = kv.find('=');
  if (eq == std::string::npos || eq == 0)
    return "--set takes KEY=VALUE, e.g. --set tcp.links=4 (not '" + kv + "')";
  EngineOptions o;
  const Status s = SetOption(&o, kv.substr(0, eq), kv.substr(eq + 1));
  return s.ok() ? std::string() : "--set: " + s.message();
}

uint64_t PageKbAt(const void* p) {
  std::ifstream f("/proc/self/smaps");
  const uint64_t a = reinterpret_cast<uint64_t>(p);
  std::string line;
  bool in = false;
  while (std::getline(f, line)) {
    unsigned long long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      in = a >= lo && a < hi;
      continue;
    }
    unsigned long long kb = 0;
    if (in && std::sscanf(line.c_str(), "KernelPageSize: %llu kB", &kb) == 1) return kb;
  }
  return 0;
}

}  // namespace xfer::bench
