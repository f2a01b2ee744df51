#include "core/verify/digest_server.h"

#include "transport/common/memory_sum.h"
#include "util/text.h"

namespace xfer {

void DigestServer::Start() {
  std::lock_guard lock(mu_);
  if (running_) return;
  running_ = true;
  stop_.store(false);
  thread_ = std::thread([this] { Serve(); });
}

void DigestServer::Stop() {
  {
    std::lock_guard lock(mu_);
    stop_.store(true);
    queues_.clear();
    turns_.clear();
    queued_ranges_ = 0;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mu_);
  running_ = false;
}

void DigestServer::Queue(const std::shared_ptr<control::Session>& s, wire::Digest&& ask) {
  std::string refused;
  StatusCode code = StatusCode::kResourceExhausted;
  {
    std::lock_guard lock(mu_);
    SessionAsks& q = queues_[s.get()];
    const size_t n = Weight(ask);
    if (stop_.load()) {
      refused = "the peer's engine is stopping";
      code = StatusCode::kConnectionLost;
    } else if (ask.ranges.empty() || q.queued.contains(ask.id)) {
      refused =
          ask.ranges.empty() ? "an ask for no ranges" : "ask " + std::to_string(ask.id) + " waits already";
      code = StatusCode::kInvalidArgument;
    } else if (q.ranges + n > kMaxRangesPerSession || queued_ranges_ + n > kMaxRanges) {
      refused = "more than " +
                std::to_string(q.ranges + n > kMaxRangesPerSession ? kMaxRangesPerSession : kMaxRanges) +
                " ranges would wait for their checksums here (" +
                (q.ranges + n > kMaxRangesPerSession ? "this peer's" : "all peers'") + ")";
    } else {
      if (!q.in_turn) turns_.push_back(s.get());
      q.in_turn = true;
      q.session = s;
      q.ranges += n;
      queued_ranges_ += n;
      const uint64_t id = ask.id;
      q.asks.push_back(std::move(ask));
      q.queued.emplace(id, SessionAsks::Queued{&q.asks.back(), false});
      cv_.notify_one();
      return;
    }
    if (!q.in_turn) queues_.erase(s.get());
  }
  s->SendSoon(wire::DigestAnswer{ask.id, code, refused, {}});
}

void DigestServer::Forget(const control::Session* s) {
  std::lock_guard lock(mu_);
  auto it = queues_.find(s);
  if (it == queues_.end()) return;
  queued_ranges_ -= it->second.ranges;
  queues_.erase(it);
  std::erase(turns_, s);  // (a session made later at its address starts a turn of its own)
}

void DigestServer::Cancel(const control::Session* s, uint64_t id) {
  std::lock_guard lock(mu_);
  if (s == serving_session_ && id == serving_id_) return serving_canceled_.store(true);
  auto it = queues_.find(s);
  if (it == queues_.end()) return;
  SessionAsks& q = it->second;
  if (q.current && q.current->ask.id == id) {  // (between its turns)
    q.ranges -= Weight(q.current->ask);
    queued_ranges_ -= Weight(q.current->ask);
    q.current.reset();
    return;
  }
  // (Dropped when its turn comes, its kAskRanges counted until then: a peer that asks and
  // cancels without end is bounded as one that only asks.)
  auto a = q.queued.find(id);
  if (a == q.queued.end() || a->second.canceled) return;
  a->second.canceled = true;
  q.ranges -= a->second.ask->ranges.size();
  queued_ranges_ -= a->second.ask->ranges.size();
  std::vector<wire::DigestRange>().swap(a->second.ask->ranges);  // (what no longer counts is freed)
}

void DigestServer::Fence(Clock::time_point) {
  // Not bounded by the deadline: the region goes once this returns, and the chunk being read
  // takes well under a millisecond (this thread waits for no I/O and no lock of the fence's).
  fencing_.fetch_add(1);
  { std::lock_guard hold(reading_); }
  fencing_.fetch_sub(1);
}

void DigestServer::Serve() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_.load() || !turns_.empty(); });
    if (stop_.load()) return;
    const control::Session* key = turns_.front();
    turns_.pop_front();
    auto it = queues_.find(key);
    if (it == queues_.end()) continue;  // (forgotten)
    SessionAsks& q = it->second;
    // Its next ask, which counts as waiting until answered; canceled ones are dropped on the
    // way, at most kDropsPerTurn (the control thread's Queue and Cancel wait for mu_).
    for (size_t dropped = 0; !q.current && !q.asks.empty() && dropped < kDropsPerTurn;) {
      wire::Digest next = std::move(q.asks.front());
      q.asks.pop_front();
      auto a = q.queued.find(next.id);
      const bool canceled = a->second.canceled;  // (every queued ask has its entry)
      q.queued.erase(a);
      if (canceled) {  // (its ranges stopped counting at the cancel)
        q.ranges -= kAskRanges;
        queued_ranges_ -= kAskRanges;
        ++dropped;
        continue;
      }
      q.current = std::make_unique<Answering>();
      q.current->ask = std::move(next);
    }
    if (!q.current && !q.asks.empty()) {  // (more canceled ones: its next turn drops them)
      turns_.push_back(key);
      lock.unlock();  // (the control thread's Queue and Cancel get their turn)
      std::this_thread::yield();
      lock.lock();
      continue;
    }
    if (!q.current) {  // (all canceled, or a turn left over from an earlier session at its address)
      queues_.erase(it);
      continue;
    }
    const std::shared_ptr<control::Session> session = q.session;
    std::unique_ptr<Answering> work = std::move(q.current);
    serving_session_ = key;
    serving_id_ = work->ask.id;
    serving_canceled_.store(false);
    lock.unlock();
    auto give_up = [&] { return stop_.load() || session->closed() || serving_canceled_.load(); };
    const bool answered = Step(*work, give_up);
    if (answered && !give_up()) (void)session->Send(work->answer);  // (fails only when nobody waits)
    lock.lock();
    serving_session_ = nullptr;
    it = queues_.find(key);
    if (it == queues_.end() || it->second.session != session) continue;  // (forgotten meanwhile)
    if (!answered && !serving_canceled_.load()) {
      it->second.current = std::move(work);
    } else {
      it->second.ranges -= Weight(work->ask);
      queued_ranges_ -= Weight(work->ask);
    }
    if (it->second.current || !it->second.asks.empty()) {
      turns_.push_back(key);  // (after the other sessions' turns)
    } else {
      queues_.erase(it);
    }
  }
}

