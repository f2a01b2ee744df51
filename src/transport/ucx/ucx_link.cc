#include "transport/ucx/ucx_link.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <optional>
#include <string>
#include <unordered_map>

#include "util/log.h"
#include "util/spin.h"
#include "util/text.h"

namespace xfer::transport::ucx {
using text::Hex;
namespace {

// How long a close waits for what was posted (4 MiB at most) to complete before it forces its
// way: a peer that answers drains in milliseconds.
constexpr auto kDrainGrace = std::chrono::milliseconds(1000);
// How long a forced close may take to give back the requests. It completes them at once on
// every transport we know; the bound only keeps a UCX bug from hanging us.
constexpr auto kTeardownGrace = std::chrono::seconds(2);
// Unpacked keys kept per endpoint.
constexpr size_t kMaxCachedKeys = 4096;
// Batches and bytes posted on one endpoint at most (one batch however large): enough to keep
// a wire busy across a flush's round trip; the rest wait their turn (a request of a thousand
// batches is not a thousand at once, and a close drains what was posted quickly).
constexpr size_t kMaxPostedPerConn = 16;
constexpr uint64_t kMaxPostedBytesPerConn = 4 << 20;
// A leader reads the clock every kSpinsPerClockRead rounds, and after kSpinsBeforeSleep rounds
// without news sleeps on the workers' event fds, kSleepMs at most (the bound only matters if a
// transport fails to signal an event).
constexpr unsigned kSpinsPerClockRead = 64;
constexpr unsigned kSpinsBeforeSleep = 256;
constexpr int kSleepMs = 1;
// Rounds a thread leaving the lead adds for batches started meanwhile (LeaveLead).
constexpr int kExtraRounds = 4;
// A thread waiting for another's lead wakes this often even without news: a safety net.
constexpr auto kFollowerWake = std::chrono::milliseconds(100);

}  // namespace

// One batch, from Start to its `done` call. The leader of its endpoint posts it and counts its
// UCX requests down in their completion callbacks, which run on the leader's thread: the
// fields from `posted` on are the leader's; `commit` and `result` are UcxLink::mu_'s.
struct Flight {
  Op op = Op::kWrite;
  std::span<const Slice> batch;
  std::vector<UcxRemoteKey> keys;  // the regions of the batch's slices
  std::vector<uint32_t> key_of;    // slice -> index in keys
  uint64_t bytes = 0;
  Clock::time_point deadline;
  Link::Done done;
  std::function<Status()> ready;
  uint64_t commit = 0;             // set when a leader takes it to post (in that order; 0: waiting)
  Clock::time_point committed_at;  // when (mu_'s, as commit)
  bool interrupted = false;        // a fence gave up on it (Interrupt; mu_'s)
  bool posted = false;
  int left = 0;  // requests posted and not completed
  ucs_status_t error = UCS_OK;
  const char* what = "";
  std::optional<Status> result;  // set: over, `done` is due
};

// One endpoint to the peer on a worker of its own: a rail.
struct Conn {
  Wakeup kick;  // a started batch wakes a sleeping leader
  // Under UcxLink::mu_:
  bool led = false;
  bool leader_asleep = false;                    // in poll on the worker's fd and kick
  std::vector<std::unique_ptr<Flight>> flights;  // started here, in order, until their `done`
  uint64_t rounds = 0;                           // leader rounds so far
  uint64_t rescue_seen = 0;                      // rounds at the last Rescue
  Clock::time_point last_done;                   // when a posted flight last moved all its bytes
  // The leader's:
  ucp_worker_h worker = nullptr;
  int efd = -1;  // the worker's event fd
  ucp_ep_h ep = nullptr;
  std::unordered_map<uint64_t, ucp_rkey_h> rkeys;  // region_id -> key unpacked on ep
  size_t posted = 0;                               // flights posted on ep and not over
  uint64_t posted_bytes = 0;                       // their bytes

