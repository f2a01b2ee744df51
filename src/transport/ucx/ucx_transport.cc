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
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
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
// How long a close waits for what was posted to complete before it forces its way.
constexpr auto kDrainGrace = std::chrono::milliseconds(1000);
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
// Flights posted on one endpoint at most: enough to keep a wire busy across a flush's round
// trip; the rest wait their turn (a request of a thousand batches is not a thousand at once).
constexpr size_t kMaxPostedPerConn = 16;
// While links have flights, the progress thread checks this often that someone drives them
// (UcxLink::Rescue), and leads one that nobody drives for at most kRescueBudget.
constexpr int kRescuePollMs = 2;
constexpr auto kRescueBudget = std::chrono::microseconds(500);
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
// One batch on a link, from Start to its `done` call. The leader (see UcxLink) posts it and
// counts its UCX requests down in their completion callbacks, which run on the leader's
// thread: every field after `seq` is the leader's.
struct Flight {
  Op op = Op::kWrite;
  std::span<const Slice> batch;
  std::vector<UcxRemoteKey> keys;  // the regions of the batch's slices
  std::vector<uint32_t> key_of;    // slice -> index in keys
  Clock::time_point deadline;
  Link::Done done;
  std::function<Status()> ready;
  size_t conn = 0;
  uint64_t seq = 0;  // in order of Start
  bool posted = false;
  int left = 0;  // requests posted and not completed
  ucs_status_t error = UCS_OK;
  const char* what = "";
  std::optional<Status> result;  // set: over, `done` is due
};

void OnRequestDone(void* request, ucs_status_t status, void* user) {
  auto* f = static_cast<Flight*>(user);
  if (status != UCS_OK && f->error == UCS_OK) {
    f->error = status;
    f->what = f->op == Op::kWrite ? "put" : "get";
  }
  --f->left;
  ucp_request_free(request);
}

// One endpoint to the peer on a worker of its own: a rail.
struct Conn {
  ucp_worker_h worker = nullptr;
  int efd = -1;  // the worker's event fd
  ucp_ep_h ep = nullptr;
  std::unordered_map<uint64_t, ucp_rkey_h> rkeys;  // region_id -> key unpacked on ep
  size_t posted = 0;  // flights posted on ep and not over
  // Set by UCX's error callback (during the leader's progress calls) when the peer fails.
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

// Batches are started without waiting (Start), so one thread keeps many in flight: a WRITE
// ends with a flush, a round trip, and the next batches' puts fill the wire meanwhile. One
// thread at a time, the leader, makes every UCX call on the link's workers for all of them: it
// posts what was started and progresses until what it waits for is over (Drive), then the
// lead goes to whichever thread needs it next; others that Drive meanwhile sleep (on two
// cores a third spinning thread, beside the leader and the target's, slows everyone). A
// thread that only starts batches leads for one round if nobody leads; if then nobody drives
// for a while, the transport's progress thread does (Rescue).
class UcxLink final : public Link, public std::enable_shared_from_this<UcxLink> {
 public:
  UcxLink(std::shared_ptr<Context> ctx, UcxPeer peer, int links)
      : ctx_(std::move(ctx)), peer_(std::move(peer)), kick_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    for (int i = 0; i < std::max(links, 1); ++i) conns_.push_back(std::make_unique<Conn>());
  }

  ~UcxLink() override {  // nothing runs on it any more: a flight's `done` holds no reference
    for (auto& c : conns_) {
      Teardown(*c);
      if (c->worker) ucp_worker_destroy(c->worker);
    }
    if (kick_ >= 0) ::close(kick_);
  }

  bool pipelined() const override { return true; }

  Status Execute(Op op, std::span<const Slice> batch, Clock::time_point deadline) override {
    Status result;
    std::atomic<bool> over{false};
    Start(op, batch, deadline, [&](Status s) {
      result = std::move(s);
      over.store(true, std::memory_order_release);
    });
    Drive(Clock::time_point::max(), [&] { return over.load(std::memory_order_acquire); });
    return result;
  }

