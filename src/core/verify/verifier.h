// Verifier: the end-to-end checksums of requests (TransferOptions::checksum;
// docs/notifications.md, "Checksums"). As the initiator it asks a peer for the checksums of
// ranges of the peer's memory (wire::Digest) and hands the answer to the request, which
// compares them with its own. As the target it answers peers' asks on a thread of its own (the
// control thread never reads bulk memory), each range checked against the regions the peer may
// read, in chunks that a deregistration's fence waits for one at a time.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "control/session.h"
#include "core/local_engine.h"
#include "core/peers/peer_table.h"
#include "core/regions/region_service.h"

namespace xfer {

class Verifier {
 public:
  using Clock = std::chrono::steady_clock;
  using Peer = PeerTable::Peer;
  // The checksums of the ranges asked for, in order; or why not. Called exactly once.
  using Answer = std::function<void(Status, std::vector<uint64_t> checksums)>;
  // Asks for the checksums of ranges of the peer's memory (landed: where a WRITE's bytes
  // landed), answered by `deadline` or kTimeout.
  using Ask = std::function<void(bool landed, std::vector<wire::DigestRange> ranges,
                                 Clock::time_point deadline, Answer answer)>;

  Verifier(const LocalEngine& self, RegionService& regions) : self_(self), regions_(regions) {}
  ~Verifier() { Stop(); }

  void Start();  // Initialize: the target's thread
  // Finalize, once the sessions are closed: asks still unanswered fail, the thread ends.
  void Stop();

  // How a request asks `peer` (this engine itself: answered here, at once).
  Ask AskerFor(const Peer& peer);

  // Control thread: a peer's ask (queued for the thread, or refused at once); the answer to
  // one of ours; a session's end (our asks over it fail); the tick (asks past their deadline
  // fail).
  void OnDigest(const std::shared_ptr<control::Session>& s, wire::Digest&& m);
  void OnDigestAnswer(const std::shared_ptr<control::Session>& s, wire::DigestAnswer&& m);
  void SessionClosed(const std::shared_ptr<control::Session>& s);
  void OnTick();
  // Returns once no checksum that began before the call reads this engine's memory (a
  // deregistration: the region is gone from the registry already), or at the deadline.
  void Fence(Clock::time_point deadline);

 private:
  // Asks one peer may have queued here: more are refused (kResourceExhausted).
  static constexpr size_t kMaxQueuedPerSession = 64;
  // A range is read this much at a time, each chunk under reading_ and checked anew.
  static constexpr uint64_t kChunkBytes = 4ull << 20;

  struct Job {
    std::shared_ptr<control::Session> session;
    wire::Digest ask;
  };
  struct Pending {
    const control::Session* session = nullptr;
    Clock::time_point deadline;
    Answer answer;
  };

  // The checksums of ranges of this engine's memory (landed: the test hook may flip a byte
  // first), or why not.
  wire::DigestAnswer Checksums(const wire::Digest& ask);
  // One range, chunk by chunk; false (with *why) when a chunk is no longer readable by peers.
  bool ChecksumOf(const wire::DigestRange& r, uint64_t* out, Status* why);
  void Serve();  // the thread
  // Answers (outside mu_) the pending asks that `pick` chooses.
  void FailPending(const std::function<bool(uint64_t id, const Pending&)>& pick, const Status& why);

  const LocalEngine& self_;
  RegionService& regions_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;                                        // mu_
  std::unordered_map<const control::Session*, size_t> queued_;  // mu_: jobs per session
  std::map<uint64_t, Pending> pending_;                         // mu_: our asks by id
  uint64_t next_id_ = 1;                                        // mu_
  bool stopping_ = false;                                       // mu_
  std::thread thread_;
  std::timed_mutex reading_;  // held while a chunk of our memory is read; Fence takes it
};

}  // namespace xfer