  // Whether one more flight of `bytes` may be posted beside `n` flights of `total` bytes.
  static bool Room(size_t n, uint64_t total, uint64_t bytes) {
    return n == 0 || (n < kMaxPostedPerConn && total + bytes <= kMaxPostedBytesPerConn);
  }
  void Unpost(Flight& f) {
    if (!f.posted) return;
    f.posted = false;
    --posted;
    posted_bytes -= f.bytes;
  }
  // Set by UCX's error callback (during the leader's progress calls) when the peer fails.
  std::atomic<ucs_status_t> failure{UCS_OK};
};

namespace {

void OnRequestDone(void* request, ucs_status_t status, void* user) {
  auto* f = static_cast<Flight*>(user);
  if (status != UCS_OK && f->error == UCS_OK) {
    f->error = status;
    f->what = f->op == Op::kWrite ? "put" : "get";
  }
  --f->left;
  Ucx().ucp_request_free(request);
}

void OnPeerError(void* arg, ucp_ep_h, ucs_status_t status) { static_cast<Conn*>(arg)->failure.store(status); }

void DestroyKeys(Conn& c) {
  for (auto& [id, k] : c.rkeys) Ucx().ucp_rkey_destroy(k);
  c.rkeys.clear();
}

// Whether a posted flight of c still waits for UCX requests (mu_).
bool Outstanding(const Conn& c) {
  return std::any_of(c.flights.begin(), c.flights.end(),
                     [](const auto& f) { return f->posted && f->left > 0; });
}

// Whether c has a flight its leader would post in the next round (mu_, as c's leader).
bool Postable(const Conn& c) {
  for (const auto& f : c.flights) {
    if (!f->posted && !f->result) return Conn::Room(c.posted, c.posted_bytes, f->bytes);
  }
  return false;
}

}  // namespace

UcxLink::UcxLink(std::shared_ptr<Context> ctx, UcxPeer peer, int links, std::function<void()> nudge)
    : ctx_(std::move(ctx)), peer_(std::move(peer)), nudge_(std::move(nudge)) {
  for (int i = 0; i < std::max(links, 1); ++i) conns_.push_back(std::make_unique<Conn>());
}

UcxLink::~UcxLink() {
  shut_.store(true);
  std::vector<Conn*> all;
  for (auto& c : conns_) all.push_back(c.get());
  Teardown(all, kDrainGrace);  // ends what is in flight
  for (auto& c : conns_) {
    if (c->worker) Ucx().ucp_worker_destroy(c->worker);
    for (auto& f : c->flights) f->done(f->result ? std::move(*f->result) : Gone());
  }
}

Status UcxLink::Gone() const {
  return {StatusCode::kConnectionLost, "ucx: the session with " + peer_.name + " ended"};
}

Status UcxLink::Interrupted() const {
  return {StatusCode::kConnectionLost,
          "ucx: interrupted: the batch to " + peer_.name + " did not complete while a fence waited"};
}

Status UcxLink::NotStarted() const {
  return {StatusCode::kTimeout, "ucx: deadline passed before the batch to " + peer_.name + " started"};
}

Status UcxLink::Execute(Op op, std::span<const Slice> batch, Clock::time_point deadline) {
  Status result;
  std::atomic<bool> over{false};
  Start(op, batch, deadline, [&](Status s) {
    result = std::move(s);
    over.store(true, std::memory_order_release);
  });
  Drive(Clock::time_point::max(), [&] { return over.load(std::memory_order_acquire); });
  return result;
}

void UcxLink::Start(Op op, std::span<const Slice> batch, Clock::time_point deadline, Done done,
                    std::function<Status()> ready) {
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
      if (!peer_.find_key(s.remote, s.len, op == Op::kWrite, &f->keys.back())) {
        return done({StatusCode::kRemoteAccessDenied,
                     "ucx: no region of peer " + peer_.name + " holds slice " + std::to_string(i) + " (" +
                         std::to_string(s.len) + " bytes at " + Hex(s.remote) + ")"});
      }
    }
    f->key_of[i] = static_cast<uint32_t>(f->keys.size() - 1);
    f->bytes += s.len;
  }
  f->op = op;
  f->batch = batch;
  f->deadline = deadline;
  f->done = std::move(done);
  f->ready = std::move(ready);
  auto self = shared_from_this();  // a `done` call may drop the caller's last reference
  Conn& c = *conns_[rr_.fetch_add(1) % conns_.size()];
  std::unique_lock l(mu_);
  if (shut_.load()) {  // again, under mu_: once Shutdown's Drive has looked, nobody would end it
    l.unlock();
    return f->done(Gone());
  }
  const bool first = in_flight_.load() == 0;
  c.flights.push_back(std::move(f));
  Count();
  if (c.led) {
    const bool wake = c.leader_asleep;
    l.unlock();
    if (wake) c.kick.Signal();
  } else {
    c.led = true;
    l.unlock();
    std::vector<Conn*> mine{&c};
    Lead(mine, Clock::time_point{}, nullptr, LeadMode::kRound);  // posts it
    LeaveLead(mine, false);
  }
  if (first && nudge_) nudge_();  // the rescue may be dozing: nobody may drive this one
}

