// EngineImpl: the engine behind the public facade. engine.cc holds the public API and the
// data path; engine_control.cc holds the control plane (handshake, region updates, sessions).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "control/control_loop.h"
#include "control/session.h"
#include "core/async_connects.h"
#include "core/backend_set.h"
#include "core/buffer_pool.h"
#include "core/inline_target.h"
#include "core/metrics.h"
#include "core/metrics_server.h"
#include "core/notify_queue.h"
#include "core/peer_state.h"
#include "core/peer_table.h"
#include "core/prepared_lists.h"
#include "core/region_service.h"
#include "core/registry.h"
#include "core/request.h"
#include "core/request_table.h"
#include "core/stream_pool.h"
#include "metadata/directory.h"
#include "util/log.h"
#include "util/net.h"
#include "xfer/engine.h"

namespace xfer {

// Sends notifications: over a peer's control session, or into this engine's own queue (the
// peer with no session: this engine itself). Requests that carry a notification share it, so
// that none depends on the engine's lifetime.
struct NotifySender {
  std::shared_ptr<NotifyQueue> own;
  std::string name;  // this engine's, as the sender of its own notifications
  uint64_t incarnation = 0;
  // Calls done with the outcome: ok once the peer has queued the message.
  void Send(const PeerTable::Peer& peer, std::string message, Request::Done done) const;
};

class EngineImpl final : public control::ControlHandler {
 public:
  using Clock = std::chrono::steady_clock;

  EngineImpl() = default;
  ~EngineImpl() override { Finalize(); }

  Status Initialize(const std::string& local_name, const EngineOptions& options);
  void Finalize();
  std::string LocalName() const { return name_; }

  Status RegisterMem(void* addr, uint64_t len, MemType type, MemHandle* handle,
                     const std::string& tag, PeerAccess access);
  Status DeregisterMem(MemHandle handle, bool free = false);
  Status AllocMem(uint64_t len, MemType type, void** addr, MemHandle* handle,
                  const std::string& tag, const AllocOptions& options);
  Status FreeMem(MemHandle handle);

  Status Connect(const std::string& remote, std::chrono::milliseconds timeout);
  Status ConnectAsync(const std::string& remote, std::chrono::milliseconds timeout, ConnectHandle* handle);
  Status GetConnectStatus(ConnectHandle handle, ConnectStatus* status);
  Status Disconnect(const std::string& remote);
  Status GetPeerInfo(const std::string& remote, PeerInfo* info);
  Status GetRemoteRegions(const std::string& remote, std::vector<RegionInfo>* regions);
  Status ListPeers(std::vector<ClusterPeer>* peers);

  Status TransferSync(const std::string& remote, Op op, const std::vector<TransferDesc>& descs,
                      std::chrono::milliseconds timeout, const TransferOptions& options,
                      RequestStatus* result);
  Status TransferAsync(const std::string& remote, Op op, const std::vector<TransferDesc>& descs,
                       std::chrono::milliseconds timeout, const TransferOptions& options,
                       RequestHandle* request);
  Status PrepareLocalList(const std::vector<MemRange>& ranges, ListHandle* list);
  Status PrepareRemoteList(const std::string& remote, const std::vector<MemRange>& ranges,
                           ListHandle* list);
  Status ReleaseList(ListHandle list);
  Status TransferSync(Op op, const PreparedDescs& descs, std::chrono::milliseconds timeout,
                      const TransferOptions& options, RequestStatus* result);
  Status TransferAsync(Op op, const PreparedDescs& descs, std::chrono::milliseconds timeout,
                       const TransferOptions& options, RequestHandle* request);
  Status GetTransferStatus(RequestHandle request, RequestStatus* status);
  Status Wait(RequestHandle request, std::chrono::milliseconds timeout, RequestStatus* status);
  Status Cancel(RequestHandle request);

  Status SendNotify(const std::string& remote, const std::string& message,
                    std::chrono::milliseconds timeout);
  Status GetNotifies(std::vector<Notification>* out);
  Status WaitNotifies(std::vector<Notification>* out, std::chrono::milliseconds timeout);

  Status GetMetrics(MetricsSnapshot* out) const;
  std::string MetricsAddress() const { return metrics_address_; }

  // control::ControlHandler (control thread)
  void OnMessage(const std::shared_ptr<control::Session>& s, wire::Message&& msg) override;
  void OnClosed(const std::shared_ptr<control::Session>& s, const std::string& reason) override;
  void OnTick() override;  // inline targets forgotten while their slot was busy

 private:
  using Peer = PeerTable::Peer;

