// An engine's entry in a metadata service, the same JSON in every service:
// {"name", "address", "incarnation", "host_id", "tags"}.
#pragma once

#include <string>
#include <vector>

#include "xfer/types.h"

namespace xfer::metadata {

// me's entry with these tags (sorted, repeats and empty ones dropped).
std::string WriteEntry(const ClusterPeer& me, std::vector<std::string> tags);
// False when value is not an engine's entry (not JSON, a field missing or of the wrong type).
bool ReadEntry(const std::string& value, ClusterPeer* peer);

}  // namespace xfer::metadata
