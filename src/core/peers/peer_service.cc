#include "core/peers/peer_service.h"

#include "util/log.h"

namespace xfer {

void PeerService::Begin(std::shared_ptr<EngineMetrics> metrics,
                        std::shared_ptr<transport::BufferPool> staging, Events events) {
  metrics_ = std::move(metrics);
  staging_ = std::move(staging);
  events_ = std::move(events);
  table_.set_incarnation(self_.incarnation);
  table_.set_max_sessions(self_.options.max_sessions);
  table_.set_max_sessions_per_host(self_.options.max_sessions_per_host);
  std::string unreachable;
  self_state_ = MakePeerState(MakeHello({}), RemoteRegions::Table({}, 0), false, "", -1, "", &unreachable);
  self_state_->info.name = self_.name;
}

Status PeerService::StartNames(bool listens) {
  if (self_.options.metadata.empty()) return Status::Ok();
  return names_.Start(listens, [this] {
    std::vector<std::string> tags;
    for (const auto& r : regions_.registry().Snapshot()) tags.push_back(r.info.tag);
    return tags;
  });
}

Status PeerService::StartLoop(net::Fd listener, control::ControlHandler* handler) {
  const EngineOptions& o = self_.options;
  loop_ =
      std::make_unique<control::ControlLoop>(std::move(listener), handler,
                                             control::LoopOptions{o.heartbeat_interval, o.heartbeat_timeout,
                                                                  auth_.on(), o.max_unsent_bytes, o.spin});
  return loop_->Start();
}

void PeerService::Stop() {
  names_.Stop();             // (first: others stop finding this engine)
  async_connects_.Cancel();  // (those running end as Connects do at Finalize: below)
  auto told = regions_.CloseSubscriptions();
  opening_.Settle(self_.HeartbeatDeadline());
  SayGoodbye(told, "engine finalized");
  async_connects_.Join();
  if (loop_)
    loop_->Stop();  // closes every session (notifications still unanswered fail); OnClosed drops their state
  auth_.Forget();   // (no thread reads it any more: the control loop stopped, Connects settled)
}

RemoteRegions::Revoked PeerService::Drop(PeerState& state) {
  state.alive.store(false);
  // (Before any fence: a batch that waits for the peer's staging answer, which a fence on the
  // control thread passes by, then ends without touching the slots, another peer's next.)
  if (state.stage) state.stage->Close();
  events_.gone(state);  // (its notification ring closes; the data path lets go of it)
  auto gone = state.regions.RevokeAll();
  for (const auto& r : state.routes.routes) r->link().Shutdown();
  // (alive is false already: this state is not the live session HasLive finds.)
  if (!table_.HasLive(state.info.incarnation)) backends_.DropPeer(state.info.incarnation);
  return gone;
}

void PeerService::FreeLater(RemoteRegions::Revoked&& gone) {
  loop_->Offload([gone = std::make_shared<RemoteRegions::Revoked>(std::move(gone))] {});
}

void PeerService::SayGoodbye(const std::vector<std::shared_ptr<control::Session>>& sessions,
                             const std::string& reason) {
  std::vector<std::pair<std::shared_ptr<control::Session>, uint64_t>> pending;
  for (auto& s : sessions) {
    uint64_t seq = 0;
    auto bye = [&](uint64_t n) { return wire::Goodbye{reason, n}; };
    if (s->SendNumbered(bye, &seq).ok()) {
      pending.emplace_back(s, seq);
    }
  }
  auto deadline = self_.HeartbeatDeadline();
  for (auto& [s, seq] : pending) {
    if (!s->WaitAcked(seq, deadline) && !s->closed()) {
      XLOG(WARN) << "peer " << s->peer_key << " did not confirm the goodbye in time";
    }
  }
  for (auto& s : sessions) s->Shutdown(reason);
}

Status PeerService::ConnectAsync(const std::string& remote, std::chrono::milliseconds timeout,
                                 ConnectHandle* handle) {
  Status s = self_.CheckRunning("ConnectAsync");
  if (s.ok() && handle == nullptr) s = {StatusCode::kInvalidArgument, "ConnectAsync: null handle"};
  if (!s.ok()) {
    XLOG(WARN) << s.message();
    return s;
  }
  const auto deadline = DeadlineAfter(timeout);
  *handle = async_connects_.Start([this, remote, deadline] {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      return Status{StatusCode::kTimeout, "ConnectAsync to '" + remote +
                                              "': its timeout passed "
                                              "while it waited for a connect thread"};
    }
    return Connect(remote, left);
  });
  return Status::Ok();
}