void UcxLink::Drive(Clock::time_point until, const std::function<bool()>& finished) {
  auto self = shared_from_this();
  std::vector<Conn*> mine;
  std::unique_lock l(mu_);
  ++drivers_;
  for (bool first = true; !finished(); first = false) {
    Adopt(&mine, Share());
    if (!mine.empty()) {
      l.unlock();
      Lead(mine, until, finished, LeadMode::kDrive);
      LeaveLead(mine, true);
      l.lock();
      if (Clock::now() >= until) break;
      continue;
    }
    if (!first && Clock::now() >= until) break;
    // The leaders end every batch, by its deadline at the latest: the bound is a safety net.
    ++waiting_;
    cv_.wait_until(l, std::min(until, Clock::now() + kFollowerWake));
    --waiting_;
  }
  --drivers_;
}

uint64_t UcxLink::QuiesceMark() {
  std::lock_guard l(mu_);
  return commits_;
}

void UcxLink::Quiesce(uint64_t upto, Clock::time_point deadline) {
  // Batches taken to be posted after the mark ask `ready` first, which sees what changed.
  auto over = [&] { return oldest_commit_.load() > upto; };
  Drive(deadline, over);
  if (over()) return;
  // The peer stalls them: their endpoints close (a forced close cancels what was posted).
  XLOG(WARN) << "ucx: batches to " << peer_.name << " did not complete while a fence waited; "
             << "interrupting them";
  uint64_t below = interrupt_below_.load();
  while (below < upto + 1 && !interrupt_below_.compare_exchange_weak(below, upto + 1)) {
  }
  if (nudge_) nudge_();
  while (!over()) Drive(Clock::now() + std::chrono::milliseconds(100), over);
}

void UcxLink::Interrupt(Clock::time_point since, bool /*control_thread*/) {
  // The peer stalls an endpoint with a batch taken to be posted before `since` that has
  // completed none since: those batches end as a late Quiesce ends them (their endpoint
  // closes; kConnectionLost). Endpoints that completed one since are left alone.
  bool marked = false;
  std::vector<Conn*> asleep;  // leaders to wake, so that they see it now
  {
    std::lock_guard l(mu_);
    for (const auto& c : conns_) {
      if (c->last_done >= since) continue;
      for (const auto& f : c->flights) {
        if (f->result || f->interrupted || f->commit == 0 || f->committed_at >= since) continue;
        f->interrupted = marked = true;
        if (c->leader_asleep) asleep.push_back(c.get());
      }
    }
  }
  if (!marked) return;
  XLOG(WARN) << "ucx: batches to " << peer_.name << " completed nothing while a fence waited; "
             << "interrupting them";
  for (Conn* c : asleep) c->kick.Signal();
  if (nudge_) nudge_();
}