  Status CheckRunning(const char* what) const;
  // Starts the backends (Initialize); listen_host: where they listen, if they do.
  Status StartBackends(const std::string& listen_host);
  // --- data path (engine.cc)
  // The session with remote (or this engine itself), without connecting. *by_name (when not
  // null): whether remote was looked up as a cluster name, whose address may change while the
  // peers stay the same.
  bool LookupPeer(const std::string& remote, Peer* peer, bool* by_name = nullptr);
  // LookupPeer, or auto-connect when the options say so.
  Status FindPeer(const std::string& remote, Peer* peer);
  // track: keep the request in requests_ under its handle (async requests; a sync one is
  // only ever seen by its caller).
  Status Submit(const std::string& remote, Op op, const std::vector<TransferDesc>& descs,
                std::chrono::milliseconds timeout, const TransferOptions& options, bool track,
                std::shared_ptr<Request>* out);
  // After a plan refused with kRemoteAccessDenied (*s): the peer may have registered the
  // region a moment ago, so this engine catches up with its region updates once (within timeout
  // and the heartbeat timeout). True: caught up, plan again. False: *s stands, or says why the
  // catch-up failed (kConnectionLost, kTimeout).
  bool CaughtUp(const Peer& peer, const std::string& remote, std::chrono::milliseconds timeout,
                Status* s);
  // Submit's end: a refusal logged and counted (returned; remote "": before the prepared
  // lists, and so the peer, were known), or the request made.
  Status Refused(Op op, const std::string& remote, const Status& s);
  Status NewRequest(Op op, Clock::time_point start, std::chrono::milliseconds timeout,
                    const Peer& peer, std::shared_ptr<const Plan> plan,
                    const TransferOptions& options, bool track,
                    std::shared_ptr<Request>* out);
  // TransferSync's part once submitted (submitted: how that went) and TransferAsync's.
  Status RunSync(const Status& submitted, const std::shared_ptr<Request>& req,
                 std::chrono::milliseconds timeout, RequestStatus* result);
  void Start(const std::shared_ptr<Request>& req);
  // An async request that is one copy of up to this many bytes runs on the caller: the copy
  // costs less than a hand-off to a stream.
  static constexpr uint64_t kAsyncInlineBytes = 64 << 10;
  void Dispatch(const std::shared_ptr<Request>& req, bool caller_helps);
  void HelpWith(Request& req, Clock::time_point until);
  // Starts every batch of a pipelined request on its link.
  void StartAll(const std::shared_ptr<Request>& req);
  // Returns once every batch to `peer` (all peers: null) that started before the call has
  // ended: those that streams and callers run, and those in flight on pipelined links. At the
  // deadline, batches that a peer stalls are interrupted (Link::Interrupt) and fail.
  void FenceBatches(PeerState* peer, Clock::time_point deadline);
  // The part of it for the batches that streams and callers run.
  void FenceStreams(Clock::time_point deadline);
  std::vector<std::shared_ptr<PeerState>> EveryPeerState() const;  // the peers and this engine
  // The deadline of a fence on the control thread: every peer waits while it does (a quarter
  // of the heartbeat timeout, so that heartbeats still go out in time).
  Clock::time_point ControlFenceDeadline() const;
  // Moves one descriptor into or out of a peer's mapped memory on this thread, when its route
  // copies inline (Route::CopiesInline) and every check passes at once; false leaves it to the
  // planned path (which explains refusals).
  bool TryInlineCopy(const std::string& remote, Op op, const TransferDesc& d,
                    std::chrono::milliseconds timeout);
  // The route that copies len bytes to region inline, as the planner would choose it, with
  // where the region is mapped here; null when there is none (or a WRITE into read-only memory).
  transport::Route* InlineRoute(const PeerState& peer, Op op, RemoteRegion& region, uint64_t len,
                                uint64_t* mapped);
  // An inline copy, once the remote range is known to lie in region (and the local one in host
  // memory this process may read, or for READ write). With remember (its route and mapping are
  // filled in here), the copy's slot remembers that target.
  bool InlineCopy(const PeerState& peer, Op op, RemoteRegion& region, uint64_t local,
                  uint64_t remote, uint64_t len, InlineTarget* remember = nullptr);
  // The copy itself, by the caller that holds the execution slot: false (nothing copied) when
  // the route does not copy len bytes inline, or the peer or region ended.
  bool CopyInSlot(const PeerState& state, transport::Route& route, RemoteRegion& region, uint64_t mapped,
                  Op op, uint64_t local, uint64_t remote, uint64_t len);
  // Lets go of the inline targets of that peer (and region, when not null), and of those marked
  // earlier; a slot busy now is not waited for (the control thread calls this) but marked:
  // its target goes at the slot's next inline copy, or at the next try (OnTick).
  void ForgetInlineTargets(const PeerState* peer, const RemoteRegion* region = nullptr);
  // Every target, waiting until the deadline for busy slots (Finalize).
  void ForgetAllInlineTargets(Clock::time_point deadline);
  // --- prepared lists (engine_prepared.cc)
  // A request's two lists, looked up once for both of the steps below (status: why not found).
  struct FoundLists {
    Status status;
    std::shared_ptr<const LocalList> local;
    std::shared_ptr<const RemoteList> remote;
  };
  FoundLists FindLists(const PreparedDescs& descs) const;
  // Submit over prepared lists.
  Status SubmitPrepared(Op op, const PreparedDescs& descs, FoundLists found,
                        std::chrono::milliseconds timeout, const TransferOptions& options, bool track,
                        std::shared_ptr<Request>* out);
  // TryInlineCopy of a prepared request of one pair of at most max_len bytes.
  bool TryInlinePrepared(Op op, const PreparedDescs& descs, const FoundLists& found,
                         std::chrono::milliseconds timeout, uint64_t max_len);
  // The local list with handle h, checked again first when a region was registered or
  // deregistered since it was checked.
  std::shared_ptr<const LocalList> CurrentLocal(ListHandle h, std::shared_ptr<const LocalList> list);
  // --- cluster metadata (engine_cluster.cc)
  // Publishes this engine (when it listens and has a cluster name) and starts the lookups.
  Status StartDirectory(bool listens);
  // Connect to the engine of that cluster name: looked up afresh, then connected by address.
  Status ConnectByName(const std::string& name, std::chrono::milliseconds timeout);
  // LookupPeer of a cluster name: this engine, or the address it was last looked up at.
  bool LookupByName(const std::string& name, Peer* peer);
  // The address a cluster name was last looked up at (remote itself otherwise).
  std::string AddressOf(const std::string& remote);
  // --- metrics (engine_metrics.cc)
  // Serves the metrics at opts_.metrics_listen, when set.
  Status StartMetricsServer();
  // A peer's state gets its label in the metrics (where they are counted).
  void LabelPeer(PeerState& state);
  // The engine's own gauges (regions, sessions, queues), appended to *out.
  void AddEngineGauges(MetricsSnapshot* out) const;
  // --- notifications (engine_notify.cc)
  // kInvalidArgument when message is longer than the options allow.
  Status CheckNotifyMessage(const char* what, const std::string& message) const;
  // A notification from the peer of session s (control thread): queue it, answer.
  void OnNotify(const std::shared_ptr<control::Session>& s, wire::Notify&& m);
  // Moves what the queue and the rings hold onto *out; false when there was nothing.
  bool TakeNotifies(std::vector<Notification>* out);
  // A same-host peer offers its notification ring (control thread): map it, answer.
  void OnNotifyRingOffer(const std::shared_ptr<control::Session>& s, const wire::NotifyRingOffer& m);
  // Offers the session's peer this engine's ring for it, when it has one (the session is up).
  void OfferNotifyRing(const std::shared_ptr<control::Session>& s, const std::shared_ptr<PeerState>& peer);
  // --- control plane (engine_control.cc)
  // Connect's steps, once the name is claimed (PeerTable::Claim): open the session and read
  // the peer's answer, then install the peer; AbandonConnect undoes the claim.
  Status OpenSession(const net::Address& addr, const std::string& remote,
                     Clock::time_point deadline, std::shared_ptr<control::Session>* session,
                     wire::Message* reply);
  Status InstallOutbound(const std::shared_ptr<control::Session>& session,
                         const std::string& remote, const wire::Hello& hello,
                         const std::string& host);
  void AbandonConnect(const std::shared_ptr<control::Session>& session, const std::string& remote,
                      const std::string& why);
  // An outbound session is "connecting" from its opening until Connect installs or abandons
  // it, so that Finalize can wait for it: a peer sent our hello must hear our goodbye.
  // BeginConnecting fails once Finalize has begun.
  Status BeginConnecting(const std::shared_ptr<control::Session>& session);
  void EndConnecting(const std::shared_ptr<control::Session>& session);
  // Finalize: waits until no Connect is between those two (a session still there at the
  // deadline is closed, and its Connect then fails).
  void SettleConnects(Clock::time_point deadline);
  wire::Hello MakeHello(const std::vector<wire::WireRegion>& regions) const;
  // Sends our hello on s and adds s to the sessions that hear of region changes.
  Status SendHelloAndSubscribe(const std::shared_ptr<control::Session>& s);
  // host: the peer's address as we reach it (the control connection's other end).
  // auth_key: the authenticated session's key (PeerState::auth_key), or "".
  // control_fd: the peer's control connection, whose owner a claim to be on this host must
  // be (-1: the engine itself).
  std::shared_ptr<PeerState> MakePeerState(const wire::Hello& hello, bool outbound,
                                           const std::string& host, int control_fd,
                                           const std::string& auth_key,
                                           std::string* transport_error);
  // What the target-side backends may do with a range of our memory (EngineContext).
  transport::TargetAccess RegionAccess(uint64_t addr, uint64_t len, bool write) const;
  void OnHello(const std::shared_ptr<control::Session>& s, wire::Hello&& hello);
  // --- authentication (engine_auth.cc; docs/security.md)
  // The secret from the options (secret or secret_file) into secret_, wiped from opts_;
  // checks its length.
  Status LoadSecret(const EngineOptions& o);
  // Wipes the secret from memory (Finalize; opts_ never keeps it past Initialize).
  void ForgetSecret();
  // Connect's side of the handshake, before our hello: our challenge, the peer's challenge and
  // proof, ours. kRemoteAccessDenied when the peer is not who it must be.
  Status AuthenticateOutbound(control::Session& s, const std::string& remote,
                              Clock::time_point deadline);
  // The accepting side (control thread), for frames before the hello. True when msg was
  // handled here (answered, or the session refused).
  bool OnUnauthenticated(const std::shared_ptr<control::Session>& s, wire::Message& msg);
  // Refuses an accepted session: one log line naming its address, a Goodbye, and the close.
  void Refuse(const std::shared_ptr<control::Session>& s, const std::string& reason,
              const std::string& detail);
  // One round trip on the session: when it returns true, the peer's earlier frames (region
  // updates) have been applied here.
  bool SyncWith(const std::shared_ptr<control::Session>& s, Clock::time_point deadline);
  // Marks the peer gone and revokes its regions; returns them, for CloseAll after a fence.
  std::vector<std::shared_ptr<RemoteRegion>> DropPeerState(PeerState& state);
  // Tells each peer we are leaving and waits (up to heartbeat_timeout) until each has stopped
  // using our regions, then closes the sessions.
  void SayGoodbye(const std::vector<std::shared_ptr<control::Session>>& sessions,
                  const std::string& reason);

