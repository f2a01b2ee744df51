#include "util/host.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

namespace xfer::host {

std::string BootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id.empty() ? "unknown-boot-id" : id;
}

uint64_t RandomU64() {
  std::random_device rd;
  uint64_t v = 0;
  while (v == 0) v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return v;
}

uint64_t LastLevelCacheBytes() {
  uint64_t best = 0;
  for (int i = 0; i < 8; ++i) {
    std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/size");
    uint64_t n = 0;
    std::string unit;
    if (!(in >> n)) continue;
    std::getline(in, unit);
    if (!unit.empty() && (unit[0] == 'K' || unit[0] == 'k')) n <<= 10;
    if (!unit.empty() && (unit[0] == 'M' || unit[0] == 'm')) n <<= 20;
    best = std::max(best, n);
  }
  return best ? best : 32ull << 20;
}

std::vector<std::string> RdmaDevices() {
  std::vector<std::string> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/sys/class/infiniband", ec), end; !ec && it != end;
       it.increment(ec)) {
    out.push_back(it->path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace xfer::host
