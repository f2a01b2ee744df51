#include "transport/ucx/ucx_transport.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
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
#include <unordered_map>
#include <vector>

#include "util/host.h"
#include "util/log.h"
#include "util/spin.h"
#include "util/text.h"

namespace xfer::transport {
using text::Hex;
namespace {

// How long a torn-down endpoint may take to give back its requests. A forced close completes
// them at once on every transport we know; the bound only keeps a UCX bug from hanging us.
constexpr auto kTeardownGrace = std::chrono::seconds(2);
// The target's progress thread wakes this often without events, to notice Stop() even if the
// eventfd were missed.
constexpr int kIdlePollMs = 100;
// Unpacked keys kept per connection.
constexpr size_t kMaxCachedKeys = 4096;
// An initiator waiting for its batch reads the clock every kSpinsPerClockRead rounds, and after
// kSpinsBeforeSleep rounds without news sleeps on the worker's event fd, kSleepMs at most (the
// bound only matters if a transport fails to signal an event).
constexpr unsigned kSpinsPerClockRead = 64;
constexpr unsigned kSpinsBeforeSleep = 256;
constexpr int kSleepMs = 1;
// The target's progress thread polls this long after its last event before it sleeps.
constexpr auto kTargetSpin = std::chrono::microseconds(50);
// Start's put to itself (over tcp it connects a socket: milliseconds).
constexpr auto kProbeTimeout = std::chrono::seconds(5);

std::string UcsError(const char* what, ucs_status_t s) {
  return std::string("ucx: ") + what + ": " + ucs_status_string(s);
}

// The UCP context outlives the transport while links or mapped memory still use it.
struct Context {
  ucp_context_h h = nullptr;
  ~Context() {
    if (h) ucp_cleanup(h);
  }
};

Status CreateContext(std::shared_ptr<Context>* out) {
  ucp_config_t* cfg = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &cfg);  // UCX_TLS, UCX_NET_DEVICES, ...
  if (st != UCS_OK) return {StatusCode::kInternal, UcsError("reading UCX configuration", st)};
  ucp_params_t p{};
  p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED |
                 UCP_PARAM_FIELD_NAME;
  // RMA for put/get; WAKEUP for the target's event fd. Transports that emulate RMA (tcp) do it
  // over UCX's internal active messages, which need no UCP_FEATURE_AM.
  p.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  p.mt_workers_shared = 1;  // workers live on different threads; MapMemory comes from any
  p.name = "xfer";
  auto ctx = std::make_shared<Context>();
  st = ucp_init(&p, cfg, &ctx->h);
  ucp_config_release(cfg);
  if (st != UCS_OK) {
    ctx->h = nullptr;
    return {StatusCode::kUnsupported, UcsError("ucp_init (check UCX_TLS / UCX_NET_DEVICES)", st)};
  }
  *out = std::move(ctx);
  return Status::Ok();
}

// Workers are SERIALIZED: each is used by one thread at a time under a mutex of ours.
Status CreateWorker(ucp_context_h ctx, ucp_worker_h* out) {
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  ucs_status_t st = ucp_worker_create(ctx, &wp, out);
  if (st != UCS_OK) return {StatusCode::kResourceExhausted, UcsError("ucp_worker_create", st)};
  return Status::Ok();
}

class UcxMemoryImpl final : public UcxMemory {
 public:
  UcxMemoryImpl(std::shared_ptr<Context> ctx, ucp_mem_h memh, std::string key)
      : ctx_(std::move(ctx)), memh_(memh), key_(std::move(key)) {}
  ~UcxMemoryImpl() override {
    ucs_status_t st = ucp_mem_unmap(ctx_->h, memh_);
    if (st != UCS_OK) XLOG(WARN) << UcsError("ucp_mem_unmap", st);
  }
  const std::string& packed_key() const override { return key_; }