  void Start(Op op, std::span<const Slice> batch, Clock::time_point deadline, Done done,
             std::function<Status()> ready = {}) override {
    if (batch.empty()) return done(Status::Ok());
    if (shut_.load()) return done(Gone());
    if (Clock::now() >= deadline) return done(NotStarted());
    auto f = std::make_unique<Flight>();
    // Every key first: a batch with a range outside the peer's regions moves nothing. A batch
    // nearly always lies in one region: a slice inside the previous one's region reuses its key.
    f->key_of.resize(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      const Slice& s = batch[i];
      const bool same = !f->keys.empty() && s.remote >= f->keys.back().addr &&
                        s.remote + s.len <= f->keys.back().addr + f->keys.back().len;
      if (!same) {
        f->keys.emplace_back();
        if (!peer_.find_key(s.remote, s.len, &f->keys.back())) {
          return done({StatusCode::kRemoteAccessDenied,
                       "ucx: no region of peer " + peer_.name + " holds slice " + std::to_string(i) +
                           " (" + std::to_string(s.len) + " bytes at " + Hex(s.remote) + ")"});
        }
      }
      f->key_of[i] = static_cast<uint32_t>(f->keys.size() - 1);
    }
    f->op = op;
    f->batch = batch;
    f->deadline = deadline;
    f->done = std::move(done);
    f->ready = std::move(ready);
    f->conn = rr_.fetch_add(1) % conns_.size();
    auto self = shared_from_this();
    std::unique_lock l(mu_);
    f->seq = started_.fetch_add(1) + 1;
    flights_.push_back(std::move(f));
    Count();
    if (led_) {
      if (leader_asleep_) Kick();
      return;
    }
    led_ = true;
    l.unlock();
    Lead(Clock::time_point{}, nullptr);  // one round: posts it
    Release();
  }

  // `finished` is called with mu_ held or not: it must not take mu_.
  void Drive(Clock::time_point until, const std::function<bool()>& finished) override {
    auto self = shared_from_this();  // a `done` call may drop the caller's last reference
    std::unique_lock l(mu_);
    for (bool first = true; !finished(); first = false) {
      if (!led_) {
        led_ = true;
        l.unlock();
        Lead(until, finished);
        Release();
        if (Clock::now() >= until) return;
        l.lock();
        continue;
      }
      if (!first && Clock::now() >= until) return;
      // The leader ends every flight, by its deadline at the latest: the bound is a safety net.
      ++waiting_;
      cv_.wait_until(l, std::min(until, Clock::now() + std::chrono::milliseconds(kIdlePollMs)));
      --waiting_;
    }
  }

  void Quiesce() override {
    const uint64_t upto = started_.load();
    Drive(Clock::time_point::max(), [&] { return oldest_.load() > upto; });
  }

  void Shutdown() override {
    shut_.store(true);
    // The leader ends every flight when it sees shut_. This thread leads if nobody does.
    Drive(Clock::time_point::max(), [&] { return in_flight_.load() == 0; });
    auto self = shared_from_this();
    std::unique_lock l(mu_);
    if (led_) return;  // a thread that started a batch since: it sees shut_
    led_ = true;
    l.unlock();
    for (auto& c : conns_) Teardown(*c);
    Release();
  }

  // For the transport's progress thread, every few milliseconds while flights exist: leads
  // for up to `budget` if flights wait and nobody has led since the last call, so that a
  // caller that starts batches and never drives still sees them end. True while the link has
  // flights.
  bool Rescue(std::chrono::microseconds budget) {
    {
      std::lock_guard l(mu_);
      if (flights_.empty()) return false;
      const bool stale = rounds_ == rescue_seen_;
      rescue_seen_ = rounds_;
      if (led_ || !stale) return true;
      led_ = true;
    }
    auto self = shared_from_this();
    Lead(Clock::now() + budget, [&] { return in_flight_.load() == 0 || waiting_.load() > 0; });
    Release();
    std::lock_guard l(mu_);
    rescue_seen_ = rounds_;
    return !flights_.empty();
  }

 private:
  Status Gone() const {
    return {StatusCode::kConnectionLost, "ucx: the session with " + peer_.name + " ended"};
  }
  Status NotStarted() const {
    return {StatusCode::kTimeout, "ucx: deadline passed before the batch to " + peer_.name + " started"};
  }
  void Kick() {
    uint64_t one = 1;
    if (::write(kick_, &one, sizeof one) < 0) {
    }  // the leader's poll timeout notices the flight anyway
  }

  // After flights_ changed (mu_).
  void Count() {
    in_flight_.store(flights_.size());
    oldest_.store(flights_.empty() ? started_.load() + 1 : flights_.front()->seq);
  }

  void Release() {
    std::lock_guard l(mu_);
    led_ = false;
    if (!flights_.empty()) cv_.notify_all();  // a thread that waits for one may lead now
  }