void UcxLink::Shutdown() {
  shut_.store(true);
  // The leaders end every batch when they see shut_; endpoints nobody leads end here.
  Drive(Clock::time_point::max(), [&] { return in_flight_.load() == 0; });
  auto self = shared_from_this();
  std::vector<Conn*> mine;
  {
    std::lock_guard l(mu_);
    for (auto& c : conns_) {  // (one a batch started since is led by that thread: it sees shut_)
      if (!c->led) {
        c->led = true;
        mine.push_back(c.get());
      }
    }
  }
  Teardown(mine, kDrainGrace);
  LeaveLead(mine, false);
}

bool UcxLink::Rescue(std::chrono::microseconds budget) {
  // Shutdown drives a shut link itself (Start refuses batches once it is shut).
  if (shut_.load()) return in_flight_.load() > 0;
  std::vector<Conn*> mine;
  {
    std::lock_guard l(mu_);
    for (auto& c : conns_) {
      const bool stale = c->rounds == c->rescue_seen;
      c->rescue_seen = c->rounds;
      if (stale && !c->led && !c->flights.empty()) {
        c->led = true;
        mine.push_back(c.get());
      }
    }
  }
  if (!mine.empty()) {
    auto self = shared_from_this();
    Lead(
        mine, Clock::now() + budget, [&] { return in_flight_.load() == 0 || waiting_.load() > 0; },
        LeadMode::kRescue);
    {
      std::lock_guard l(mu_);
      for (Conn* c : mine) c->rescue_seen = c->rounds;
    }
    LeaveLead(mine, false);
  }
  return in_flight_.load() > 0;
}

// Takes the lead of endpoints with batches that nobody leads, up to `limit` in all (mu_).
void UcxLink::Adopt(std::vector<Conn*>* mine, size_t limit) {
  for (auto& c : conns_) {
    if (mine->size() >= limit) return;
    if (!c->led && !c->flights.empty()) {
      c->led = true;
      mine->push_back(c.get());
    }
  }
}

// How many endpoints with batches one driving thread should lead: all of them when it drives
// alone, else its share, so that streams driving beside the caller each take a rail (mu_).
size_t UcxLink::Share() const {
  if (drivers_ <= 1) return SIZE_MAX;
  const size_t busy =
      std::count_if(conns_.begin(), conns_.end(), [](const auto& c) { return !c->flights.empty(); });
  return std::max<size_t>(1, (busy + drivers_ - 1) / drivers_);
}

// Gives up the lead of `mine`. An endpoint with a batch waiting to be posted stays one more
// round with this thread when no other thread drives (`driver`: this one is in Drive), a few
// rounds at most: a batch started while its leader was leaving would otherwise wait for the
// rescue.
void UcxLink::LeaveLead(std::vector<Conn*>& mine, bool driver) {
  for (int extra = 0; !mine.empty(); ++extra) {
    bool flights = false;
    {
      std::lock_guard l(mu_);
      const bool alone = drivers_ == (driver ? 1 : 0) && extra < kExtraRounds;
      std::erase_if(mine, [&](Conn* c) {
        if (alone && Postable(*c)) return false;
        c->led = false;
        flights = flights || !c->flights.empty();
        return true;
      });
      if (flights) cv_.notify_all();  // a thread that waits for one of them may lead now
    }
    if (!mine.empty()) Lead(mine, Clock::time_point{}, nullptr, LeadMode::kRound);
  }
}

// After flights changed (mu_).
void UcxLink::Count() {
  size_t n = 0;
  uint64_t oldest = commits_ + 1;
  for (const auto& c : conns_) {
    n += c->flights.size();
    for (const auto& f : c->flights) {  // the committed ones lead the list, in commit order
      if (f->result) continue;
      if (f->commit != 0) oldest = std::min(oldest, f->commit);
      break;
    }
  }
  in_flight_.store(n);
  oldest_commit_.store(oldest);
}