  EngineOptions opts_;
  std::atomic<bool> running_{false};
  bool finalized_ = false;  // an engine is initialized at most once
  std::string name_;
  uint64_t incarnation_ = 0;
  std::string host_id_;
  std::string secret_;  // empty: peers are not authenticated
  std::shared_ptr<BufferPool> staging_;  // null when EngineOptions::staging is off
  BackendSet backends_;

  std::unique_ptr<StreamPool> pool_;
  InlineTarget inline_targets_[StreamPool::kInlineSlots];  // each under its inline slot of pool_
  // Marked by ForgetInlineTargets when it found the slot busy: its target no longer serves.
  std::atomic<bool> inline_forgotten_[StreamPool::kInlineSlots] = {};
  std::unique_ptr<control::ControlLoop> loop_;
  std::shared_ptr<PeerState> self_;  // transfers to our own name

  RegionService regions_;  // our regions, and the sessions that hear of their changes

  PeerTable peers_;
  AsyncConnects async_connects_{16};  // ConnectAsync's threads
  std::unique_ptr<metadata::Directory> directory_;  // with EngineOptions::metadata
  std::mutex names_mu_;
  std::unordered_map<std::string, std::string> addresses_;  // (names_mu_) cluster name -> address
  std::mutex connecting_mu_;
  std::condition_variable connecting_cv_;
  std::set<std::shared_ptr<control::Session>> connecting_;  // (connecting_mu_)
  bool settling_ = false;  // Finalize has begun: no session begins connecting (connecting_mu_)