  // Leads until `finished()` or `until` (`finished` null: one round). A round: flights that
  // are over leave and get their `done` call, new ones are posted, the workers progress. UCX
  // having nothing new, the leader spins, then sleeps on the workers' event fds (a long batch
  // over a slow wire should not cost a core).
  void Lead(Clock::time_point until, const std::function<bool()>& finished) {
    std::vector<std::unique_ptr<Flight>> over;
    std::vector<Flight*> fresh;
    unsigned idle = 0;
    Backoff backoff;
    for (unsigned round = 0;; ++round) {
      const bool clock = round % kSpinsPerClockRead == 0;
      const auto now = clock ? Clock::now() : Clock::time_point{};
      uint64_t expired = 0;  // conns whose endpoint goes: a failed or late flight, or shut down
      {
        std::lock_guard l(mu_);
        ++rounds_;
        fresh.clear();
        for (auto& f : flights_) {
          if (f->result) continue;
          if (!f->posted) {
            if (clock && (shut_.load() || now >= f->deadline)) {
              End(*f, shut_.load() ? Gone() : NotStarted());
            } else if (conns_[f->conn]->posted + PostingTo(fresh, f->conn) < kMaxPostedPerConn) {
              fresh.push_back(f.get());
            }
          } else if (f->error != UCS_OK || (clock && (shut_.load() || now >= f->deadline))) {
            expired |= uint64_t{1} << f->conn;
          } else if (f->left == 0) {
            End(*f, Status::Ok());
          }
        }
        auto keep = std::stable_partition(flights_.begin(), flights_.end(),
                                          [](const auto& f) { return !f->result; });
        std::move(keep, flights_.end(), std::back_inserter(over));
        flights_.erase(keep, flights_.end());
        Count();
      }
      if (!over.empty()) {
        for (auto& f : over) f->done(std::move(*f->result));
        over.clear();
        std::lock_guard l(mu_);
        cv_.notify_all();  // a waiting thread's flight may be among them
      }
      if (finished && finished()) return;
      bool busy = false;
      for (size_t i = 0; i < conns_.size(); ++i) {
        if ((expired >> i & 1) || conns_[i]->failure.load() != UCS_OK) {
          EndPosted(*conns_[i]);
          busy = true;
        }
      }
      if (!busy) {
        for (Flight* f : fresh) Post(*conns_[f->conn], *f);
        for (auto& c : conns_) busy = (c->worker && ucp_worker_progress(c->worker) != 0) || busy;
      }
      if (!finished || (clock && now >= until)) return;
      if (busy || !fresh.empty()) {
        idle = 0;
        backoff.Reset();
      } else if (++idle < kSpinsBeforeSleep) {
        backoff.Pause();
      } else {
        idle = 0;
        backoff.Reset();
        Sleep();
      }
    }
  }

  // Sleeps until a worker has events, a thread starts a batch, or kSleepMs passed.
  void Sleep() {
    {
      std::lock_guard l(mu_);
      for (const auto& f : flights_) {
        if (!f->posted && !f->result) return;  // started while this round progressed
      }
      leader_asleep_ = true;
    }
    std::vector<pollfd> p{{kick_, POLLIN, 0}};
    bool armed = true;
    for (auto& c : conns_) {
      if (!c->worker) continue;
      if (ucp_worker_arm(c->worker) != UCS_OK) armed = false;  // events came in: progress
      p.push_back({c->efd, POLLIN, 0});
    }
    if (armed) {
      ::poll(p.data(), p.size(), kSleepMs);
      uint64_t n;
      if (::read(kick_, &n, sizeof n) < 0) {
      }  // nothing to drain
    }
    std::lock_guard l(mu_);
    leader_asleep_ = false;
  }

  static size_t PostingTo(const std::vector<Flight*>& fresh, size_t conn) {
    return std::count_if(fresh.begin(), fresh.end(), [&](const Flight* f) { return f->conn == conn; });
  }

  // A flight is over (mu_): it leaves the list in this round, and its `done` is called.
  void End(Flight& f, Status result) {
    if (f.posted) --conns_[f.conn]->posted;
    f.posted = false;
    f.result = std::move(result);
  }