// (mu_) Drops from `mine` the endpoints without batches and those past this driver's share,
// then adopts undriven ones up to it; false when none is left.
bool UcxLink::KeepShare(std::vector<Conn*>* mine) {
  const size_t share = Share();
  const size_t before = mine->size();
  std::erase_if(*mine, [](Conn* c) {
    if (!c->flights.empty()) return false;
    c->led = false;  // nothing to drive there
    return true;
  });
  while (mine->size() > share) {
    mine->back()->led = false;
    mine->pop_back();
  }
  if (mine->size() < before) cv_.notify_all();
  Adopt(mine, share);
  return !mine->empty();
}

// (mu_) One endpoint's flights in one round: those not posted yet are ended (shut down, or
// past their deadline) or taken to be posted, in order while they fit (`fresh`); those over
// move to `over`; an endpoint with a failed or late flight is `expired` (it closes).
void UcxLink::SweepFlights(Conn& c, const Sweep& sweep, std::vector<std::pair<Conn*, Flight*>>* fresh,
                           std::vector<Conn*>* expired, std::vector<std::unique_ptr<Flight>>* over,
                           bool* interrupting) {
  size_t posting = c.posted;
  uint64_t posting_bytes = c.posted_bytes;
  bool full = false;  // in order: none may overtake one that does not fit (see Count)
  bool late = false;
  for (auto& f : c.flights) {
    if (f->result) continue;
    const bool due = sweep.clock && (sweep.shut || sweep.now >= f->deadline);
    const bool interrupted = (f->commit != 0 && f->commit < sweep.interrupt_below) || f->interrupted;
    if (!f->posted) {
      if (interrupted) {
        End(c, *f, Interrupted());
      } else if (due) {
        End(c, *f, sweep.shut ? Gone() : NotStarted());
      } else if (!full && Conn::Room(posting, posting_bytes, f->bytes)) {
        ++posting;
        posting_bytes += f->bytes;
        if (f->commit == 0) {
          f->commit = ++commits_;
          f->committed_at = sweep.clock ? sweep.now : Clock::now();
        }
        fresh->emplace_back(&c, f.get());
      } else {
        full = true;
      }
    } else if (f->error != UCS_OK) {
      late = true;
    } else if (f->left == 0) {
      End(c, *f, Status::Ok());  // it moved its bytes, late or not
      c.last_done = sweep.clock ? sweep.now : Clock::now();
    } else if (interrupted) {
      late = true;
      *interrupting = true;
    } else if (due) {
      // Others close (without waiting) for batches nobody waited for since.
      late = late || sweep.may_drain || sweep.now >= f->deadline + kDrainGrace;
    }
  }
  if (late || c.failure.load() != UCS_OK) expired->push_back(&c);
  auto keep =
      std::stable_partition(c.flights.begin(), c.flights.end(), [](const auto& f) { return !f->result; });
  std::move(keep, c.flights.end(), std::back_inserter(*over));
  c.flights.erase(keep, c.flights.end());
}

