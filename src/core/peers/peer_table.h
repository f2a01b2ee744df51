// The sessions with peers, by name, and the names being connected to or accepted right now.
// Two engines connecting to each other at once open two sessions; the table decides which one
// stays, the same way on both sides: the one opened by the smaller incarnation.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "control/session.h"
#include "core/peers/peer_state.h"
#include "util/thread_cache.h"
#include "xfer/status.h"

namespace xfer {

class PeerTable {
 public:
  using Clock = std::chrono::steady_clock;
  struct Peer {
    std::shared_ptr<control::Session> session;  // null for this engine itself
    std::shared_ptr<PeerState> state;
  };

  void set_incarnation(uint64_t mine) { mine_ = mine; }
  // Sessions, claimed and being accepted ones included, that Claim and BeginAccept allow.
  void set_max_sessions(size_t n) { max_sessions_ = n; }
  // Sessions from one host (opened to us, being accepted ones included) that BeginAccept allows.
  void set_max_sessions_per_host(size_t n) { max_per_host_ = n; }
  // (Without the table's lock while the table is as this thread last found it: threads that
  // transfer to different peers share no lock here.)
  bool Find(const std::string& key, Peer* out) const;
  // Changes whenever a peer comes or goes: an answer of Find holds while it is the one read
  // before that Find.
  uint64_t version() const { return version_.load(std::memory_order_acquire); }
  // True while a live peer of that incarnation has a session with us.
  bool HasLive(uint64_t incarnation) const;
  // The auth_keys of the live sessions of that incarnation (none without a secret). One engine
  // may hold two, each with its own key: our session to it under the address we dialled, and
  // its own to us under its name (BeginAccept's `vouched`).
  std::vector<std::string> AuthKeysOf(uint64_t incarnation) const;
  std::vector<std::shared_ptr<PeerState>> States() const;

  // Connect: claims the name for an outbound session. Waits (until deadline) while a session
  // of that name opened to us is being accepted: that one will be the session (kTimeout if it
  // is not done in time); kAlreadyConnected when there is a session, or another Connect;
  // kResourceExhausted when max_sessions are held.
  Status Claim(const std::string& remote, Clock::time_point deadline);
  void Unclaim(const std::string& remote);
  // Installs the claimed outbound session; false when a crossing session from the peer got in
  // first (it stays; the caller closes its own).
  bool InstallClaimed(const std::string& remote, const Peer& peer);
  // After our connection crossed the peer's and lost: ok once the peer's session is in.
  Status AwaitCrossed(const std::string& remote, Clock::time_point deadline);

  // Our outbound session to the engine of that name and incarnation under a key other than
  // `key` (we dialled it at an address that is not its name, e.g. its wildcard's): *out; false
  // when there is none. A hello of that engine under its name may be its own session to us
  // (BeginAccept's `vouched`), or an impostor's: the hello alone cannot tell.
  bool DialledUnderAnotherKey(const std::string& key, const std::string& name, uint64_t incarnation,
                              Peer* out) const;

  // The hello of a session opened to us: kAlreadyConnected when it duplicates a session, or
  // crosses a Connect of ours that wins; kResourceExhausted when it would be one more than
  // max_sessions, or than max_sessions_per_host from its host; kInvalidArgument when its incarnation is ours
  // or that of a peer under another key that has a session (an incarnation names one engine: data
  // connections and drops are keyed by it), unless that session is `vouched`: our outbound session
  // that the caller found this session's engine to be (DialledUnderAnotherKey); else ok: the name is
  // being accepted (until FinishAccept), and *replaced is the session of the peer's previous
  // incarnation, now removed (a restart).
  // (name: the hello's; key is it, or it with the incarnation for a peer without a port; host:
  // where its control connection comes from.)
  Status BeginAccept(const std::string& key, const std::string& name, uint64_t incarnation,
                     const std::string& host, const control::Session* vouched, Peer* replaced);
  void FinishAccept(const std::string& key, const Peer& peer);

  // Removes the peer when s is its session; true when it was.
  bool RemoveSession(const std::string& key, const std::shared_ptr<control::Session>& s);
  // Removes the peer (Disconnect); false when there is none of that name.
  bool Take(const std::string& key, Peer* out);

 private:
  bool AwaitAccepted(std::unique_lock<std::mutex>& lock, const std::string& remote,
                     Clock::time_point deadline);

  bool Full() const;  // mu_ held
  Status TooMany() const;
  size_t OpenedFrom(const std::string& host) const;  // mu_ held: sessions opened to us from host

  uint64_t mine_ = 0;  // this engine's incarnation
  size_t max_sessions_ = SIZE_MAX;
  size_t max_per_host_ = SIZE_MAX;
  // Changes with every change of peers_ (under mu_).
  std::atomic<uint64_t> version_{NextTableVersion()};
  void Changed() { version_.store(NextTableVersion(), std::memory_order_release); }  // mu_ held

  mutable std::mutex mu_;
  std::map<std::string, Peer> peers_;             // by name (outbound: as the user wrote it)
  std::set<std::string> connecting_;              // Connect() calls in progress
  std::map<std::string, std::string> accepting_;  // hellos of sessions opened to us, being
                                                  // answered: their hosts by key
  std::condition_variable changed_;               // accepting_ shrank
};

}  // namespace xfer