 private:
  std::shared_ptr<Context> ctx_;
  ucp_mem_h memh_;
  std::string key_;
};

// ---------------------------------------------------------------- initiator side
// One endpoint to the peer on a worker of its own: a rail. Used by one Execute at a time.
struct Conn {
  std::timed_mutex mu;
  ucp_worker_h worker = nullptr;
  int efd = -1;  // the worker's event fd
  ucp_ep_h ep = nullptr;
  std::unordered_map<uint64_t, ucp_rkey_h> rkeys;  // region_id -> key unpacked on ep
  // Set by UCX's error callback (during our own progress calls) when the peer fails.
  std::atomic<ucs_status_t> failure{UCS_OK};
};

void OnPeerError(void* arg, ucp_ep_h, ucs_status_t status) {
  static_cast<Conn*>(arg)->failure.store(status);
}

// Waits for a request to complete, progressing the worker, until `until`. Returns its status
// (UCS_INPROGRESS if time ran out); frees it once complete.
ucs_status_t WaitRequest(ucp_worker_h w, void* req, Clock::time_point until) {
  if (req == nullptr) return UCS_OK;
  if (UCS_PTR_IS_ERR(req)) return UCS_PTR_STATUS(req);
  Backoff backoff;
  for (;;) {
    ucs_status_t st = ucp_request_check_status(req);
    if (st != UCS_INPROGRESS) {
      ucp_request_free(req);
      return st;
    }
    if (Clock::now() >= until) return UCS_INPROGRESS;
    if (ucp_worker_progress(w) == 0) backoff.Pause();
  }
}

class UcxLink final : public Link {
 public:
  UcxLink(std::shared_ptr<Context> ctx, UcxPeer peer, int links)
      : ctx_(std::move(ctx)), peer_(std::move(peer)) {
    for (int i = 0; i < std::max(links, 1); ++i) conns_.push_back(std::make_unique<Conn>());
  }

  ~UcxLink() override {
    for (auto& c : conns_) {
      std::lock_guard l(c->mu);
      Teardown(*c, {});
      if (c->worker) ucp_worker_destroy(c->worker);
    }
  }

  Status Execute(Op op, std::span<const Slice> batch, Clock::time_point deadline) override {
    if (batch.empty()) return Status::Ok();
    Conn& c = *conns_[rr_.fetch_add(1) % conns_.size()];
    std::unique_lock l(c.mu, std::defer_lock);
    if (!l.try_lock_until(deadline)) {
      return {StatusCode::kTimeout, "ucx: deadline passed waiting for a connection to " + peer_.name};
    }
    if (shut_.load()) return Gone();
    if (Clock::now() >= deadline) {
      return {StatusCode::kTimeout, "ucx: deadline passed before the batch to " + peer_.name + " started"};
    }
    // Every key first: a batch with a range outside the peer's regions moves nothing. A batch
    // nearly always lies in one region: a slice inside the previous one's region reuses its key.
    std::vector<UcxRemoteKey> keys;
    std::vector<uint32_t> key_of(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      const Slice& s = batch[i];
      const bool same = !keys.empty() && s.remote >= keys.back().addr &&
                        s.remote + s.len <= keys.back().addr + keys.back().len;
      if (!same) {
        keys.emplace_back();
        if (!peer_.find_key(s.remote, s.len, &keys.back())) {
          return {StatusCode::kRemoteAccessDenied,
                  "ucx: no region of peer " + peer_.name + " holds slice " + std::to_string(i) +
                      " (" + std::to_string(s.len) + " bytes at " + Hex(s.remote) + ")"};
        }
      }
      key_of[i] = static_cast<uint32_t>(keys.size() - 1);
    }
    Status s = Connect(c);
    if (!s.ok()) return s;
    // Keys of regions the peer deregistered would pile up for the life of the link: start
    // over now and then, between batches (no request holds a key then).
    if (c.rkeys.size() + keys.size() > kMaxCachedKeys) DestroyKeys(c);
    std::vector<ucp_rkey_h> unpacked(keys.size());
    for (size_t k = 0; k < keys.size(); ++k) {
      s = Unpack(c, keys[k], &unpacked[k]);
      if (!s.ok()) {
        Teardown(c, {});
        return s;
      }
    }
    std::vector<ucp_rkey_h> rkeys(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) rkeys[i] = unpacked[key_of[i]];
    s = Run(c, op, batch, rkeys, deadline);
    if (!s.ok() && shut_.load()) return Gone();
    return s;
  }