// Leads the endpoints in `mine` (and any that become free with batches) until `finished()` or
// `until` (`finished` null: one round). A round: flights that are over leave and get their
// `done` call, new ones are posted, the workers progress. UCX having nothing new, the leader
// spins, then sleeps on the workers' event fds (a long batch over a slow wire should not cost
// a core).
void UcxLink::Lead(std::vector<Conn*>& mine, Clock::time_point until, const std::function<bool()>& finished,
                   LeadMode mode) {
  std::vector<std::unique_ptr<Flight>> over;
  std::vector<std::pair<Conn*, Flight*>> fresh;
  std::vector<Conn*> expired;  // its endpoint goes: a failed or late flight, or shut down
  // Closing for a deadline waits for what was posted (kDrainGrace): a thread that drives for
  // long does it at the deadline; one round, a poll and the rescue (on the target's progress
  // thread) do not wait, and close only a second after the deadline.
  const bool may_drain = mode == LeadMode::kDrive && until - Clock::now() >= kDrainGrace;
  unsigned idle = 0;
  Backoff backoff;
  for (unsigned round = 0;; ++round) {
    const bool clock = round % kSpinsPerClockRead == 0;
    const auto now = clock ? Clock::now() : Clock::time_point{};
    fresh.clear();
    expired.clear();
    bool interrupted = false;  // a flight of an endpoint that goes was interrupted
    {
      std::lock_guard l(mu_);
      // A driver keeps its share of the endpoints with batches, no more; none left: others
      // drive every endpoint with batches, and Drive waits.
      if (mode == LeadMode::kDrive && !KeepShare(&mine)) return;
      const Sweep sweep{clock, now, shut_.load(), may_drain, interrupt_below_.load()};
      for (Conn* c : mine) {
        if (mode != LeadMode::kRound) ++c->rounds;  // (rounds show the rescue that someone drives)
        SweepFlights(*c, sweep, &fresh, &expired, &over, &interrupted);
      }
      Count();
    }
    if (!over.empty()) {
      for (auto& f : over) f->done(std::move(*f->result));
      over.clear();
      std::lock_guard l(mu_);
      cv_.notify_all();  // a waiting thread's batch may be among them
    }
    if (finished && finished()) return;
    // (No drain either for flights a fence interrupts: their peer answered nothing meanwhile.)
    const bool interrupting = interrupted || interrupt_below_.load() > oldest_commit_.load();
    if (!expired.empty()) {
      EndPosted(expired, may_drain && !interrupting ? kDrainGrace : std::chrono::milliseconds(0));
    }
    bool busy = !expired.empty() || !fresh.empty();
    if (expired.empty()) {
      for (auto [c, f] : fresh) Post(*c, *f);
      for (Conn* c : mine) busy = (c->worker && Ucx().ucp_worker_progress(c->worker) != 0) || busy;
    }
    if (!finished || (clock && now >= until)) return;
    if (busy) {
      idle = 0;
      backoff.Reset();
    } else if (++idle < kSpinsBeforeSleep) {
      backoff.Pause();
    } else {
      idle = 0;
      backoff.Reset();
      Sleep(mine);
    }
  }
}

// Sleeps until a worker has events, a thread starts a batch here, or kSleepMs passed.
void UcxLink::Sleep(const std::vector<Conn*>& mine) {
  {
    std::lock_guard l(mu_);
    for (const Conn* c : mine) {
      if (Postable(*c)) return;  // started while this round progressed
    }
    for (Conn* c : mine) c->leader_asleep = true;
  }
  std::vector<pollfd> p;
  bool armed = true;
  for (Conn* c : mine) {
    p.push_back({c->kick.fd, POLLIN, 0});
    if (!c->worker) continue;
    if (Ucx().ucp_worker_arm(c->worker) != UCS_OK) armed = false;  // events came in: progress
    p.push_back({c->efd, POLLIN, 0});
  }
  if (armed) ::poll(p.data(), p.size(), kSleepMs);
  {
    std::lock_guard l(mu_);
    for (Conn* c : mine) c->leader_asleep = false;
  }
  for (Conn* c : mine) c->kick.Clear();
}

// A flight is over (mu_): it leaves the list in this round, and its `done` is called.
void UcxLink::End(Conn& c, Flight& f, Status result) {
  c.Unpost(f);
  f.result = std::move(result);
}

