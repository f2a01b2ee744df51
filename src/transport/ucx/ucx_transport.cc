#include "transport/ucx/ucx_transport.h"

#include <poll.h>
#include <pthread.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "transport/ucx/ucx_common.h"
#include "transport/ucx/ucx_link.h"
#include "util/host.h"
#include "util/log.h"
#include "util/spin.h"
#include "util/text.h"

namespace xfer::transport {
namespace ucx {

std::string UcsError(const char* what, ucs_status_t s) {
  return std::string("ucx: ") + what + ": " + Ucx().ucs_status_string(s);
}

Context::~Context() {
  if (h) Ucx().ucp_cleanup(h);
}

Status CreateContext(std::shared_ptr<Context>* out) {
  ucp_config_t* cfg = nullptr;
  ucs_status_t st = Ucx().ucp_config_read(nullptr, nullptr, &cfg);  // UCX_TLS, UCX_NET_DEVICES, ...
  if (st != UCS_OK) return {StatusCode::kInternal, UcsError("reading UCX configuration", st)};
  ucp_params_t p{};
  p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME;
  // RMA for put/get; WAKEUP for the target's event fd. Transports that emulate RMA (tcp) do it
  // over UCX's internal active messages, which need no UCP_FEATURE_AM.
  p.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  p.mt_workers_shared = 1;  // workers live on different threads; MapMemory comes from any
  p.name = "xfer";
  auto ctx = std::make_shared<Context>();
  st = Ucx().ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, &p, cfg, &ctx->h);
  Ucx().ucp_config_release(cfg);
  if (st != UCS_OK) {
    ctx->h = nullptr;
    return {StatusCode::kUnsupported, UcsError("ucp_init (check UCX_TLS / UCX_NET_DEVICES)", st)};
  }
  *out = std::move(ctx);
  return Status::Ok();
}

Status CreateWorker(ucp_context_h ctx, ucp_worker_h* out) {
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  ucs_status_t st = Ucx().ucp_worker_create(ctx, &wp, out);
  if (st != UCS_OK) return {StatusCode::kResourceExhausted, UcsError("ucp_worker_create", st)};
  return Status::Ok();
}

ucs_status_t WaitRequest(ucp_worker_h w, void* req, Clock::time_point until) {
  if (req == nullptr) return UCS_OK;
  if (UCS_PTR_IS_ERR(req)) return UCS_PTR_STATUS(req);
  Backoff backoff;
  for (;;) {
    ucs_status_t st = Ucx().ucp_request_check_status(req);
    if (st != UCS_INPROGRESS) {
      Ucx().ucp_request_free(req);
      return st;
    }
    if (Clock::now() >= until) return UCS_INPROGRESS;
    if (Ucx().ucp_worker_progress(w) == 0) backoff.Pause();
  }
}

}  // namespace ucx

using text::Hex;
using ucx::Context;
using ucx::CreateContext;
using ucx::CreateWorker;
using ucx::UcsError;
using ucx::Ucx;
using ucx::UcxLink;
namespace {

// The target's progress thread wakes this often without events, to notice Stop() even if the
// eventfd were missed.
constexpr int kIdlePollMs = 100;
// The target's progress thread polls this long after its last event before it sleeps.
constexpr auto kTargetSpin = std::chrono::microseconds(50);
// While links have batches in flight (or had, within kRescueWatch), the progress thread checks
// this often that someone drives them (UcxLink::Rescue), and leads those nobody drives for at
// most kRescueBudget.
constexpr int kRescuePollMs = 2;
constexpr auto kRescueWatch = std::chrono::seconds(1);
constexpr auto kRescueBudget = std::chrono::microseconds(500);
// Start's put to itself (over tcp it connects a socket: milliseconds).
constexpr auto kProbeTimeout = std::chrono::seconds(5);

class UcxMemoryImpl final : public UcxMemory {
 public:
  UcxMemoryImpl(std::shared_ptr<Context> ctx, ucp_mem_h memh, std::string key)
      : ctx_(std::move(ctx)), memh_(memh), key_(std::move(key)) {}
  ~UcxMemoryImpl() override {
    ucs_status_t st = Ucx().ucp_mem_unmap(ctx_->h, memh_);
    if (st != UCS_OK) XLOG(WARN) << UcsError("ucp_mem_unmap", st);
  }
  const std::string& packed_key() const override { return key_; }

