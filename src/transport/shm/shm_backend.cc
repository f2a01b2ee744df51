#include <atomic>

#include "transport/backend.h"
#include "transport/common/host_copy.h"
#include "transport/common/memfd_regions.h"
#include "util/bytes.h"
#include "util/host.h"
#include "util/log.h"

// Backend "shm": memory from Engine::AllocMem lives in a memfd; a same-host peer takes a
// duplicate of the descriptor (pidfd_getfd), maps it once, and moves bytes with memcpy.
namespace xfer::transport::shm {
namespace {

using shared_memory::PeerMapper;

using shared_memory::Available;
using shared_memory::Mapping;
using shared_memory::Segment;
using shared_memory::SegmentName;

// AllocMem host memory: the segment, and the key peers check its name against.
class Allocation final : public RegionResource {
 public:
  Allocation(std::unique_ptr<Segment> segment, uint64_t key) : segment(std::move(segment)), key(key) {}
  const std::unique_ptr<Segment> segment;
  const uint64_t key;
};

class ShmRoute final : public Route {
 public:
  ShmRoute(std::unique_ptr<PeerMapper> mapper, const PeerContext& peer, PlanLimits limits)
      : Route("shm", std::make_shared<CopyLink>(false), limits),
        mapper_(std::move(mapper)),
        peer_name_(peer.name),
        peer_incarnation_(peer.incarnation) {
    set_streaming_link(std::make_shared<CopyLink>(true));
  }
  bool Reach(MemType local, RemoteRegion& r, uint8_t** mapped) override {
    if (local != MemType::kHost || r.info.type != MemType::kHost) return false;
    *mapped = MapMemfdRegion(*mapper_, peer_name_, peer_incarnation_, r);
    return *mapped != nullptr;
  }
  std::string WhyNot(MemType local, const RemoteRegion& r) const override {
    if (local != MemType::kHost || r.info.type != MemType::kHost) return "shm: moves host memory only";
    return FindBlob(r.blobs, kMemfdBlob) == nullptr
               ? "shm: the region is not the peer's AllocMem memory"
               : "shm: the region could not be mapped (the log says why)";
  }
  bool CopiesInline(uint64_t len) const override { return OneSlice(len); }
  bool Stageable() const override { return false; }

 private:
  const std::unique_ptr<PeerMapper> mapper_;
  const std::string peer_name_;
  const uint64_t peer_incarnation_;
};

class ShmBackend final : public Backend {
 public:
  std::string_view name() const override { return "shm"; }
  std::string About() const override {
    return "Engine::AllocMem memory mapped by processes of this host (pidfd_getfd), moved with memcpy";
  }
  std::vector<options::Row> Options() const override {
    return {XFER_OPTION_BYTES("shm.streaming_copy_bytes", shm.streaming_copy_bytes, 1, 0,
                              "copies this long use non-temporal stores (0: the last-level cache's size)")};
  }

  Status Start(const EngineContext& ctx) override {
    incarnation_ = ctx.incarnation;
    options_ = *ctx.options;
    std::string why;
    offered_ = Available(&why);
    if (!offered_ && ctx.forced == "shm") return {StatusCode::kUnsupported, why};
    if (!offered_) {
      XLOG(WARN) << "shm not offered (peers' AllocMem memory goes through cma): " << why;
    }
    return Status::Ok();  // AllocMem memory is a memfd either way
  }
  std::optional<std::string> HelloBlob() const override {
    return offered_ ? std::optional<std::string>(std::string()) : std::nullopt;
  }

  bool Allocates(MemType type) const override { return type == MemType::kHost; }
  Status Allocate(uint64_t len, MemType type, const AllocOptions& options, uint64_t* addr, int32_t* device,
                  std::unique_ptr<RegionResource>* res) override {
    const uint64_t key = next_key_.fetch_add(1);
    std::unique_ptr<Segment> segment;
    Status s = Segment::Create(len, options.huge_pages, options.access == PeerAccess::kReadWrite,
                               SegmentName(incarnation_, key), &segment);
    if (!s.ok()) return s;
    *addr = reinterpret_cast<uint64_t>(segment->data());
    *device = -1;
    *res = std::make_unique<Allocation>(std::move(segment), key);
    return Status::Ok();
  }

  Status PrepareRegion(const RegionInfo&, const RegionResource* allocation, std::optional<std::string>* blob,
                       std::unique_ptr<RegionResource>*) override {
    if (auto* a = dynamic_cast<const Allocation*>(allocation)) {
      *blob = MemfdRegionBlob(a->segment->fd(), a->key);
    }
    return Status::Ok();
  }

  Status Connect(const PeerContext& peer, std::shared_ptr<Route>* route) override {
    if (!offered_) return {StatusCode::kUnsupported, "shm: off here (no pidfd_getfd)"};
    if (!peer.same_host) return {StatusCode::kUnsupported, "shm: the peer is on another host"};
    if (peer.same_process) return {StatusCode::kUnsupported, "shm: the peer is this process"};
    std::unique_ptr<PeerMapper> mapper;
    Status s = PeerMapper::Open(peer.pid, peer.pidfd, &mapper);
    if (!s.ok()) {
      XLOG(WARN) << "peer " << peer.name << ": " << s.ToString();
      return s;
    }
    // memcpy has no per-call cost to amortize: pieces only need to be large enough that
    // spreading them over the streams pays for the hand-off (bench/RESULTS.md, shm).
    PlanLimits limits = WithOverrides({128 << 10, 128 << 10, 1024}, options_);
    limits.streaming_bytes = options_.shm.streaming_copy_bytes != 0 ? options_.shm.streaming_copy_bytes
                                                                    : host::LastLevelCacheBytes();
    *route = std::make_shared<ShmRoute>(std::move(mapper), peer, limits);
    return Status::Ok();
  }

 private:
  uint64_t incarnation_ = 0;
  EngineOptions options_;
  bool offered_ = false;
  std::atomic<uint64_t> next_key_{1};
};

}  // namespace

}  // namespace xfer::transport::shm

namespace xfer::transport {
std::unique_ptr<Backend> MakeShmBackend() { return std::make_unique<shm::ShmBackend>(); }
}  // namespace xfer::transport
