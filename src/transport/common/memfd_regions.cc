#include "transport/common/memfd_regions.h"

#include "util/bytes.h"
#include "util/log.h"

namespace xfer::transport {
namespace {

// The blob: the owner's memfd descriptor (i32), then the key in the memfd's name (u64).
bool ParseRegionBlob(std::string_view b, int32_t* fd, uint64_t* key) {
  return bytes::Take(&b, fd) && bytes::Take(&b, key) && b.empty() && *key != 0;
}

}  // namespace

std::string MemfdRegionBlob(int32_t fd, uint64_t key) {
  std::string b;
  bytes::Put(&b, fd);
  bytes::Put(&b, key);
  return b;
}

uint8_t* MapMemfdRegion(const shared_memory::PeerMapper& mapper, const std::string& peer_name,
                        uint64_t peer_incarnation, RemoteRegion& r) {
  static const char kMapping = 0;  // the key of the mapping, one for every backend that asks
  Status failure;
  uint8_t* base = r.OpenOnce(
      &kMapping,
      [&](std::shared_ptr<void>* handle, uint8_t** at) {
        int32_t fd = -1;
        uint64_t key = 0;
        const std::string* blob = FindBlob(r.blobs, kMemfdBlob);
        if (blob == nullptr || !ParseRegionBlob(*blob, &fd, &key)) {
          return Status{StatusCode::kUnsupported, "the region is not the peer's AllocMem memory"};
        }
        std::shared_ptr<shared_memory::Mapping> m;
        const bool writable = r.info.access == PeerAccess::kReadWrite;
        Status s =
            mapper.Map(fd, shared_memory::SegmentName(peer_incarnation, key), r.info.len, writable, &m);
        if (s.ok()) {
          *at = m->base();
          *handle = std::move(m);
        }
        return s;
      },
      &failure);
  if (!failure.ok() && failure.code() != StatusCode::kUnsupported) {
    XLOG(WARN) << "cannot map region " << r.id << " of peer " << peer_name
               << " (its transfers take another route): " << failure.ToString();
  }
  return base;
}

}  // namespace xfer::transport