  void Shutdown() override {
    shut_.store(true);
    // Idle connections are closed now; busy ones by their Execute, which sees shut_.
    for (auto& c : conns_) {
      std::unique_lock l(c->mu, std::try_to_lock);
      if (l.owns_lock()) Teardown(*c, {});
    }
  }

 private:
  Status Gone() const {
    return {StatusCode::kConnectionLost, "ucx: the session with " + peer_.name + " ended"};
  }

  // The endpoint, created on first use and after a failure tore the last one down.
  Status Connect(Conn& c) {
    if (!c.worker) {
      Status s = CreateWorker(ctx_->h, &c.worker);
      if (!s.ok()) return s;
      ucs_status_t st = ucp_worker_get_efd(c.worker, &c.efd);
      if (st != UCS_OK) {
        ucp_worker_destroy(c.worker);
        c.worker = nullptr;
        return {StatusCode::kUnsupported, UcsError("ucp_worker_get_efd", st)};
      }
    }
    // The peer failed after the last batch completed: start afresh rather than fail this one.
    if (c.ep && c.failure.load() != UCS_OK) Teardown(c, {});
    if (c.ep) return Status::Ok();
    c.failure.store(UCS_OK);
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(peer_.worker_address.data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = OnPeerError;
    ep.err_handler.arg = &c;
    ucs_status_t st = ucp_ep_create(c.worker, &ep, &c.ep);
    if (st != UCS_OK) {
      c.ep = nullptr;
      std::string msg = UcsError(("endpoint to " + peer_.name).c_str(), st);
      // Every lane of a peer-error-handling endpoint must detect peer failure; UCX 1.13's
      // shared-memory transports (posix, sysv) cannot, so UCX_TLS=sm alone reaches nobody.
      if (st == UCS_ERR_UNREACHABLE) {
        msg += " (no transport allowed by UCX_TLS offers active messages, put/get and "
               "peer-failure detection to that peer: add tcp or an RDMA transport)";
      }
      return {StatusCode::kConnectionLost, msg};
    }
    return Status::Ok();
  }

  Status Unpack(Conn& c, const UcxRemoteKey& key, ucp_rkey_h* out) {
    auto it = c.rkeys.find(key.region_id);
    if (it != c.rkeys.end()) {
      *out = it->second;
      return Status::Ok();
    }
    ucs_status_t st = ucp_ep_rkey_unpack(c.ep, key.packed.data(), out);
    if (st != UCS_OK) {
      return {StatusCode::kConnectionLost,
              UcsError(("unpacking the key of region " + std::to_string(key.region_id) +
                        " of peer " + peer_.name).c_str(), st)};
    }
    c.rkeys.emplace(key.region_id, *out);
    return Status::Ok();
  }

  // Posts the batch (and, for WRITE, a flush), then progresses until all of it completed: the
  // data is in place at the target (WRITE) or here (READ: a get completes when its data has
  // arrived, so it needs no flush, which costs a round trip). Any failure tears the endpoint
  // down.
  Status Run(Conn& c, Op op, std::span<const Slice> batch, const std::vector<ucp_rkey_h>& rkeys,
             Clock::time_point deadline) {
    std::vector<void*> reqs;  // outstanding requests; a WRITE's flush last
    reqs.reserve(batch.size() + 1);
    ucp_request_param_t none{};
    ucs_status_t failed = UCS_OK;
    const char* what = "";
    for (size_t i = 0; i < batch.size() && failed == UCS_OK; ++i) {
      const Slice& s = batch[i];
      void* buf = reinterpret_cast<void*>(s.local);
      ucs_status_ptr_t r = op == Op::kWrite
                               ? ucp_put_nbx(c.ep, buf, s.len, s.remote, rkeys[i], &none)
                               : ucp_get_nbx(c.ep, buf, s.len, s.remote, rkeys[i], &none);
      if (UCS_PTR_IS_ERR(r)) {
        failed = UCS_PTR_STATUS(r);
        what = op == Op::kWrite ? "ucp_put_nbx" : "ucp_get_nbx";
      } else if (r != nullptr) {
        reqs.push_back(r);
      }
    }
    if (failed == UCS_OK && op == Op::kWrite) {
      ucs_status_ptr_t r = ucp_ep_flush_nbx(c.ep, &none);
      if (UCS_PTR_IS_ERR(r)) {
        failed = UCS_PTR_STATUS(r);
        what = "ucp_ep_flush_nbx";
      } else if (r != nullptr) {
        reqs.push_back(r);
      }
    }

    // Requests complete in order, mostly: watch the oldest outstanding one. Spin (pausing, then
    // yielding the core) while UCX has nothing new, then sleep on the worker's event fd: a long
    // batch over a slow wire, or a target that must progress on a core we share, should not
    // cost a core.
    size_t done = 0;
    bool timed_out = false, shut = false;
    unsigned idle = 0;
    Backoff backoff;
    for (unsigned spins = 0; failed == UCS_OK && done < reqs.size(); ++spins) {
      ucs_status_t st = ucp_request_check_status(reqs[done]);
      if (st == UCS_INPROGRESS) {
        if (c.failure.load() != UCS_OK) {
          failed = c.failure.load();
          what = "connection";
        } else if (spins % kSpinsPerClockRead == 0 && (shut_.load() || Clock::now() >= deadline)) {
          (shut_.load() ? shut : timed_out) = true;
          break;
        } else if (ucp_worker_progress(c.worker) != 0) {
          idle = 0;
          backoff.Reset();
        } else if (++idle < kSpinsBeforeSleep) {
          backoff.Pause();
        } else {
          idle = 0;
          backoff.Reset();
          if (ucp_worker_arm(c.worker) == UCS_OK) {  // else events came in: progress again
            pollfd p{c.efd, POLLIN, 0};
            ::poll(&p, 1, kSleepMs);
          }
        }
        continue;
      }
      ucp_request_free(reqs[done]);
      reqs[done++] = nullptr;
      if (st != UCS_OK) {
        failed = st;
        what = op == Op::kWrite ? "put" : "get";
      }
    }
    if (failed == UCS_OK && !timed_out && !shut) return Status::Ok();

    reqs.erase(reqs.begin(), reqs.begin() + done);
    Teardown(c, std::move(reqs));
    if (shut) return Gone();
    if (timed_out) {
      return {StatusCode::kTimeout, std::string("ucx: deadline passed waiting for a ") +
                                        (op == Op::kWrite ? "WRITE" : "READ") + " batch to " +
                                        peer_.name + " to complete"};
    }
    return {StatusCode::kConnectionLost,
            UcsError((std::string(what) + " to " + peer_.name).c_str(), failed)};
  }

  static void DestroyKeys(Conn& c) {
    for (auto& [id, k] : c.rkeys) ucp_rkey_destroy(k);
    c.rkeys.clear();
  }

  // Force-closes the endpoint, which completes (cancels) its outstanding requests: once this
  // returns, no request of ours can still write into the caller's memory. The worker stays for
  // the next endpoint unless UCX failed to give a request back, in which case it goes too.
  void Teardown(Conn& c, std::vector<void*> reqs) {
    if (!c.ep) return;
    const auto until = Clock::now() + kTeardownGrace;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    bool clean = WaitRequest(c.worker, ucp_ep_close_nbx(c.ep, &p), until) != UCS_INPROGRESS;
    c.ep = nullptr;
    for (void* r : reqs) clean = WaitRequest(c.worker, r, until) != UCS_INPROGRESS && clean;
    c.failure.store(UCS_OK);
    if (clean) {
      DestroyKeys(c);
      return;
    }
    // A request still holds its key: leave the keys to the worker's pools, which go with it.
    XLOG(ERROR) << "ucx: requests to " << peer_.name
                << " did not complete after a forced close; destroying their worker";
    c.rkeys.clear();
    ucp_worker_destroy(c.worker);  // stops all its transports: no more access to our memory
    c.worker = nullptr;
    c.efd = -1;
  }

  const std::shared_ptr<Context> ctx_;
  const UcxPeer peer_;
  std::vector<std::unique_ptr<Conn>> conns_;
  std::atomic<uint32_t> rr_{0};
  std::atomic<bool> shut_{false};
};

// "tcp(lo, eth0), posix, cma": the transports and devices of a context, from
// ucp_context_print_info's "resource N : md M dev D flags -- tl/dev" lines.
std::string Resources(ucp_context_h ctx) {
  char* text = nullptr;
  size_t size = 0;
  FILE* f = open_memstream(&text, &size);
  if (!f) return "?";
  ucp_context_print_info(ctx, f);
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

// ---------------------------------------------------------------- target side
struct UcxTransport::Impl {
  UcxOptions opts;
  std::shared_ptr<Context> ctx;
  ucp_worker_h worker = nullptr;  // the target worker: touched only by the progress thread
  std::string address;
  int wake_fd = -1;               // eventfd: Stop() wakes the progress thread
  std::thread progress;
  std::atomic<bool> stop{false};

  // Blocks in poll until the worker has events (a peer's wireup, an emulated put/get) or Stop;
  // idle, it costs one wakeup per kIdlePollMs.
  void Progress(int efd) {
    pthread_setname_np(pthread_self(), "xfer-ucx-prog");
    while (!stop.load(std::memory_order_relaxed)) {
      // After activity, keep polling a moment before sleeping: the next put of a request in
      // flight usually follows within microseconds, and a wake-up costs tens of them. Progress
      // at least once per wake-up, however late this thread runs.
      Backoff backoff;
      auto quiet_until = Clock::now() + kTargetSpin;
      do {
        if (ucp_worker_progress(worker) != 0) {
          while (ucp_worker_progress(worker) != 0) {
          }
          quiet_until = Clock::now() + kTargetSpin;
          backoff.Reset();
        } else {
          backoff.Pause();
        }
      } while (Clock::now() < quiet_until);
      ucs_status_t st = ucp_worker_arm(worker);
      if (st == UCS_ERR_BUSY) continue;  // events arrived since the last progress
      if (st != UCS_OK) {
        XLOG(ERROR) << UcsError("ucp_worker_arm", st);
        ::poll(nullptr, 0, kIdlePollMs);  // keep serving, without spinning
        continue;
      }
      pollfd p[2] = {{efd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
      ::poll(p, 2, kIdlePollMs);
    }
  }
};

UcxTransport::UcxTransport(UcxOptions opts) : impl_(std::make_unique<Impl>()) {
  impl_->opts = opts;
}

UcxTransport::~UcxTransport() { Stop(); }

Status UcxTransport::Start() {
  Impl& m = *impl_;
  if (m.ctx) return {StatusCode::kInvalidArgument, "ucx: already started"};
  std::shared_ptr<Context> ctx;
  Status s = CreateContext(&ctx);
  if (!s.ok()) return s;
  ucp_worker_h w = nullptr;
  s = CreateWorker(ctx->h, &w);
  if (!s.ok()) return s;
  auto fail = [&](Status why) {
    ucp_worker_destroy(w);
    return why;
  };
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  ucs_status_t st = ucp_worker_get_address(w, &addr, &len);
  if (st != UCS_OK) return fail({StatusCode::kInternal, UcsError("ucp_worker_get_address", st)});
  m.address.assign(reinterpret_cast<const char*>(addr), len);
  ucp_worker_release_address(w, addr);
  int efd = -1;
  st = ucp_worker_get_efd(w, &efd);
  if (st != UCS_OK) return fail({StatusCode::kUnsupported, UcsError("ucp_worker_get_efd", st)});
  m.wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (m.wake_fd < 0) {
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
                 [&](uint64_t, uint64_t, UcxRemoteKey* key) {
                   *key = {0, mem->packed_key()};
                   return true;
                 },
                 "itself"};
    UcxLink probe(m.ctx, self, 1);
    const Slice put{reinterpret_cast<uint64_t>(&one), reinterpret_cast<uint64_t>(&word), sizeof word};
    s = probe.Execute(Op::kWrite, {&put, 1}, Clock::now() + kProbeTimeout);
  }
  mem.reset();
  if (s.ok() && word != one) s = {StatusCode::kInternal, "the probe put completed but moved nothing"};
  if (!s.ok()) {
    Stop();
    return {StatusCode::kUnsupported, "ucx: UCX started but cannot even put to itself (check UCX_TLS, "
                                      "UCX_NET_DEVICES): " + s.message()};
  }
  return Status::Ok();
}

void UcxTransport::Stop() {
  Impl& m = *impl_;
  if (!m.progress.joinable()) return;
  m.stop.store(true);
  uint64_t one = 1;
  if (::write(m.wake_fd, &one, sizeof one) < 0) {
  }  // the poll timeout notices stop anyway
  m.progress.join();
  ucp_worker_destroy(m.worker);  // closes the peers' endpoints to us: they see the error
  m.worker = nullptr;
  ::close(m.wake_fd);
  m.wake_fd = -1;
  m.address.clear();
  // The context stays while links or mapped memory hold it.
  m.ctx.reset();
}

const std::string& UcxTransport::worker_address() const { return impl_->address; }

Status UcxTransport::MapMemory(uint64_t addr, uint64_t len, std::unique_ptr<UcxMemory>* out) {
  const std::shared_ptr<Context> ctx = impl_->ctx;
  if (!ctx) return {StatusCode::kInvalidArgument, "ucx: MapMemory before Start"};
  if (addr == 0 || len == 0) return {StatusCode::kInvalidArgument, "ucx: MapMemory of an empty range"};
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = reinterpret_cast<void*>(addr);
  mp.length = len;
  ucp_mem_h memh = nullptr;
  ucs_status_t st = ucp_mem_map(ctx->h, &mp, &memh);
  if (st != UCS_OK) {
    return {st == UCS_ERR_NO_MEMORY ? StatusCode::kResourceExhausted : StatusCode::kInternal,
            UcsError(("ucp_mem_map of " + std::to_string(len) + " bytes at " + Hex(addr)).c_str(), st)};
  }
  void* buf = nullptr;
  size_t size = 0;
  st = ucp_rkey_pack(ctx->h, memh, &buf, &size);
  if (st != UCS_OK) {
    (void)ucp_mem_unmap(ctx->h, memh);
    return {StatusCode::kInternal, UcsError("ucp_rkey_pack", st)};
  }
  std::string key(static_cast<const char*>(buf), size);
  ucp_rkey_buffer_release(buf);
  *out = std::make_unique<UcxMemoryImpl>(ctx, memh, std::move(key));
  return Status::Ok();
}

Status UcxTransport::ConnectUcx(const UcxPeer& peer, std::shared_ptr<Link>* link) {
  const std::shared_ptr<Context> ctx = impl_->ctx;
  if (!ctx) return {StatusCode::kInvalidArgument, "ucx: ConnectUcx before Start"};
  if (peer.worker_address.empty() || !peer.find_key) {
    return {StatusCode::kUnsupported, "ucx: peer " + peer.name + " offers no UCX worker address"};
  }
  *link = std::make_shared<UcxLink>(ctx, peer, impl_->opts.links);
  return Status::Ok();
}

Status UcxTransport::Connect(const PeerEndpoint&, std::shared_ptr<Link>*) {
  return {StatusCode::kUnsupported,
          "ucx: a PeerEndpoint does not carry a UCX worker address; use UcxTransport::ConnectUcx"};
}

std::string UcxTransport::Describe() {
  std::string out = std::string("UCX ") + ucp_get_version_string() + "; UCX_TLS=";
  const char* tls = std::getenv("UCX_TLS");
  out += tls ? tls : "all (default)";
  if (const char* devs = std::getenv("UCX_NET_DEVICES")) out += std::string("; UCX_NET_DEVICES=") + devs;
  std::shared_ptr<Context> ctx;
  Status s = CreateContext(&ctx);
  out += "; transports: " + (s.ok() ? Resources(ctx->h) : s.message());
  std::vector<std::string> rdma = host::RdmaDevices();
  if (rdma.empty()) {
    out += "; no RDMA (InfiniBand/RoCE) device found";
  } else {
    out += "; RDMA devices:";
    for (const auto& d : rdma) out += " " + d;
  }
  return out;
}

}  // namespace xfer::transport
