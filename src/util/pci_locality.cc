#include "util/pci_locality.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <system_error>

namespace xfer::pci {
namespace fs = std::filesystem;

namespace {

bool AllHex(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isxdigit(c); });
}

// A host bridge's directory name: "pci0000:3a" (a domain of up to 8 digits: VMD's has 5).
bool IsHostBridge(const std::string& s) {
  const size_t colon = s.find(':');
  return s.compare(0, 3, "pci") == 0 && colon != std::string::npos && colon >= 7 && colon <= 11 &&
         AllHex(s.substr(3, colon - 3)) && s.size() == colon + 3 && AllHex(s.substr(colon + 1));
}

// The NUMA node of the device at `dir` or of its nearest ancestor that gives one.
int NumaNodeOf(fs::path dir, const fs::path& stop) {
  for (; !dir.empty() && dir != stop && dir != dir.parent_path(); dir = dir.parent_path()) {
    std::ifstream f(dir / "numa_node");
    int node = -1;
    if (f >> node) return node;
  }
  return -1;
}

// The place of the device whose sysfs directory `link` points to (a symlink into devices/).
Place PlaceOf(const std::string& sysfs, const fs::path& link) {
  std::error_code ec;
  const fs::path devices = fs::weakly_canonical(fs::path(sysfs) / "devices", ec);
  const fs::path dir = fs::canonical(link, ec);
  if (ec) return {};
  Place p;
  bool below_devices = false;
  fs::path walked;
  fs::path last_pci;
  for (const fs::path& part : dir) {
    walked /= part;
    if (!below_devices) {
      below_devices = walked == devices;
      continue;
    }
    const std::string s = part.string();
    if (p.path.empty()) {
      // The tree starts at a host bridge, below devices/ or deeper (platform devices,
      // Hyper-V's VMBus); devices/virtual/... never reaches one.
      if (IsHostBridge(s)) p.path.push_back(s);
    } else if (!NormalizeBusId(s).empty()) {
      p.path.push_back(s);
      last_pci = walked;
    } else {
      break;  // a function's child (virtio2, net/...): the PCI path ends above it
    }
  }
  if (p.path.size() < 2) return {};
  p.numa_node = NumaNodeOf(last_pci, devices);
  return p;
}

}  // namespace

const char* DistanceName(Distance d) {
  switch (d) {
    case Distance::kBridge:
      return "PXB";
    case Distance::kHostBridge:
      return "PHB";
    case Distance::kNumaNode:
      return "NODE";
    case Distance::kSystem:
      return "SYS";
    case Distance::kUnknown:
      break;
  }
  return "unknown";
}

std::string NormalizeBusId(const std::string& bus_id) {
  // [domain:]bus:device.function: the domain 4 to 8 hex digits (nvidia-smi prints 8, VMD's
  // have 5; leading zeros beyond 4 digits dropped), bus and device 2, function 1.
  std::string s = bus_id;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  const size_t dot = s.rfind('.');
  const size_t colon2 = s.rfind(':');
  if (dot == std::string::npos || colon2 == std::string::npos || dot < colon2) return {};
  const size_t colon1 = colon2 == 0 ? std::string::npos : s.rfind(':', colon2 - 1);
  std::string domain = colon1 == std::string::npos ? "0000" : s.substr(0, colon1);
  const std::string bus = s.substr(colon1 == std::string::npos ? 0 : colon1 + 1,
                                   colon2 - (colon1 == std::string::npos ? 0 : colon1 + 1));
  const std::string dev = s.substr(colon2 + 1, dot - colon2 - 1), fn = s.substr(dot + 1);
  while (domain.size() > 4 && domain[0] == '0') domain.erase(0, 1);
  if (domain.size() < 4 || domain.size() > 8 || bus.size() != 2 || dev.size() != 2 || fn.size() != 1)
    return {};
  if (!AllHex(domain) || !AllHex(bus) || !AllHex(dev) || fn[0] < '0' || fn[0] > '7') return {};
  return domain + ":" + bus + ":" + dev + "." + fn;
}

Place PlaceOfPciDevice(const std::string& sysfs, const std::string& bus_id) {
  const std::string id = NormalizeBusId(bus_id);
  if (id.empty()) return {};
  Place p = PlaceOf(sysfs, fs::path(sysfs) / "bus" / "pci" / "devices" / id);
  if (!p.path.empty() && p.path.back() != id) return {};
  return p;
}

Place PlaceOfNic(const std::string& sysfs, const std::string& nic) {
  if (nic.empty() || nic.find('/') != std::string::npos || nic == "." || nic == "..") return {};
  return PlaceOf(sysfs, fs::path(sysfs) / "class" / "net" / nic / "device");
}

Distance Between(const Place& a, const Place& b) {
  if (a.path.empty() || b.path.empty()) return Distance::kUnknown;
  if (a.path[0] != b.path[0]) {
    return a.numa_node == b.numa_node ? Distance::kNumaNode : Distance::kSystem;
  }
  // Under one host bridge: a bridge in common below it (the second element on) or not.
  return a.path.size() > 1 && b.path.size() > 1 && a.path[1] == b.path[1] ? Distance::kBridge
                                                                          : Distance::kHostBridge;
}

std::vector<RankedNic> RankNics(const std::string& sysfs, const std::string& bus_id,
                                const std::vector<std::string>& nics) {
  const Place device = PlaceOfPciDevice(sysfs, bus_id);
  std::vector<RankedNic> ranked;
  for (const auto& n : nics) ranked.push_back({n, Between(device, PlaceOfNic(sysfs, n))});
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const RankedNic& x, const RankedNic& y) { return x.distance < y.distance; });
  return ranked;
}

}  // namespace xfer::pci
