// Verifier: end-to-end checksums of requests (TransferOptions::checksum; docs/notifications.md,
// "Checksums"). As the initiator it asks a peer for the checksums of ranges of the peer's
// memory (wire::Digest, in parts of at most kRangesPerDigest ranges) and hands the answer to
// the request; as the target it answers peers' asks through its DigestServer.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "control/session.h"
#include "core/local_engine.h"
#include "core/peers/peer_table.h"
#include "core/regions/region_service.h"
#include "core/verify/digest_server.h"

namespace xfer {

class Verifier {
 public:
  using Clock = std::chrono::steady_clock;
  using Peer = PeerTable::Peer;
  // The checksums of the ranges asked for, in order; or why not. Called exactly once.
  using Answer = std::function<void(Status, std::vector<uint64_t> checksums)>;
  // Asks for the checksums of ranges of the peer's memory (landed: where a WRITE's bytes
  // landed), answered by `deadline` or kTimeout (RequestChecks::Ask). Returns what withdraws
  // the parts of the ask not answered yet (answered kCanceled; the peer told to drop them), or
  // nothing (an ask this engine answers itself, at once).
  using Withdraw = std::function<void()>;
  using Ask = std::function<Withdraw(bool landed, std::vector<wire::DigestRange> ranges,
                                     Clock::time_point deadline, Answer answer)>;

  Verifier(const LocalEngine& self, RegionService& regions) : server_(self, regions) {}
  ~Verifier() { Stop(); }

  void Start() { server_.Start(); }  // Initialize
  // Finalize, once the sessions are closed: asks still unanswered fail, the server stops.
  void Stop();

  // How a request asks `peer` (this engine itself: answered here, at once).
  Ask AskerFor(const Peer& peer);

  // Control thread: a peer's ask, and its cancel; the answer to one of ours; a session's end
  // (our asks over it fail, its asks here are dropped); the tick (asks past their deadline
  // fail, and the peer is told to drop them where it can be).
  void OnDigest(const std::shared_ptr<control::Session>& s, wire::Digest&& m) {
    server_.Queue(s, std::move(m));
  }
  void OnDigestCancel(const std::shared_ptr<control::Session>& s, const wire::DigestCancel& m) {
    server_.Cancel(s.get(), m.id);
  }
  void OnDigestAnswer(const std::shared_ptr<control::Session>& s, wire::DigestAnswer&& m);
  void SessionClosed(const std::shared_ptr<control::Session>& s);
  void OnTick();
  // A deregistration: see DigestServer::Fence.
  void Fence(Clock::time_point deadline) { server_.Fence(deadline); }

 private:
  // Ranges per Digest: a request with more sends several (16 B a range: 256 KiB frames).
  static constexpr size_t kRangesPerDigest = 1 << 14;
  struct Gather;  // the parts of one ask
  struct Pending {
    std::shared_ptr<control::Session> session;
    bool cancels = false;  // its peer takes DigestCancel
    Clock::time_point deadline;
    Answer answer;      // this part's
    bool sent = false;  // its Digest is on the session (a cancel must not overtake it)
  };
  // Answers (outside mu_) the pending parts that `pick` chooses; with `cancel`, tells their
  // peers (those that take it) to drop them: at once when sent, else once sent.
  void FailPending(const std::function<bool(uint64_t id, const Pending&)>& pick, const Status& why,
                   bool cancel = false);

  DigestServer server_;
  std::mutex mu_;
  std::map<uint64_t, Pending> pending_;  // mu_: our asks' parts by id
  std::set<uint64_t> cancel_once_sent_;  // mu_: parts failed while their Digest was being sent
  uint64_t next_id_ = 1;                 // mu_
  bool stopping_ = false;                // mu_
};

}  // namespace xfer
