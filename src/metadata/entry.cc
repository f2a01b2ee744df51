#include "metadata/entry.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace xfer::metadata {

using json = nlohmann::json;

std::string WriteEntry(const ClusterPeer& me, std::vector<std::string> tags) {
  std::sort(tags.begin(), tags.end());
  tags.erase(std::unique(tags.begin(), tags.end()), tags.end());
  tags.erase(std::remove(tags.begin(), tags.end(), std::string()), tags.end());
  return json{{"name", me.name},
              {"address", me.address},
              {"incarnation", me.incarnation},
              {"host_id", me.host_id},
              {"tags", tags}}
      .dump();
}

bool ReadEntry(const std::string& value, ClusterPeer* peer) {
  const json j = json::parse(value, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return false;
  try {
    peer->name = j.at("name").get<std::string>();
    peer->address = j.at("address").get<std::string>();
    peer->incarnation = j.at("incarnation").get<uint64_t>();
    peer->host_id = j.value("host_id", std::string());
    peer->tags = j.value("tags", std::vector<std::string>());
  } catch (const json::exception&) {
    return false;
  }
  return !peer->name.empty() && !peer->address.empty();
}

}  // namespace xfer::metadata
