#include "core/verify/digest_server.h"

#include "util/checksum.h"
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
  {
    std::lock_guard lock(mu_);
    SessionAsks& q = queues_[s.get()];
    const size_t n = ask.ranges.size();
    if (stop_.load()) {
      refused = "the engine is stopping";
    } else if (q.ranges + n > kMaxRangesPerSession || queued_ranges_ + n > kMaxRanges) {
      refused = "more than " +
                std::to_string(q.ranges + n > kMaxRangesPerSession ? kMaxRangesPerSession : kMaxRanges) +
                " ranges would wait for their checksums here (" +
                (q.ranges + n > kMaxRangesPerSession ? "this peer's" : "all peers'") + ")";
    } else {
      if (q.asks.empty()) turns_.push_back(s.get());
      q.session = s;
      q.ranges += n;
      queued_ranges_ += n;
      q.asks.push_back(std::move(ask));
      cv_.notify_one();
      return;
    }
    if (q.asks.empty()) queues_.erase(s.get());
  }
  s->SendSoon(wire::DigestAnswer{ask.id, StatusCode::kResourceExhausted, refused, {}});
}

void DigestServer::Forget(const control::Session* s) {
  std::lock_guard lock(mu_);
  auto it = queues_.find(s);
  if (it == queues_.end()) return;
  queued_ranges_ -= it->second.ranges;
  queues_.erase(it);  // (its turn is skipped)
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
    std::shared_ptr<control::Session> session = it->second.session;
    wire::Digest ask = std::move(it->second.asks.front());
    it->second.asks.pop_front();
    it->second.ranges -= ask.ranges.size();
    queued_ranges_ -= ask.ranges.size();
    if (it->second.asks.empty()) {
      queues_.erase(it);
    } else {
      turns_.push_back(key);  // (its next ask after the other sessions' next)
    }
    lock.unlock();
    auto give_up = [&] { return stop_.load() || session->closed(); };
    wire::DigestAnswer a = Answer(ask, give_up);
    if (!give_up()) (void)session->Send(a);  // (fails only when the session is gone: nobody waits)
    lock.lock();
  }
}

wire::DigestAnswer DigestServer::Answer(const wire::Digest& ask, const std::function<bool()>& give_up) {
  wire::DigestAnswer a;
  a.id = ask.id;
  if (!checksum::Available()) {
    a.code = StatusCode::kUnsupported;
    a.why = "this engine's build has no libxxhash";
    return a;
  }
  a.digests.reserve(ask.ranges.size());
  for (size_t i = 0; i < ask.ranges.size(); ++i) {
    const wire::DigestRange& r = ask.ranges[i];
    if (ask.landed && self_.corrupt_landed == static_cast<int64_t>(i)) {  // the test hook
      std::lock_guard hold(reading_);
      if (r.len > 0 && regions_.Access(r.addr, 1, false).allowed) *reinterpret_cast<uint8_t*>(r.addr) ^= 0xff;
    }
    Status why;
    uint64_t sum = 0;
    if (!ChecksumOf(r, give_up, &sum, &why)) {
      a.digests.clear();
      a.code = why.code();
      a.why = "range " + std::to_string(i) + " (" + text::Hex(r.addr) + ", " + std::to_string(r.len) +
              " bytes): " + why.message();
      return a;
    }
    a.digests.push_back(sum);
  }
  return a;
}

bool DigestServer::ChecksumOf(const wire::DigestRange& r, const std::function<bool()>& give_up, uint64_t* out,
                              Status* why) {
  if (r.len == 0 || r.addr + r.len < r.addr) {
    *why = {StatusCode::kInvalidArgument, "empty or wrapping"};
    return false;
  }
  checksum::Running sum;
  for (uint64_t off = 0; off < r.len; off += kChunkBytes) {
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
    if (access.device) {
      *why = {StatusCode::kUnsupported, "GPU memory (checksums cover host memory only)"};
      return false;
    }
    sum.Add(reinterpret_cast<const void*>(r.addr + off), std::min(kChunkBytes, r.len - off));
  }
  *out = sum.Value();
  return true;
}

}  // namespace xfer
