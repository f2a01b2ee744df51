#include "core/verify/verifier.h"

#include "core/peers/peer_state.h"
#include "util/checksum.h"
#include "util/log.h"
#include "util/text.h"

namespace xfer {

void Verifier::Start() {
  std::lock_guard lock(mu_);
  stopping_ = false;
  thread_ = std::thread([this] { Serve(); });
}

void Verifier::Stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    jobs_.clear();
    queued_.clear();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  FailPending([](uint64_t, const Pending&) { return true; },
              {StatusCode::kCanceled, "the engine was finalized"});
}

Verifier::Ask Verifier::AskerFor(const Peer& peer) {
  if (!peer.session) {  // this engine itself: its own memory, read here
    return [this](bool landed, std::vector<wire::DigestRange> ranges, Clock::time_point, Answer answer) {
      wire::DigestAnswer a = Checksums(wire::Digest{0, landed, std::move(ranges)});
      answer(Status(a.code, std::move(a.why)), std::move(a.digests));
    };
  }
  if (!peer.state->answers_digests) {
    return [name = peer.state->info.name](bool, std::vector<wire::DigestRange>, Clock::time_point,
                                          Answer answer) {
      answer(
          {StatusCode::kUnsupported, "peer " + name + " cannot check checksums (its build has no libxxhash)"},
          {});
    };
  }
  return [this, session = peer.session](bool landed, std::vector<wire::DigestRange> ranges,
                                        Clock::time_point deadline, Answer answer) {
    uint64_t id;
    {
      std::lock_guard lock(mu_);
      if (stopping_) return answer({StatusCode::kCanceled, "the engine was finalized"}, {});
      id = next_id_++;
      pending_[id] = Pending{session.get(), deadline, std::move(answer)};
    }
    Status sent = session->Send(wire::Digest{id, landed, std::move(ranges)});
    if (sent.ok()) return;
    FailPending([id](uint64_t k, const Pending&) { return k == id; }, sent);
  };
}

void Verifier::FailPending(const std::function<bool(uint64_t id, const Pending&)>& pick, const Status& why) {
  std::vector<Answer> failed;
  {
    std::lock_guard lock(mu_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (pick(it->first, it->second)) {
        failed.push_back(std::move(it->second.answer));
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (Answer& a : failed) a(why, {});
}

void Verifier::OnDigest(const std::shared_ptr<control::Session>& s, wire::Digest&& m) {
  {
    std::lock_guard lock(mu_);
    size_t& queued = queued_[s.get()];
    if (!stopping_ && queued < kMaxQueuedPerSession) {
      ++queued;
      jobs_.push_back(Job{s, std::move(m)});
      cv_.notify_one();
      return;
    }
    if (queued == 0) queued_.erase(s.get());
  }
  s->SendSoon(wire::DigestAnswer{m.id,
                                 StatusCode::kResourceExhausted,
                                 "more than " + std::to_string(kMaxQueuedPerSession) +
                                     " checksum requests of this peer are waiting here",
                                 {}});
}

void Verifier::OnDigestAnswer(const std::shared_ptr<control::Session>& s, wire::DigestAnswer&& m) {
  Answer answer;
  {
    std::lock_guard lock(mu_);
    auto it = pending_.find(m.id);
    if (it != pending_.end() && it->second.session == s.get()) {
      answer = std::move(it->second.answer);
      pending_.erase(it);
    }
  }
  if (!answer) return;  // (an ask that timed out meanwhile)
  Status st(m.code, std::move(m.why));
  if (!st.ok()) st = {st.code(), "peer refused the checksums: " + st.message()};
  answer(std::move(st), std::move(m.digests));
}

void Verifier::SessionClosed(const std::shared_ptr<control::Session>& s) {
  FailPending([s = s.get()](uint64_t, const Pending& p) { return p.session == s; },
              {StatusCode::kConnectionLost, "the peer's session ended before it answered the checksums"});
}

void Verifier::OnTick() {
  const auto now = Clock::now();
  FailPending([now](uint64_t, const Pending& p) { return p.deadline <= now; },
              {StatusCode::kTimeout, "request deadline passed while the peer computed the checksums"});
}

void Verifier::Fence(Clock::time_point deadline) {
  std::unique_lock lock(reading_, deadline);  // (a chunk takes well under a millisecond)
}

void Verifier::Serve() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (stopping_) return;
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    wire::DigestAnswer a = Checksums(job.ask);
    (void)job.session->Send(a);  // (fails only when the session is gone: nobody waits)
    lock.lock();
    auto it = queued_.find(job.session.get());
    if (it != queued_.end() && --it->second == 0) queued_.erase(it);
  }
}

wire::DigestAnswer Verifier::Checksums(const wire::Digest& ask) {
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
    if (ask.landed && self_.corrupt_landed == static_cast<int64_t>(i)) {
      std::lock_guard hold(reading_);
      if (r.len > 0 && regions_.Access(r.addr, 1, false).allowed) *reinterpret_cast<uint8_t*>(r.addr) ^= 0xff;
    }
    Status why;
    uint64_t sum = 0;
    if (!ChecksumOf(r, &sum, &why)) {
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

bool Verifier::ChecksumOf(const wire::DigestRange& r, uint64_t* out, Status* why) {
  if (r.len == 0 || r.addr + r.len < r.addr) {
    *why = {StatusCode::kInvalidArgument, "empty or wrapping"};
    return false;
  }
  checksum::Running sum;
  for (uint64_t off = 0; off < r.len; off += kChunkBytes) {
    const uint64_t n = std::min(kChunkBytes, r.len - off);
    std::lock_guard hold(reading_);
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
    sum.Add(reinterpret_cast<const void*>(r.addr + off), n);
  }
  *out = sum.Value();
  return true;
}

}  // namespace xfer
