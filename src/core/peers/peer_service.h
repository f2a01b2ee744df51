// PeerService: everything about the engines this one talks to. Connecting (sync, async, by
// cluster name), the hello exchange and authentication, the sessions and their control thread,
// the table of peers the data path looks up, heartbeats' outcomes, and a peer's end (goodbye,
// restart, silence). It knows this engine's regions (the hello carries them), never requests.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "control/control_loop.h"
#include "control/session.h"
#include "core/local_engine.h"
#include "core/metrics/metrics.h"
#include "core/peers/async_connects.h"
#include "core/peers/authenticator.h"
#include "core/peers/cluster_names.h"
#include "core/peers/peer_state.h"
#include "core/peers/peer_table.h"
#include "core/peers/sessions_opening.h"
#include "core/regions/region_service.h"
#include "transport/backend_set.h"
#include "transport/common/buffer_pool.h"
#include "util/log.h"
#include "util/net.h"

namespace xfer {

class PeerService {
 public:
  using Clock = std::chrono::steady_clock;
  using Peer = PeerTable::Peer;

  // What the services above this one do as peers come and go (EngineImpl wires them).
  struct Events {
    // A peer's state was made from its hello, before anyone can find it (the notifier makes
    // the ring it will offer a peer on this host).
    std::function<void(const std::shared_ptr<PeerState>&)> made;
    // A session is up, before any notification can go out on it (the notifier offers its ring).
    std::function<void(const std::shared_ptr<control::Session>&, const std::shared_ptr<PeerState>&)> up;
    // A peer's state ends (dropped, or made and never installed): what is kept for it goes.
    std::function<void(PeerState&)> gone;
    // A session ended (control thread).
    std::function<void(const std::shared_ptr<control::Session>&)> closed;
    // Returns once every batch to `peer` (every peer: null) that started before the call has
    // ended; `revoked`, when set, is a region of the peer's that was just revoked. Called on
    // the control thread: batches that wait for it are passed by (core/awaiting_control.h).
    std::function<void(PeerState* peer, const RemoteRegion* revoked, Clock::time_point deadline)> fence;
    // Returns once every batch that streams and callers run has ended (control_thread: as
    // fence's).
    std::function<void(Clock::time_point deadline, bool control_thread)> fence_streams;
  };

  PeerService(LocalEngine& self, BackendSet& backends, RegionService& regions)
      : self_(self), backends_(backends), regions_(regions), auth_(self), names_(self) {}

  // Initialize's steps, in this order: the secret (wiped from *options); this engine's own
  // state (from then on, transfers to itself find it); the cluster names; the control loop.
  Status LoadSecret(EngineOptions* options) { return auth_.Load(options); }
  // staging: the buffer pool the routes' staged links go through (null: staging is off).
  void Begin(std::shared_ptr<EngineMetrics> metrics, std::shared_ptr<transport::BufferPool> staging,
             Events events);
  Status StartNames(bool listens);
  Status StartLoop(net::Fd listener, control::ControlHandler* handler);
  void StopNames() { names_.Stop(); }
  // Finalize: every peer sent our hello (Connects under way settle first) hears goodbye and
  // stops using our memory; then the sessions close and the secret is forgotten.
  void Stop();

  // What the backends ask (transport::EngineContext).
  bool authenticates() const { return auth_.on(); }
  bool HasLive(uint64_t incarnation) const { return table_.HasLive(incarnation); }
  std::vector<std::string> AuthKeysOf(uint64_t incarnation) const { return table_.AuthKeysOf(incarnation); }

  // Engine API.
  Status Connect(const std::string& remote, std::chrono::milliseconds timeout);
  Status ConnectAsync(const std::string& remote, std::chrono::milliseconds timeout, ConnectHandle* handle);
  Status GetConnectStatus(ConnectHandle handle, ConnectStatus* status);
  Status Disconnect(const std::string& remote);
  Status GetPeerInfo(const std::string& remote, PeerInfo* info);
  Status GetRemoteRegions(const std::string& remote, std::vector<RegionInfo>* regions);
  Status ListPeers(std::vector<ClusterPeer>* peers);

  // The session with remote (or this engine itself), without connecting. *by_name (when not
  // null): whether remote was looked up as a cluster name, whose address may change while the
  // peers stay the same.
  bool Lookup(const std::string& remote, Peer* peer, bool* by_name = nullptr);
  // Lookup, or auto-connect when the options say so.
  Status Find(const std::string& remote, Peer* peer);
  // Find's second half, after a Lookup found no peer: auto-connect, or kNotConnected.
  Status FindAfterMiss(const std::string& remote, Peer* peer);
  // After a plan refused with kRemoteAccessDenied (*s): the peer may have registered the
  // region a moment ago, so this engine catches up with its region updates once (within timeout
  // and the heartbeat timeout). True: caught up, plan again. False: *s stands, or says why the
  // catch-up failed (kConnectionLost, kTimeout).
  bool CaughtUp(const Peer& peer, const std::string& remote, std::chrono::milliseconds timeout, Status* s);
  // Changes whenever a peer comes or goes (PeerTable::version).
  uint64_t version() const { return table_.version(); }
  // Every peer's state, this engine's own included.
  std::vector<std::shared_ptr<PeerState>> Every() const;
  PeerState& self_state() { return *self_state_; }
  // The tags of our regions changed (the cluster entry carries them).
  void TagsChanged() { names_.TagsChanged(); }
  void AddGauges(MetricsSnapshot* out) const;