  // Posts a flight: its puts (then a flush) or gets, each completing in OnRequestDone. A WRITE
  // is over when its flush is (the data is in place at the target); a READ when its gets are
  // (a get completes when its data has arrived: a flush would only cost a round trip). A
  // flight that cannot be posted ends here; one posted in part fails the endpoint (Lead).
  void Post(Conn& c, Flight& f) {
    Status s = f.ready ? f.ready() : Status::Ok();
    if (!s.ok()) {
      std::lock_guard l(mu_);
      End(f, std::move(s));
      return;
    }
    s = Connect(c);
    // Keys of regions the peer deregistered would pile up for the life of the link: start
    // over now and then, when no request holds a key.
    if (s.ok() && c.posted == 0 && c.rkeys.size() + f.keys.size() > kMaxCachedKeys) DestroyKeys(c);
    std::vector<ucp_rkey_h> unpacked(f.keys.size());
    for (size_t k = 0; k < unpacked.size() && s.ok(); ++k) s = Unpack(c, f.keys[k], &unpacked[k]);
    if (!s.ok()) {
      if (c.ep && c.posted == 0) Teardown(c);  // a key it cannot unpack: start afresh
      std::lock_guard l(mu_);
      End(f, std::move(s));
      return;
    }
    f.posted = true;
    f.left = 0;
    f.error = UCS_OK;
    ++c.posted;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = OnRequestDone;
    p.user_data = &f;
    auto issued = [&](ucs_status_ptr_t r, const char* what) {
      if (UCS_PTR_IS_ERR(r)) {
        f.error = UCS_PTR_STATUS(r);
        f.what = what;
        return false;
      }
      if (r != nullptr) ++f.left;  // completes in OnRequestDone, during a later progress call
      return true;
    };
    for (size_t i = 0; i < f.batch.size(); ++i) {
      const Slice& sl = f.batch[i];
      void* buf = reinterpret_cast<void*>(sl.local);
      const ucp_rkey_h key = unpacked[f.key_of[i]];
      const bool ok = f.op == Op::kWrite
                          ? issued(ucp_put_nbx(c.ep, buf, sl.len, sl.remote, key, &p), "ucp_put_nbx")
                          : issued(ucp_get_nbx(c.ep, buf, sl.len, sl.remote, key, &p), "ucp_get_nbx");
      if (!ok) return;
    }
    if (f.op == Op::kWrite) issued(ucp_ep_flush_nbx(c.ep, &p), "ucp_ep_flush_nbx");
  }