 private:
  std::shared_ptr<Context> ctx_;
  ucp_mem_h memh_;
  std::string key_;
};

// "host, cuda": the memory types a context registers (UCP_ATTR_FIELD_MEMORY_TYPES); *cuda:
// whether GPU memory is one (a UCX built with CUDA, on a machine with a CUDA driver).
std::string MemoryTypes(ucp_context_h ctx, bool* cuda) {
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  *cuda = false;
  if (Ucx().ucp_context_query(ctx, &attr) != UCS_OK) return "?";
  std::string out;
  for (int t = 0; t < UCS_MEMORY_TYPE_LAST; ++t) {
    if ((attr.memory_types & UCS_BIT(t)) == 0) continue;
    out += (out.empty() ? "" : ", ") + std::string(Ucx().ucs_memory_type_names[t]);
  }
  *cuda = (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  return out.empty() ? "none" : out;
}

// "tcp(lo, eth0), posix, cma": the transports and devices of a context, from
// ucp_context_print_info's "resource N : md M dev D flags -- tl/dev" lines.
std::string Resources(ucp_context_h ctx) {
  char* text = nullptr;
  size_t size = 0;
  FILE* f = open_memstream(&text, &size);
  if (!f) return "?";
  Ucx().ucp_context_print_info(ctx, f);
  std::fclose(f);
  std::map<std::string, std::vector<std::string>> by_tl;
  std::vector<std::string> order;
  std::istringstream in(std::string(text, size));
  std::free(text);
  for (std::string line; std::getline(in, line);) {
    size_t at = line.find("flags -- ");
    if (line.find("resource") == std::string::npos || at == std::string::npos) continue;
    std::string r = line.substr(at + 9);
    while (!r.empty() && std::isspace(static_cast<unsigned char>(r.back()))) r.pop_back();
    size_t slash = r.find('/');
    std::string tl = r.substr(0, slash), dev = slash == std::string::npos ? "" : r.substr(slash + 1);
    if (!by_tl.count(tl)) order.push_back(tl);
    auto& devs = by_tl[tl];
    if (dev != "memory" && dev != "memory0" && !dev.empty()) devs.push_back(dev);
  }
  std::string out;
  for (const auto& tl : order) {
    if (!out.empty()) out += ", ";
    out += tl;
    const auto& devs = by_tl[tl];
    for (size_t i = 0; i < devs.size(); ++i) out += (i ? ", " : "(") + devs[i];
    if (!devs.empty()) out += ")";
  }
  return out.empty() ? "none" : out;
}

}  // namespace

// Wakes the progress thread: for Stop, and for batches a link starts while the thread dozes
// (sleeps kIdlePollMs, having seen no batch in flight for kRescueWatch). Shared with the links,
// which may outlive the transport.
struct Alarm {
  ucx::Wakeup wake;
  std::atomic<bool> dozing{false};
  void Nudge() {
    if (dozing.exchange(false)) wake.Signal();
  }
};

// ---------------------------------------------------------------- target side
struct UcxTransport::Impl {
  UcxOptions opts;
  std::shared_ptr<Context> ctx;
  ucp_worker_h worker = nullptr;  // the target worker: touched only by the progress thread
  std::string address;
  std::shared_ptr<Alarm> alarm;
  bool cuda_memory = false;  // the context registers GPU memory (set by Start)
  std::thread progress;
  std::atomic<bool> stop{false};

  // Initiator links, for Rescue.
  std::mutex links_mu;
  std::vector<std::weak_ptr<UcxLink>> links;