  // Control thread (EngineImpl routes the session's frames here): the frames before a
  // session's hello, and the hello; then region updates, round trips, goodbye.
  void OnBeforeHello(const std::shared_ptr<control::Session>& s, wire::Message&& msg);
  // Any thread (the control loop's worker, for a big hello): the peer's region table, checked
  // and indexed, for OnHello to take from Session::prepared.
  static std::shared_ptr<control::SessionContext> Prepare(const wire::Hello& hello, size_t max_regions);
  void OnMessage(const std::shared_ptr<control::Session>& s, wire::Message& msg);
  void OnClosed(const std::shared_ptr<control::Session>& s, const std::string& reason);

 private:
  // Connect's steps (peer_connect.cc), once the name is claimed (PeerTable::Claim): open the
  // session and read the peer's answer, then install the peer; AbandonConnect undoes the claim.
  Status ConnectByName(const std::string& name, std::chrono::milliseconds timeout);
  Status OpenSession(const net::Address& addr, const std::string& remote, Clock::time_point deadline,
                     std::shared_ptr<control::Session>* session, wire::Message* reply);
  Status InstallOutbound(const std::shared_ptr<control::Session>& session, const std::string& remote,
                         const wire::Hello& hello, const std::string& host);
  void AbandonConnect(const std::shared_ptr<control::Session>& session, const std::string& remote,
                      const std::string& why);
  void OnHello(const std::shared_ptr<control::Session>& s, wire::Hello&& hello);
  // Whether the peer of that key has a session under another incarnation that is alive (heard
  // from within heartbeat_timeout): a hello taking its name is then an impostor's, not a
  // restart (a restarted peer's old session ends with its process, or falls silent and dies).
  bool IsAliveUnderAnotherIncarnation(const std::string& key, uint64_t incarnation) const;
  // Our outbound session to the engine that s's hello names, which we dialled under another key,
  // when s comes from that engine (PeerTable::BeginAccept's `vouched`); null when there is none,
  // or s comes from elsewhere: from another process than the one we saw hold that session (a
  // peer on this host), else from another host than the one we reached it at.
  std::shared_ptr<control::Session> SameEngineDialled(const control::Session& s, const std::string& key,
                                                      const wire::Hello& hello) const;
  wire::Hello MakeHello(const std::vector<wire::WireRegion>& regions) const;
  // Sends our hello on s and adds s to the sessions that hear of region changes.
  Status SendHelloAndSubscribe(const std::shared_ptr<control::Session>& s);
  // host: the peer's address as we reach it (the control connection's other end).
  // auth_key: the authenticated session's key (PeerState::auth_key), or "".
  // control_fd: the peer's control connection, whose owner a claim to be on this host must
  // be (-1: the engine itself). table: the hello's regions, checked (RemoteRegions::Table).
  std::shared_ptr<PeerState> MakePeerState(const wire::Hello& hello, RemoteRegions::Table&& table,
                                           bool outbound, const std::string& host, int control_fd,
                                           const std::string& auth_key, std::string* transport_error);
  // Puts a route through the peer's staging slots ahead of each one-sided route (the peer
  // said wire::kFeatureTargetStaging; `features`: its hello's).
  static void AddBounceRoutes(PeerState& st, uint32_t features);
  // Marks the peer gone and revokes its regions; returns them, for CloseAll after a fence. What
  // the backends keep for its incarnation (its data connections to us) goes too, unless another
  // live session has that incarnation (the same engine under another key, or an impostor that
  // got in with it first: that one's end must not cut the real engine's data connections).
  RemoteRegions::Revoked Drop(PeerState& state);
  // Control thread: frees what Drop returned on the loop's worker (a million regions take a
  // fraction of a second).
  void FreeLater(RemoteRegions::Revoked&& gone);
  // One round trip on the session: when it returns true, the peer's earlier frames (region
  // updates) have been applied here.
  bool SyncWith(const std::shared_ptr<control::Session>& s, Clock::time_point deadline);
  // Tells each peer we are leaving and waits (up to heartbeat_timeout) until each has stopped
  // using our regions, then closes the sessions.
  void SayGoodbye(const std::vector<std::shared_ptr<control::Session>>& sessions, const std::string& reason);

  LocalEngine& self_;
  BackendSet& backends_;
  RegionService& regions_;
  Events events_;
  std::shared_ptr<EngineMetrics> metrics_;          // from Begin on
  std::shared_ptr<transport::BufferPool> staging_;  // from Begin on; null when staging is off
  Authenticator auth_;
  ClusterNames names_;
  PeerTable table_;
  AsyncConnects async_connects_{16};  // ConnectAsync's threads
  SessionsOpening opening_;
  std::shared_ptr<PeerState> self_state_;  // transfers to our own name; from Begin on
  std::unique_ptr<control::ControlLoop> loop_;
  log::Limit too_many_sessions_log_;  // control thread: hellos past max_sessions
  // A line about a session closed for breaking the protocol, one a second at most with a count
  // of those held back: anyone may open such sessions.
  void LogBroken(const std::string& line);
  log::Limit broken_log_;  // control thread: sessions closed for breaking the protocol
};

}  // namespace xfer