Status PeerService::GetConnectStatus(ConnectHandle handle, ConnectStatus* status) {
  if (status == nullptr) return {StatusCode::kInvalidArgument, "GetConnectStatus: null status"};
  if (!async_connects_.Poll(handle, status)) {
    return {StatusCode::kInvalidArgument, "GetConnectStatus: unknown handle " + std::to_string(handle) +
                                              " (never returned by ConnectAsync, or already reported done)"};
  }
  return Status::Ok();
}

Status PeerService::Disconnect(const std::string& remote) {
  Status s = self_.CheckRunning("Disconnect");
  if (!s.ok()) return s;
  Peer peer;
  if (!table_.Take(names_.AddressOf(remote), &peer)) {
    return {StatusCode::kNotConnected, "Disconnect: not connected to '" + remote + "'"};
  }
  auto gone = Drop(*peer.state);
  events_.fence_streams(self_.HeartbeatDeadline(), false);  // our batches to the peer have finished
  for (auto& r : gone.regions) r->CloseAll();
  SayGoodbye({peer.session}, "disconnected by " + self_.name);
  return Status::Ok();
}

Status PeerService::GetPeerInfo(const std::string& remote, PeerInfo* info) {
  Status s = self_.CheckRunning("GetPeerInfo");
  if (!s.ok()) return s;
  if (info == nullptr) return {StatusCode::kInvalidArgument, "GetPeerInfo: null info"};
  Peer peer;
  if (!Lookup(remote, &peer)) {
    return {StatusCode::kNotConnected, "not connected to '" + remote + "'"};
  }
  const PeerState& st = *peer.state;
  *info = st.info;
  uint64_t staged = 0;
  // (A route through the peer's staging slots comes right before the route it goes over, and
  // shares its name: one entry for both.)
  auto count = [](std::vector<PeerInfo::Moved>* list, std::string_view route, uint64_t bytes) {
    if (list->empty() || list->back().path != route) list->push_back({std::string(route), 0});
    list->back().bytes += bytes;
  };
  for (const auto& r : st.routes.routes) {  // (built here: the routes are the one record)
    if (info->routes.empty() || info->routes.back() != r->backend()) info->routes.emplace_back(r->backend());
    count(&info->moved, r->backend(), r->bytes().load(std::memory_order_relaxed));
    for (auto& [path, bytes] : r->link().PathBytes()) info->nic_pairs.push_back({std::move(path), bytes});
    if (const uint64_t n = r->staged_bytes().load(std::memory_order_relaxed); n > 0) {
      count(&info->staged_via, r->backend(), n);
      staged += n;
    }
  }
  info->moved.push_back({"staged", staged});
  return Status::Ok();
}

bool PeerService::SyncWith(const std::shared_ptr<control::Session>& s, Clock::time_point deadline) {
  uint64_t seq = 0;
  if (!s->SendNumbered([](uint64_t n) { return wire::Sync{n}; }, &seq).ok()) return false;
  return s->WaitAcked(seq, deadline);
}

Status PeerService::GetRemoteRegions(const std::string& remote, std::vector<RegionInfo>* regions) {
  Status s = self_.CheckRunning("GetRemoteRegions");
  if (!s.ok()) return s;
  if (regions == nullptr) return {StatusCode::kInvalidArgument, "GetRemoteRegions: null output"};
  Peer peer;
  s = Find(remote, &peer);
  if (!s.ok()) return s;
  if (peer.session && !SyncWith(peer.session, self_.HeartbeatDeadline())) {
    return {StatusCode::kConnectionLost, "peer '" + remote + "' did not answer"};
  }
  *regions = peer.state->regions.List();
  return Status::Ok();
}

