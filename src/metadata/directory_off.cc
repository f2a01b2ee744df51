// A build without libcurl or nlohmann-json: no cluster metadata (directory.h).
#include "metadata/directory.h"

namespace xfer::metadata {

Status Directory::Start(Options, std::unique_ptr<Directory>*) {
  return {StatusCode::kUnsupported,
          "EngineOptions::metadata needs a build with libcurl and nlohmann-json "
          "(apt-get install libcurl4-openssl-dev nlohmann-json3-dev, then build again)"};
}

}  // namespace xfer::metadata