  RequestTable requests_;
  ListTable lists_;

  std::shared_ptr<NotifyQueue> notifies_;  // received, not yet taken; from Initialize on
  std::unique_ptr<NotifyInbox> inbox_;     // same-host peers' notification rings; from Initialize on
  bool rings_possible_ = false;            // this host lets us share notification rings
  std::atomic<uint64_t> next_ring_key_{1};
  std::shared_ptr<const NotifySender> notifier_;
  log::Limit notify_refusal_log_;  // control thread: oversize notifications from peers
  log::Limit refusal_log_;         // control thread: refused connections (Refuse)
  log::Limit too_many_sessions_log_;  // control thread: hellos past max_sessions

  std::shared_ptr<EngineMetrics> metrics_;  // from Initialize on
  std::string metrics_address_;             // where metrics_server_ serves (set by Initialize)
  // Last, so that it stops first: it reads the members above while it serves.
  std::unique_ptr<MetricsServer> metrics_server_;
};

// Adds a timeout to a time (now) without overflowing on huge values.
inline std::chrono::steady_clock::time_point DeadlineAfter(std::chrono::steady_clock::time_point from,
                                                           std::chrono::milliseconds t) {
  constexpr std::chrono::milliseconds kMax = std::chrono::hours(24 * 365);
  return from + std::clamp(t, std::chrono::milliseconds(0), kMax);
}
inline std::chrono::steady_clock::time_point DeadlineAfter(std::chrono::milliseconds t) {
  return DeadlineAfter(std::chrono::steady_clock::now(), t);
}

}  // namespace xfer