// Posts a flight: its puts (then a flush) or gets, each completing in OnRequestDone. A WRITE
// is over when its flush is (the data is in place at the target); a READ when its gets are (a
// get completes when its data has arrived: a flush would only cost a round trip). A flight
// that `ready` turns away, or that cannot be posted, ends here; one posted in part fails the
// endpoint (Lead).
void UcxLink::Post(Conn& c, Flight& f) {
  Status s = f.ready ? f.ready() : Status::Ok();
  if (s.ok()) s = Connect(c);
  // Keys of regions the peer deregistered would pile up for the life of the link: start over
  // now and then, when no request holds a key.
  if (s.ok() && c.posted == 0 && c.rkeys.size() + f.keys.size() > kMaxCachedKeys) DestroyKeys(c);
  std::vector<ucp_rkey_h> unpacked(f.keys.size());
  for (size_t k = 0; k < unpacked.size() && s.ok(); ++k) s = Unpack(c, f.keys[k], &unpacked[k]);
  if (!s.ok()) {
    std::lock_guard l(mu_);
    End(c, f, std::move(s));
    return;
  }
  f.posted = true;
  f.left = 0;
  f.error = UCS_OK;
  ++c.posted;
  c.posted_bytes += f.bytes;
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
                        ? issued(Ucx().ucp_put_nbx(c.ep, buf, sl.len, sl.remote, key, &p), "ucp_put_nbx")
                        : issued(Ucx().ucp_get_nbx(c.ep, buf, sl.len, sl.remote, key, &p), "ucp_get_nbx");
    if (!ok) return;
  }
  if (f.op == Op::kWrite) issued(Ucx().ucp_ep_flush_nbx(c.ep, &p), "ucp_ep_flush_nbx");
}

// A flight on each of cs failed or ran out of time, or the peer failed, or the link was shut
// down: the endpoints go (after what can complete has). Each posted flight then ends: done if
// all of it completed, else by its own cause; one that was only caught up in another's
// deadline is posted again.
void UcxLink::EndPosted(std::span<Conn* const> cs, std::chrono::milliseconds drain) {
  std::vector<ucs_status_t> peer_failed;
  for (Conn* c : cs) peer_failed.push_back(c->failure.load());
  Teardown(cs, drain);  // their flights leave in the next round
  const auto now = Clock::now();
  std::lock_guard l(mu_);
  for (size_t i = 0; i < cs.size(); ++i) {
    Conn& c = *cs[i];
    for (auto& fp : c.flights) {
      Flight& f = *fp;
      if (!f.posted) continue;
      const bool own_error = f.error != UCS_OK && f.error != UCS_ERR_CANCELED;
      if (f.left == 0 && f.error == UCS_OK) {
        End(c, f, Status::Ok());  // it moved its bytes, late or not
        c.last_done = now;
      } else if (shut_.load()) {
        End(c, f, Gone());
      } else if (now >= f.deadline) {
        End(c, f,
            {StatusCode::kTimeout, std::string("ucx: deadline passed waiting for a ") +
                                       (f.op == Op::kWrite ? "WRITE" : "READ") + " batch to " + peer_.name +
                                       " to complete"});
      } else if (own_error || peer_failed[i] != UCS_OK) {
        End(c, f,
            {StatusCode::kConnectionLost,
             UcsError((std::string(own_error ? f.what : "connection") + " to " + peer_.name).c_str(),
                      own_error ? f.error : peer_failed[i])});
      } else if (f.commit < interrupt_below_.load() || f.interrupted) {
        End(c, f, Interrupted());
      } else {
        c.Unpost(f);  // canceled by the close: post it again
      }
    }
  }
}

