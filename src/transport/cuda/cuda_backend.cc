// Backend "cuda": GPU memory on this host, moved by the copy engines (cuda_api.h). A
// same-host peer's device regions are opened here (CUDA IPC, or a VMM allocation's file
// descriptor), its AllocMem host memory mapped (shm) and page-locked here too, and batches
// become cudaMemcpyAsync calls. It also classifies and allocates GPU memory, and page-locks
// registered host memory.
#include "transport/backend.h"
#include "transport/common/cuda/cuda_api.h"
#include "transport/common/memfd_regions.h"
#include "util/log.h"
#include "util/text.h"

namespace xfer::transport::cuda {
namespace {

class CopyEngineLink final : public Link {
 public:
  Status Execute(Op op, std::span<const Slice> batch, Clock::time_point deadline) override {
    return Copy(op, batch, deadline);
  }
};

class CudaRoute final : public Route {
 public:
  CudaRoute(const PeerContext& peer, std::unique_ptr<shared_memory::PeerMapper> mapper, PlanLimits limits,
            bool pin_host_memory)
      : Route("cuda", std::make_shared<CopyEngineLink>(), limits),
        mapper_(std::move(mapper)),
        peer_name_(peer.name),
        peer_incarnation_(peer.incarnation),
        same_process_(peer.same_process),
        pin_host_memory_(pin_host_memory) {}

  bool Reach(MemType local, RemoteRegion& r, uint8_t** mapped) override {
    if (local != MemType::kCuda && r.info.type != MemType::kCuda) return false;
    if (same_process_) {
      *mapped = reinterpret_cast<uint8_t*>(r.info.addr);
    } else if (r.info.type == MemType::kHost) {
      *mapped = mapper_ ? MapHost(r) : nullptr;
    } else {
      *mapped = OpenDevice(r);
    }
    return *mapped != nullptr;
  }
  std::string WhyNot(MemType local, const RemoteRegion& r) const override {
    if (local != MemType::kCuda && r.info.type != MemType::kCuda) return "cuda: moves GPU memory only";
    if (r.info.type == MemType::kHost) {
      return "cuda: the peer's host memory is reached only when it is AllocMem memory";
    }
    return "cuda: opening the peer's GPU memory through CUDA IPC failed (the log says why)";
  }
  bool Stageable() const override { return false; }

 private:
  // The peer's AllocMem host memory, mapped (shm's mapping, shared) and page-locked in this
  // process on first use: the owner's page-locking does not carry over, and copies between
  // pageable memory and a GPU run at a fraction of the link's speed. If it cannot be locked,
  // the mapping is used as it is (the log says why).
  uint8_t* MapHost(RemoteRegion& r) {
    uint8_t* const base = MapMemfdRegion(*mapper_, peer_name_, peer_incarnation_, r);
    if (base == nullptr || !pin_host_memory_) return base;
    static const char kPinned = 0;  // the key of the page-locking, closed before the mapping
    OpenOrLog(r, &kPinned, "stays pageable here (its copies to and from GPU memory run slower)",
              [&](std::shared_ptr<void>* handle, uint8_t** at) {
                Status s = PinHost(base, r.info.len, r.info.access != PeerAccess::kReadWrite);
                if (s.ok()) {
                  *handle = std::shared_ptr<void>(base, [](void* p) { UnpinHost(p); });
                  *at = base;
                }
                return s;
              });
    return base;
  }

  uint8_t* OpenDevice(RemoteRegion& r) {
    static const char kOpened = 0;  // the key of the region opened here
    return OpenOrLog(
        r, &kOpened, "cannot be opened (its transfers take another route, where one reaches GPU memory)",
        [&](std::shared_ptr<void>* handle, uint8_t** at) {
          const std::string* blob = FindBlob(r.blobs, "cuda");
          if (blob == nullptr) return Status{StatusCode::kUnsupported, "the peer could not export it"};
          std::shared_ptr<Mapping> m;
          Status s = Open(
              *blob, r.info.len,
              [this](int32_t remote_fd, int* fd) {
                return mapper_ ? mapper_->TakeFd(remote_fd, fd)
                               : Status{StatusCode::kUnsupported, "cannot take descriptors from the peer"};
              },
              &m);
          if (s.ok()) {
            *at = m->base();
            *handle = std::move(m);
          }
          return s;
        });
  }

  // r.OpenOnce(key, open), with one log line if the opening fails ("<region> <outcome>: why").
  template <class Opener>
  uint8_t* OpenOrLog(RemoteRegion& r, RemoteRegion::OpenKey key, const char* outcome, Opener&& open) {
    Status failure;
    uint8_t* const base = r.OpenOnce(key, std::forward<Opener>(open), &failure);
    if (!failure.ok()) {
      XLOG(WARN) << (r.info.type == MemType::kCuda ? "GPU" : "host") << " region " << r.id << " of peer "
                 << peer_name_ << " " << outcome << ": " << failure.ToString();
    }
    return base;
  }