Status PeerService::ListPeers(std::vector<ClusterPeer>* peers) {
  Status s = self_.CheckRunning("ListPeers");
  if (s.ok()) s = names_.List(peers);
  if (!s.ok()) XLOG(WARN) << s.message();
  return s;
}

bool PeerService::Lookup(const std::string& remote, Peer* peer, bool* by_name) {
  if (by_name != nullptr) *by_name = false;
  if (remote == self_.name) {  // (first: a client-only engine's name has no port either)
    *peer = Peer{nullptr, self_state_};
    return true;
  }
  if (names_.IsName(remote)) {
    if (by_name != nullptr) *by_name = true;
    const std::string address = names_.AddressOf(remote);
    return address != remote && Lookup(address, peer);
  }
  return table_.Find(remote, peer);
}

Status PeerService::Find(const std::string& remote, Peer* peer) {
  return Lookup(remote, peer) ? Status::Ok() : FindAfterMiss(remote, peer);
}

Status PeerService::FindAfterMiss(const std::string& remote, Peer* peer) {
  if (!self_.options.auto_connect) {
    return {StatusCode::kNotConnected,
            "not connected to '" + remote + "' (call Connect first, or set auto_connect)"};
  }
  Status s = Connect(remote, self_.options.auto_connect_timeout);
  if (!s.ok() && s.code() != StatusCode::kAlreadyConnected) {
    return {StatusCode::kNotConnected, "auto-connect to '" + remote + "' failed: " + s.ToString()};
  }
  if (!Lookup(remote, peer)) return {StatusCode::kConnectionLost, "peer '" + remote + "' went away"};
  return Status::Ok();
}

bool PeerService::CaughtUp(const Peer& peer, const std::string& remote, std::chrono::milliseconds timeout,
                           Status* s) {
  if (!peer.session) return false;  // (this engine itself: nothing to catch up with)
  const auto hb = self_.options.heartbeat_timeout;
  const auto deadline = DeadlineAfter(std::min(timeout, hb));
  if (SyncWith(peer.session, deadline)) return true;
  if (!peer.state->alive.load() || peer.session->closed()) {
    *s = {StatusCode::kConnectionLost, "peer '" + remote + "' went away"};
  } else if (timeout < hb && Clock::now() >= deadline) {
    *s = {StatusCode::kTimeout,
          "the deadline passed while catching up with the peer's region "
          "updates (as last known: " +
              s->message() + ")"};
  }
  return false;
}

std::vector<std::shared_ptr<PeerState>> PeerService::Every() const {
  auto peers = table_.States();
  if (self_state_) peers.push_back(self_state_);
  return peers;
}

void PeerService::AddGauges(MetricsSnapshot* out) const {
  AddValue(out, "xfer_sessions", MetricType::kGauge, "Peers with a control session now.",
           static_cast<double>(table_.States().size()));
  if (!loop_) return;
  const auto& c = loop_->counters();
  AddValue(out, "xfer_heartbeats_missed_total", MetricType::kCounter,
           "Times a peer stayed silent for half the heartbeat timeout (heartbeats late or missed).",
           static_cast<double>(c.peers_late.load()));
  AddValue(out, "xfer_peers_declared_dead_total", MetricType::kCounter,
           "Sessions ended because the peer stayed silent for the heartbeat timeout.",
           static_cast<double>(c.peers_declared_dead.load()));
  AddValue(out, "xfer_control_turns_total", MetricType::kCounter,
           "Times the control thread looked at its connections: each wake-up, and each poll while "
           "it spins in a busy exchange.",
           static_cast<double>(c.turns.load()));
}

}  // namespace xfer