  // A flight on c failed or ran out of time, or the peer failed, or the link was shut down:
  // the endpoint goes, which ends every request on it. Each posted flight then ends: done if
  // all of it completed, else by its own cause; one that was only caught up in another's
  // deadline is posted again.
  void EndPosted(Conn& c) {
    const ucs_status_t peer_failed = c.failure.load();
    Teardown(c);
    const auto now = Clock::now();
    std::lock_guard l(mu_);
    for (auto& fp : flights_) {
      Flight& f = *fp;
      if (!f.posted || conns_[f.conn].get() != &c) continue;
      const bool own_error = f.error != UCS_OK && f.error != UCS_ERR_CANCELED;
      if (f.left == 0 && f.error == UCS_OK) {
        End(f, Status::Ok());  // it moved its bytes, late or not
      } else if (shut_.load()) {
        End(f, Gone());
      } else if (now >= f.deadline) {
        End(f, {StatusCode::kTimeout, std::string("ucx: deadline passed waiting for a ") +
                                          (f.op == Op::kWrite ? "WRITE" : "READ") + " batch to " +
                                          peer_.name + " to complete"});
      } else if (own_error || peer_failed != UCS_OK) {
        End(f, {StatusCode::kConnectionLost,
                UcsError((std::string(own_error ? f.what : "connection") + " to " + peer_.name).c_str(),
                         own_error ? f.error : peer_failed)});
      } else {
        f.posted = false;  // canceled by the close: post it again
        --c.posted;
      }
    }
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

  static void DestroyKeys(Conn& c) {
    for (auto& [id, k] : c.rkeys) ucp_rkey_destroy(k);
    c.rkeys.clear();
  }

  // Closes the endpoint; once this returns, no request of ours can still touch the callers'
  // memory. While the peer has not failed, what was posted completes first (a flush): closing
  // while puts still arrive makes UCX 1.13 at the target abort ("unexpected error: Endpoint
  // timeout" when it answers them). Then, or after kDrainGrace, or at once when the peer
  // failed, a forced close cancels what is outstanding. The worker stays for the next
  // endpoint unless UCX failed to give the requests back, in which case it goes too.
  void Teardown(Conn& c) {
    if (!c.ep) return;
    ucp_request_param_t none{};
    void* flush = c.failure.load() == UCS_OK ? ucp_ep_flush_nbx(c.ep, &none) : nullptr;
    if (UCS_PTR_IS_ERR(flush)) flush = nullptr;
    if (WaitRequest(c.worker, flush, Clock::now() + kDrainGrace) != UCS_INPROGRESS) flush = nullptr;
    const auto until = Clock::now() + kTeardownGrace;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    bool clean = WaitRequest(c.worker, ucp_ep_close_nbx(c.ep, &p), until) != UCS_INPROGRESS;
    clean = WaitRequest(c.worker, flush, until) != UCS_INPROGRESS && clean;  // canceled by the close
    c.ep = nullptr;
    auto outstanding = [&] {
      std::lock_guard l(mu_);
      for (const auto& f : flights_) {
        if (f->posted && f->left > 0 && conns_[f->conn].get() == &c) return true;
      }
      return false;
    };
    Backoff backoff;
    while (clean && outstanding()) {
      if (Clock::now() >= until) {
        clean = false;
      } else if (ucp_worker_progress(c.worker) == 0) {
        backoff.Pause();
      }
    }
    c.failure.store(UCS_OK);
    if (clean) {
      DestroyKeys(c);
      return;
    }
    // A request still holds its key and buffer: leave the keys to the worker's pools, which go
    // with it.
    XLOG(ERROR) << "ucx: requests to " << peer_.name
                << " did not complete after a forced close; destroying their worker";
    c.rkeys.clear();
    ucp_worker_destroy(c.worker);  // stops all its transports: no more access to our memory
    c.worker = nullptr;
    c.efd = -1;
    std::lock_guard l(mu_);
    for (auto& f : flights_) {
      if (f->posted && f->left > 0 && conns_[f->conn].get() == &c) {
        f->left = 0;
        if (f->error == UCS_OK) f->error = UCS_ERR_CANCELED;
      }
    }
  }

  const std::shared_ptr<Context> ctx_;
  const UcxPeer peer_;
  std::vector<std::unique_ptr<Conn>> conns_;
  std::atomic<uint32_t> rr_{0};
  std::atomic<bool> shut_{false};
  const int kick_;  // eventfd: a started flight wakes a sleeping leader

  std::mutex mu_;
  std::condition_variable cv_;  // flights ended, or the lead is free
  bool led_ = false;
  bool leader_asleep_ = false;  // in poll on the workers' fds and kick_
  std::vector<std::unique_ptr<Flight>> flights_;  // started, in order, until their `done`
  uint64_t rounds_ = 0;       // leader rounds so far
  uint64_t rescue_seen_ = 0;  // rounds_ at the last Rescue
  // Read without mu_ (by `finished` predicates), written under it.
  std::atomic<uint64_t> started_{0};  // flights started so far
  std::atomic<uint64_t> oldest_{1};   // seq of the oldest flight not over (started_ + 1: none)
  std::atomic<size_t> in_flight_{0};  // flights_.size()
  std::atomic<int> waiting_{0};       // threads in Drive waiting for the lead
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
  // idle, it costs one wakeup per kIdlePollMs (kRescuePollMs while links have flights).
  void Progress(int efd) {
    pthread_setname_np(pthread_self(), "xfer-ucx-prog");
    auto next_rescue = Clock::now();
    bool flights = false;
    while (!stop.load(std::memory_order_relaxed)) {
      // After activity, keep polling a moment before sleeping: the next put of a request in
      // flight usually follows within microseconds, and a wake-up costs tens of them. Progress
      // at least once per wake-up, however late this thread runs.
      Backoff backoff;
      auto quiet_until = Clock::now() + kTargetSpin;
      Clock::time_point now;
      do {
        if (ucp_worker_progress(worker) != 0) {
          while (ucp_worker_progress(worker) != 0) {
          }
          quiet_until = Clock::now() + kTargetSpin;
          backoff.Reset();
        } else {
          backoff.Pause();
        }
        now = Clock::now();
        if (now >= next_rescue) {
          flights = RescueLinks();
          next_rescue = now + std::chrono::milliseconds(kRescuePollMs);
        }
      } while (now < quiet_until);
      ucs_status_t st = ucp_worker_arm(worker);
      if (st == UCS_ERR_BUSY) continue;  // events arrived since the last progress
      if (st != UCS_OK) {
        XLOG(ERROR) << UcsError("ucp_worker_arm", st);
        ::poll(nullptr, 0, kIdlePollMs);  // keep serving, without spinning
        continue;
      }
      pollfd p[2] = {{efd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
      ::poll(p, 2, flights ? kRescuePollMs : kIdlePollMs);
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
    auto probe = std::make_shared<UcxLink>(m.ctx, self, 1);
    const Slice put{reinterpret_cast<uint64_t>(&one), reinterpret_cast<uint64_t>(&word), sizeof word};
    s = probe->Execute(Op::kWrite, {&put, 1}, Clock::now() + kProbeTimeout);
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
  auto ucx = std::make_shared<UcxLink>(ctx, peer, impl_->opts.links);
  {
    std::lock_guard l(impl_->links_mu);
    impl_->links.push_back(ucx);
  }
  *link = std::move(ucx);
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
