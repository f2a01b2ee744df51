#include "core/verify/verifier.h"

#include <algorithm>

#include "core/peers/peer_state.h"

namespace xfer {

// The parts of one ask, each answered on its own: the first failure, or all the checksums in
// order once every part came, goes to the request.
struct Verifier::Gather {
  std::mutex mu;
  size_t left = 0;  // parts not answered yet
  bool ended = false;
  std::vector<uint64_t> sums;
  Answer answer;

  bool Ended() {
    std::lock_guard lock(mu);
    return ended;
  }
  void Part(size_t first, const Status& s, const std::vector<uint64_t>& part, size_t expected) {
    Answer to_call;
    Status why = s;
    if (why.ok() && part.size() != expected) {
      why = {StatusCode::kInternal, "peer answered " + std::to_string(part.size()) + " checksums for " +
                                        std::to_string(expected) + " ranges"};
    }
    {
      std::lock_guard lock(mu);
      if (ended) return;
      if (why.ok()) std::copy(part.begin(), part.end(), sums.begin() + static_cast<ptrdiff_t>(first));
      if (!why.ok() || --left == 0) {
        ended = true;
        to_call = std::move(answer);
      }
    }
    if (to_call) to_call(why, why.ok() ? std::move(sums) : std::vector<uint64_t>{});
  }
};

void Verifier::Stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  server_.Stop();
  FailPending([](uint64_t, const Pending&) { return true; },
              {StatusCode::kCanceled, "the engine was finalized"});
}

Verifier::Ask Verifier::AskerFor(const Peer& peer) {
  if (!peer.session) {  // this engine itself: its own memory, read here
    return [this](bool landed, std::vector<wire::DigestRange> ranges, Clock::time_point, Answer answer) {
      wire::DigestAnswer a = server_.Answer(wire::Digest{0, landed, std::move(ranges)});
      answer(Status(a.code, std::move(a.why)), std::move(a.digests));
      return Withdraw();
    };
  }
  return [this, session = peer.session, cancels = peer.state->cancels_digests](
             bool landed, std::vector<wire::DigestRange> ranges, Clock::time_point deadline,
             Answer answer) -> Withdraw {
    auto gather = std::make_shared<Gather>();
    auto ids = std::make_shared<std::vector<uint64_t>>();  // the parts'
    Withdraw withdraw = [this, ids] {
      FailPending(
          [ids](uint64_t k, const Pending&) { return std::find(ids->begin(), ids->end(), k) != ids->end(); },
          {StatusCode::kCanceled, "the request ended before the peer answered its checksums"}, true);
    };
    const size_t n = ranges.size();
    const size_t parts = std::max<size_t>(1, (n + kRangesPerDigest - 1) / kRangesPerDigest);
    gather->left = parts;
    gather->sums.resize(n);
    gather->answer = std::move(answer);
    for (size_t part = 0; part < parts && !gather->Ended(); ++part) {  // (an earlier part may have failed)
      const size_t first = part * kRangesPerDigest, count = std::min(kRangesPerDigest, n - first);
      uint64_t id = 0;
      {
        std::lock_guard lock(mu_);
        if (!stopping_) {
          id = next_id_++;
          pending_[id] = Pending{session, cancels, deadline,
                                 [gather, first, count](Status s, std::vector<uint64_t> sums) {
                                   gather->Part(first, s, sums, count);
                                 }};
        }
      }
      if (id == 0) {
        gather->Part(first, {StatusCode::kCanceled, "the engine was finalized"}, {}, count);
        return withdraw;
      }
      ids->push_back(id);
      wire::Digest d{id, landed, {}};
      d.ranges.assign(ranges.begin() + static_cast<ptrdiff_t>(first),
                      ranges.begin() + static_cast<ptrdiff_t>(first + count));
      const Status sent = session->Send(d);
      bool cancel = false;
      {
        std::lock_guard lock(mu_);
        if (auto it = pending_.find(id); it != pending_.end() && sent.ok()) it->second.sent = true;
        cancel = cancel_once_sent_.erase(id) > 0 && sent.ok();
      }
      if (cancel) (void)session->Send(wire::DigestCancel{id});  // (failed while it was being sent)
      if (!sent.ok()) {
        FailPending([id](uint64_t k, const Pending&) { return k == id; }, sent);
        return withdraw;
      }
    }
    return withdraw;
  };
}

void Verifier::FailPending(const std::function<bool(uint64_t id, const Pending&)>& pick, const Status& why,
                           bool cancel) {
  std::vector<Answer> failed;
  std::vector<std::pair<std::shared_ptr<control::Session>, uint64_t>> cancels;
  {
    std::lock_guard lock(mu_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (pick(it->first, it->second)) {
        failed.push_back(std::move(it->second.answer));
        if (cancel && it->second.cancels && it->second.sent) {
          cancels.emplace_back(std::move(it->second.session), it->first);
        } else if (cancel && it->second.cancels) {
          cancel_once_sent_.insert(it->first);
        }
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& [session, id] : cancels)
    (void)session->Send(wire::DigestCancel{id});  // (now: the tick flushes nothing)
  for (Answer& a : failed) a(why, {});
}

void Verifier::OnDigestAnswer(const std::shared_ptr<control::Session>& s, wire::DigestAnswer&& m) {
  Answer answer;
  {
    std::lock_guard lock(mu_);
    auto it = pending_.find(m.id);
    if (it != pending_.end() && it->second.session == s) {
      answer = std::move(it->second.answer);
      pending_.erase(it);
    }
  }
  if (!answer) return;  // (a part that timed out meanwhile, or one nobody asked for)
  Status st(m.code, std::move(m.why));
  if (!st.ok()) st = {st.code(), "peer refused the checksums: " + st.message()};
  answer(std::move(st), std::move(m.digests));
}

void Verifier::SessionClosed(const std::shared_ptr<control::Session>& s) {
  server_.Forget(s.get());
  FailPending([&s](uint64_t, const Pending& p) { return p.session == s; },
              {StatusCode::kConnectionLost, "the peer's session ended before it answered the checksums"});
}

void Verifier::OnTick() {
  const auto now = Clock::now();
  FailPending([now](uint64_t, const Pending& p) { return p.deadline <= now; },
              {StatusCode::kTimeout, "request deadline passed while the peer computed the checksums"}, true);
}

}  // namespace xfer