  const std::unique_ptr<shared_memory::PeerMapper> mapper_;  // null in this process, or when refused
  const std::string peer_name_;
  const uint64_t peer_incarnation_;
  const bool same_process_;
  const bool pin_host_memory_;  // EngineOptions::cuda.pin_host_memory
};

class CudaBackend final : public Backend {
 public:
  std::string_view name() const override { return "cuda"; }
  std::string About() const override {
    return "GPU memory: copy engines between processes of this host (CUDA IPC); other hosts through "
           "ucx where its UCX registers CUDA memory, else the buffer pool\n" +
           Describe();
  }
  std::vector<options::Row> Options() const override {
    return {XFER_OPTION_BOOL("cuda.pin_host_memory", cuda.pin_host_memory,
                             "with a GPU, registered host memory is page-locked")};
  }

  Status Start(const EngineContext& ctx) override {
    options_ = *ctx.options;
    std::string why;
    if (!Available(&why)) return {StatusCode::kUnsupported, why};
    return Status::Ok();
  }

  bool HandlesDeviceMemory() const override { return true; }
  bool Classify(const void* p, MemType* type, int32_t* device) const override {
    cuda::Classify(p, type, device);
    return *type == MemType::kCuda;
  }

  bool Allocates(MemType type) const override { return type == MemType::kCuda; }
  Status Allocate(uint64_t len, MemType type, const AllocOptions& options, uint64_t* addr, int32_t* device,
                  std::unique_ptr<RegionResource>* res) override {
    void* p = nullptr;
    Status s = AllocDevice(len, options.device, &p);
    if (!s.ok()) return s;
    *res = std::make_unique<OnRelease>([p] { FreeDevice(p); });
    *addr = reinterpret_cast<uint64_t>(p);
    MemType t;
    cuda::Classify(p, &t, device);
    return Status::Ok();
  }

  Status PrepareRegion(const RegionInfo& info, const RegionResource*, std::optional<std::string>* blob,
                       std::unique_ptr<RegionResource>* res) override {
    if (info.type == MemType::kCuda) {  // same-host peers open it with CUDA IPC
      std::unique_ptr<Export> e;
      Status s = Export::Create(info.addr, info.len, &e);
      if (s.ok()) {
        *blob = e->blob();
        *res = std::make_unique<Owned<Export>>(std::move(e));
      } else if (s.code() == StatusCode::kInvalidArgument) {  // e.g. past the allocation's end
        return s;
      } else {
        XLOG(WARN) << "GPU memory at " << text::Hex(info.addr)
                   << " cannot be opened by peers on this host (only peers that reach it over "
                      "a staging target can use it): "
                   << s.ToString();
      }
    } else if (options_.cuda.pin_host_memory) {  // H2D and D2H copies at the link's speed
      void* p = reinterpret_cast<void*>(info.addr);
      if (Status s = PinHost(p, info.len); s.ok()) {
        *res = std::make_unique<OnRelease>([p] { UnpinHost(p); });
      } else {
        XLOG(INFO) << "host memory at " << text::Hex(info.addr) << " stays pageable: " << s.ToString();
      }
    }
    return Status::Ok();
  }

  Status Connect(const PeerContext& peer, std::shared_ptr<Route>* route) override {
    if (!peer.same_host) return {StatusCode::kUnsupported, "cuda: the peer is on another host"};
    std::unique_ptr<shared_memory::PeerMapper> mapper;  // takes VMM descriptors, maps AllocMem memory
    if (!peer.same_process) {
      if (Status s = shared_memory::PeerMapper::Open(peer.pid, peer.pidfd, &mapper); !s.ok()) {
        XLOG(INFO) << "peer " << peer.name << ": its VMM GPU memory and AllocMem memory are out "
                   << "of cuda's reach: " << s.ToString();
      }
    }
    // One stream's copies run one after another, so pieces only need to be large enough to
    // hide a hand-off between streams, and batches of small ones amortize the wait for their
    // completion.
    PlanLimits limits = WithOverrides({4ull << 20, 16ull << 20, 4096}, options_);
    *route = std::make_shared<CudaRoute>(peer, std::move(mapper), limits, options_.cuda.pin_host_memory);
    return Status::Ok();
  }

 private:
  EngineOptions options_;
};

}  // namespace
}  // namespace xfer::transport::cuda

namespace xfer::transport {
std::unique_ptr<Backend> MakeCudaBackend() { return std::make_unique<cuda::CudaBackend>(); }
}  // namespace xfer::transport