wire::DigestAnswer DigestServer::Answer(const wire::Digest& ask, const std::function<bool()>& give_up) {
  Answering w;
  w.ask = ask;
  while (!Step(w, give_up)) {
  }
  return std::move(w.answer);
}

bool DigestServer::Step(Answering& w, const std::function<bool()>& give_up) {
  wire::DigestAnswer& a = w.answer;
  a.id = w.ask.id;
  if (!checksum::Available()) {
    a.code = StatusCode::kUnsupported;
    a.why = "this engine's build has no libxxhash";
    return true;
  }
  if (w.range == 0 && w.offset == 0) a.digests.reserve(w.ask.ranges.size());
  for (uint64_t budget = kChunkBytes; budget > 0 && w.range < w.ask.ranges.size();) {
    const wire::DigestRange& r = w.ask.ranges[w.range];
    if (w.offset == 0 && w.ask.landed &&
        self_.corrupt_landed == static_cast<int64_t>(w.range)) {  // the test hook
      std::lock_guard hold(reading_);
      const transport::TargetAccess access =
          r.len > 0 ? regions_.Access(r.addr, 1, false) : transport::TargetAccess{};
      if (access.allowed) (void)transport::FlipByte(r.addr, access.device);
    }
    const uint64_t n = std::min(budget, r.len - std::min(w.offset, r.len));
    Status why;
    bool gpu = false;
    if (!SumChunk(r, w.offset, n, give_up, &w.sum, &gpu, &why)) {
      a.digests.clear();
      a.code = why.code();
      a.why = "range " + std::to_string(w.range) + " (" + text::Hex(r.addr) + ", " + std::to_string(r.len) +
              " bytes): " + why.message();
      return true;
    }
    w.offset += n;
    budget -= std::min(budget, std::max(n, gpu ? kGpuRangeBytes : kRangeBytes));
    if (w.offset < r.len) continue;
    a.digests.push_back(w.sum.Value());
    w.sum = checksum::Running();
    w.offset = 0;
    ++w.range;
  }
  return w.range == w.ask.ranges.size();
}

bool DigestServer::SumChunk(const wire::DigestRange& r, uint64_t offset, uint64_t most,
                            const std::function<bool()>& give_up, checksum::Running* sum, bool* gpu,
                            Status* why) {
  if (r.len == 0 || r.addr + r.len < r.addr) {
    *why = {StatusCode::kInvalidArgument, "empty or wrapping"};
    return false;
  }
  while (fencing_.load() > 0) std::this_thread::yield();  // (a fence goes first)
  std::lock_guard hold(reading_);
  if (give_up && give_up()) {
    *why = {StatusCode::kCanceled, "given up"};
    return false;
  }
  // (The whole range, each time: a deregistration between two chunks ends the checksum.)
  const transport::TargetAccess access = regions_.Access(r.addr, r.len, false);
  if (!access.allowed) {
    *why = {StatusCode::kRemoteAccessDenied, "not inside one region registered here"};
    return false;
  }
  *gpu = access.device;
  if (Status s = transport::SumMemory(r.addr + offset, most, access.device, sum); !s.ok()) {
    *why = std::move(s);
    return false;
  }
  return true;
}

}  // namespace xfer