  // Rescues the links' flights that nobody drives; true while some link has flights.
  bool RescueLinks() {
    std::vector<std::shared_ptr<UcxLink>> live;
    {
      std::lock_guard l(links_mu);
      std::erase_if(links, [&](const std::weak_ptr<UcxLink>& w) {
        auto link = w.lock();
        if (!link) return true;
        live.push_back(std::move(link));
        return false;
      });
    }
    bool flights = false;
    for (auto& link : live) flights = link->Rescue(kRescueBudget) || flights;
    return flights;
  }

  // Blocks in poll until the worker has events (a peer's wireup, an emulated put/get) or Stop;
  // idle, it costs one wakeup per kIdlePollMs (kRescuePollMs while links have had batches in
  // flight within kRescueWatch).
  void Progress(int efd) {
    pthread_setname_np(pthread_self(), "xfer-ucx-prog");
    auto next_rescue = Clock::now();
    Clock::time_point last_flights;
    while (!stop.load(std::memory_order_relaxed)) {
      // After activity, keep polling a moment before sleeping: the next put of a request in
      // flight usually follows within microseconds, and a wake-up costs tens of them. Progress
      // at least once per wake-up, however late this thread runs.
      Backoff backoff;
      auto quiet_until = Clock::now() + kTargetSpin;
      Clock::time_point now;
      do {
        if (Ucx().ucp_worker_progress(worker) != 0) {
          while (Ucx().ucp_worker_progress(worker) != 0) {
          }
          quiet_until = Clock::now() + kTargetSpin;
          backoff.Reset();
        } else {
          backoff.Pause();
        }
        now = Clock::now();
        if (now >= next_rescue) {
          if (RescueLinks()) last_flights = now;
          next_rescue = now + std::chrono::milliseconds(kRescuePollMs);
        }
      } while (now < quiet_until);
      ucs_status_t st = Ucx().ucp_worker_arm(worker);
      if (st == UCS_ERR_BUSY) continue;  // events arrived since the last progress
      if (st != UCS_OK) {
        XLOG(ERROR) << UcsError("ucp_worker_arm", st);
        ::poll(nullptr, 0, kIdlePollMs);  // keep serving, without spinning
        continue;
      }
      // Doze only when no link had batches for a while; one that starts some now rings.
      bool doze = now - last_flights >= kRescueWatch;
      if (doze) {
        alarm->dozing.store(true);
        if (RescueLinks()) {
          doze = false;
          last_flights = now;
        }
      }
      pollfd p[2] = {{efd, POLLIN, 0}, {alarm->wake.fd, POLLIN, 0}};
      ::poll(p, 2, doze ? kIdlePollMs : kRescuePollMs);
      alarm->dozing.store(false);
      alarm->wake.Clear();
    }
  }
};

UcxTransport::UcxTransport(UcxOptions opts) : impl_(std::make_unique<Impl>()) { impl_->opts = opts; }

UcxTransport::~UcxTransport() { Stop(); }

Status UcxTransport::Start() {
  Impl& m = *impl_;
  if (m.ctx) return {StatusCode::kInvalidArgument, "ucx: already started"};
  if (const Status& lib = ucx::LibraryStatus(); !lib.ok()) return {lib.code(), "ucx: " + lib.message()};
  std::shared_ptr<Context> ctx;
  Status s = CreateContext(&ctx);
  if (!s.ok()) return s;
  const std::string types = MemoryTypes(ctx->h, &m.cuda_memory);
  XLOG(INFO) << "ucx: UCX " << Ucx().ucp_get_version_string() << " (" << Ucx().path << ") registers " << types
             << " memory; GPU memory to other hosts: " << GpuVerdict(m.cuda_memory);
  ucp_worker_h w = nullptr;
  s = CreateWorker(ctx->h, &w);
  if (!s.ok()) return s;
  auto fail = [&](Status why) {
    Ucx().ucp_worker_destroy(w);
    return why;
  };
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  ucs_status_t st = Ucx().ucp_worker_get_address(w, &addr, &len);
  if (st != UCS_OK) return fail({StatusCode::kInternal, UcsError("ucp_worker_get_address", st)});
  m.address.assign(reinterpret_cast<const char*>(addr), len);
  Ucx().ucp_worker_release_address(w, addr);
  int efd = -1;
  st = Ucx().ucp_worker_get_efd(w, &efd);
  if (st != UCS_OK) return fail({StatusCode::kUnsupported, UcsError("ucp_worker_get_efd", st)});
  m.alarm = std::make_shared<Alarm>();
  if (m.alarm->wake.fd < 0) {
    return fail({StatusCode::kResourceExhausted, std::string("ucx: eventfd: ") + std::strerror(errno)});
  }
  m.ctx = std::move(ctx);
  m.worker = w;
  m.stop.store(false);
  m.progress = std::thread([&m, efd] { m.Progress(efd); });

  // UCX starts even when UCX_TLS leaves nothing that can reach a peer (sm or cma alone): a put
  // to ourselves through the same machinery says so now rather than at the first batch.
  uint64_t word = 0, one = 1;
  std::unique_ptr<UcxMemory> mem;
  s = MapMemory(reinterpret_cast<uint64_t>(&word), sizeof word, &mem);
  if (s.ok()) {
    UcxPeer self{m.address,
                 [&](uint64_t, uint64_t, bool, UcxRemoteKey* key) {
                   *key = {0, mem->packed_key()};
                   return true;
                 },
                 "itself"};
    auto probe = std::make_shared<UcxLink>(m.ctx, self, 1);
    const Slice put{reinterpret_cast<uint64_t>(&one), reinterpret_cast<uint64_t>(&word), sizeof word};
    s = probe->Execute(Op::kWrite, {&put, 1}, Clock::now() + kProbeTimeout);
  }
  mem.reset();
  if (s.ok() && word != one) s = {StatusCode::kInternal, "the probe put completed but moved nothing"};
  if (!s.ok()) {
    Stop();
    return {StatusCode::kUnsupported,
            "ucx: UCX started but cannot even put to itself (check UCX_TLS, "
            "UCX_NET_DEVICES): " +
                s.message()};
  }
  return Status::Ok();
}

void UcxTransport::Stop() {
  Impl& m = *impl_;
  if (!m.progress.joinable()) return;
  m.stop.store(true);
  m.alarm->wake.Signal();
  m.progress.join();
  Ucx().ucp_worker_destroy(m.worker);  // closes the peers' endpoints to us: they see the error
  m.worker = nullptr;
  m.alarm.reset();
  m.address.clear();
  // The context stays while links or mapped memory hold it.
  m.ctx.reset();
}

const std::string& UcxTransport::worker_address() const { return impl_->address; }
bool UcxTransport::cuda_memory() const { return impl_->cuda_memory; }

Status UcxTransport::MapMemory(uint64_t addr, uint64_t len, std::unique_ptr<UcxMemory>* out,
                               bool remote_write, bool gpu) {
  const std::shared_ptr<Context> ctx = impl_->ctx;
  if (!ctx) return {StatusCode::kInvalidArgument, "ucx: MapMemory before Start"};
  if (addr == 0 || len == 0) return {StatusCode::kInvalidArgument, "ucx: MapMemory of an empty range"};
  // (A UCX without CUDA would take a GPU address for host memory and fail, or worse, in the
  // kernel's page pinning.)
  if (gpu && !impl_->cuda_memory) return {StatusCode::kUnsupported, "ucx: " + GpuVerdict(false)};
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                  UCP_MEM_MAP_PARAM_FIELD_PROT | UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
  mp.address = reinterpret_cast<void*>(addr);
  mp.length = len;
  mp.memory_type = gpu ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
  mp.prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE | UCP_MEM_MAP_PROT_REMOTE_READ |
            (remote_write ? UCP_MEM_MAP_PROT_REMOTE_WRITE : 0);
  ucp_mem_h memh = nullptr;
  ucs_status_t st = Ucx().ucp_mem_map(ctx->h, &mp, &memh);
  if (st != UCS_OK) {
    return {st == UCS_ERR_NO_MEMORY ? StatusCode::kResourceExhausted : StatusCode::kInternal,
            UcsError(("ucp_mem_map of " + std::to_string(len) + " bytes at " + Hex(addr)).c_str(), st)};
  }
  void* buf = nullptr;
  size_t size = 0;
  st = Ucx().ucp_rkey_pack(ctx->h, memh, &buf, &size);
  if (st != UCS_OK) {
    (void)Ucx().ucp_mem_unmap(ctx->h, memh);
    return {StatusCode::kInternal, UcsError("ucp_rkey_pack", st)};
  }
  std::string key(static_cast<const char*>(buf), size);
  Ucx().ucp_rkey_buffer_release(buf);
  *out = std::make_unique<UcxMemoryImpl>(ctx, memh, std::move(key));
  return Status::Ok();
}

Status UcxTransport::Connect(const UcxPeer& peer, std::shared_ptr<Link>* link) {
  const std::shared_ptr<Context> ctx = impl_->ctx;
  if (!ctx) return {StatusCode::kInvalidArgument, "ucx: Connect before Start"};
  if (peer.worker_address.empty() || !peer.find_key) {
    return {StatusCode::kUnsupported, "ucx: peer " + peer.name + " offers no UCX worker address"};
  }
  auto ucx =
      std::make_shared<UcxLink>(ctx, peer, impl_->opts.links, [alarm = impl_->alarm] { alarm->Nudge(); });
  {
    std::lock_guard l(impl_->links_mu);
    impl_->links.push_back(ucx);
  }
  *link = std::move(ucx);
  return Status::Ok();
}

PlanLimits UcxTransport::Limits(const EngineOptions& o) const {
  PlanLimits l = WithOverrides({1 << 20, 1 << 20, 1024}, o);
  l.batches_in_flight = static_cast<size_t>(std::max(impl_->opts.links, 1));
  return l;
}

std::string UcxTransport::GpuVerdict(bool cuda_memory) {
  if (!ucx::LibraryStatus().ok()) return "through the buffer pool (UCX was not found at run time)";
  if (cuda_memory)
    return "direct through UCX (it registers CUDA memory; GPUDirect RDMA where the NIC allows)";
  return std::string("through the buffer pool (UCX ") + Ucx().ucp_get_version_string() +
         " has no CUDA memory support here; that takes a UCX built --with-cuda, a GPU driver, and UCX_TLS "
         "naming cuda_copy where it is set)";
}

namespace {
// "UCX 1.13.1 (/usr/lib/.../libucp.so.0); UCX_TLS=...; transports: ...; memory types: ...";
// *cuda: whether it registers GPU memory.
std::string DescribeUcx(bool* cuda) {
  std::string out = std::string("UCX ") + Ucx().ucp_get_version_string() + " (" + Ucx().path + "); UCX_TLS=";
  const char* tls = std::getenv("UCX_TLS");
  out += tls ? tls : "all (default)";
  if (const char* devs = std::getenv("UCX_NET_DEVICES")) out += std::string("; UCX_NET_DEVICES=") + devs;
  std::shared_ptr<Context> ctx;
  Status s = CreateContext(&ctx);
  out += "; transports: " + (s.ok() ? Resources(ctx->h) : s.message());
  if (s.ok()) out += "; memory types: " + MemoryTypes(ctx->h, cuda);
  return out;
}
}  // namespace

std::string UcxTransport::Describe() {
  bool cuda = false;
  const Status& lib = ucx::LibraryStatus();
  std::string out = lib.ok() ? DescribeUcx(&cuda) : lib.message();
  std::vector<std::string> rdma = host::RdmaDevices();
  if (rdma.empty()) {
    out += "; no RDMA (InfiniBand/RoCE) device found";
  } else {
    out += "; RDMA devices:";
    for (const auto& d : rdma) out += " " + d;
  }
  return out + "\nGPU memory to other hosts: " + GpuVerdict(cuda);
}

}  // namespace xfer::transport