// The endpoint, created on first use and after a failure tore the last one down.
Status UcxLink::Connect(Conn& c) {
  if (!c.worker) {
    Status s = CreateWorker(ctx_->h, &c.worker);
    if (!s.ok()) return s;
    ucs_status_t st = Ucx().ucp_worker_get_efd(c.worker, &c.efd);
    if (st != UCS_OK) {
      Ucx().ucp_worker_destroy(c.worker);
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
  ucs_status_t st = Ucx().ucp_ep_create(c.worker, &ep, &c.ep);
  if (st != UCS_OK) {
    c.ep = nullptr;
    std::string msg = UcsError(("endpoint to " + peer_.name).c_str(), st);
    // Every lane of a peer-error-handling endpoint must detect peer failure; UCX 1.13's
    // shared-memory transports (posix, sysv) cannot, so UCX_TLS=sm alone reaches nobody.
    if (st == UCS_ERR_UNREACHABLE) {
      msg +=
          " (no transport allowed by UCX_TLS offers active messages, put/get and "
          "peer-failure detection to that peer: add tcp or an RDMA transport)";
    }
    return {StatusCode::kConnectionLost, msg};
  }
  return Status::Ok();
}

Status UcxLink::Unpack(Conn& c, const UcxRemoteKey& key, ucp_rkey_h* out) {
  auto it = c.rkeys.find(key.region_id);
  if (it != c.rkeys.end()) {
    *out = it->second;
    return Status::Ok();
  }
  ucs_status_t st = Ucx().ucp_ep_rkey_unpack(c.ep, key.packed.data(), out);
  if (st != UCS_OK) {
    return {StatusCode::kConnectionLost, UcsError(("unpacking the key of region " +
                                                   std::to_string(key.region_id) + " of peer " + peer_.name)
                                                      .c_str(),
                                                  st)};
  }
  c.rkeys.emplace(key.region_id, *out);
  return Status::Ok();
}

// Closes the endpoints of cs; once this returns, no request of ours can still touch the
// callers' memory. Where the peer has not failed, what was posted completes first (a flush of
// every endpoint at once, waited for up to `drain` in all): closing while puts still arrive
// makes UCX 1.13 at the target abort ("unexpected error: Endpoint timeout" when it answers
// them). Then a forced close cancels what is outstanding (Close).
void UcxLink::Teardown(std::span<Conn* const> cs, std::chrono::milliseconds drain) {
  std::vector<void*> flush(cs.size(), nullptr);
  ucp_request_param_t none{};
  for (size_t i = 0; i < cs.size(); ++i) {
    if (!cs[i]->ep || cs[i]->failure.load() != UCS_OK || drain.count() <= 0) continue;
    void* r = Ucx().ucp_ep_flush_nbx(cs[i]->ep, &none);
    if (!UCS_PTR_IS_ERR(r)) flush[i] = r;
  }
  const auto drained = Clock::now() + drain;
  Backoff backoff;
  for (bool waiting = true; waiting;) {
    waiting = false;
    unsigned progressed = 0;
    for (size_t i = 0; i < cs.size(); ++i) {
      if (flush[i] == nullptr) continue;
      if (Ucx().ucp_request_check_status(flush[i]) != UCS_INPROGRESS) {
        Ucx().ucp_request_free(flush[i]);
        flush[i] = nullptr;
      } else {
        waiting = true;
        progressed += Ucx().ucp_worker_progress(cs[i]->worker);
      }
    }
    if (waiting && Clock::now() >= drained) break;
    if (waiting && progressed == 0) backoff.Pause();
  }
  for (size_t i = 0; i < cs.size(); ++i) Close(*cs[i], flush[i]);
}

// The forced close of c's endpoint, and of `flush` (a flush still in progress, or null) with
// it. The worker stays for the next endpoint unless UCX failed to give the requests back, in
// which case it goes too.
void UcxLink::Close(Conn& c, void* flush) {
  if (!c.ep) {
    c.failure.store(UCS_OK);  // (an error UCX reported for the endpoint already closed)
    return;
  }
  const auto until = Clock::now() + kTeardownGrace;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  bool clean = WaitRequest(c.worker, Ucx().ucp_ep_close_nbx(c.ep, &p), until) != UCS_INPROGRESS;
  clean = WaitRequest(c.worker, flush, until) != UCS_INPROGRESS && clean;  // canceled by the close
  c.ep = nullptr;
  auto outstanding = [&] {
    std::lock_guard l(mu_);
    return Outstanding(c);
  };
  Backoff backoff;
  while (clean && outstanding()) {
    if (Clock::now() >= until) {
      clean = false;
    } else if (Ucx().ucp_worker_progress(c.worker) == 0) {
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
  Ucx().ucp_worker_destroy(c.worker);  // stops all its transports: no more access to our memory
  c.worker = nullptr;
  c.efd = -1;
  std::lock_guard l(mu_);
  for (auto& f : c.flights) {
    if (f->posted && f->left > 0) {
      f->left = 0;
      if (f->error == UCS_OK) f->error = UCS_ERR_CANCELED;
    }
  }
}

}  // namespace xfer::transport::ucx
