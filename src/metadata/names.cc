#include <algorithm>
#include <cctype>

#include "metadata/directory.h"

namespace xfer::metadata {

Status CheckClusterName(const std::string& name) {
  const bool ok = !name.empty() && name.size() <= 128 && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
  if (ok) return Status::Ok();
  return {StatusCode::kInvalidArgument,
          "cluster name '" + name + "': use 1..128 of A-Z a-z 0-9 . _ - (it must not look like host:port)"};
}

}  // namespace xfer::metadata
