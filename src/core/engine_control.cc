// The engine's control plane: connecting, the hello exchange, region updates, session ends.
#include <unistd.h>

#include "core/engine_impl.h"
#include "util/host.h"
#include "util/log.h"
#include "util/process_check.h"

namespace xfer {
namespace {

// Peers without a port (client-only engines) may share a name: tell them apart.
std::string PeerKey(const wire::Hello& h) {
  net::Address a;
  if (net::ParseAddress(h.name, &a).ok() && a.has_port) return h.name;
  char inc[24];
  std::snprintf(inc, sizeof inc, "%016llx", static_cast<unsigned long long>(h.incarnation));
  return h.name + "#" + inc;
}

}  // namespace

wire::Hello EngineImpl::MakeHello(const std::vector<wire::WireRegion>& regions) const {
  wire::Hello h;
  h.name = name_;
  h.incarnation = incarnation_;
  h.host_id = host_id_;
  h.pid = static_cast<int32_t>(::getpid());
  h.backends = backends_.HelloBlobs();
  h.regions = regions;
  return h;
}

Status EngineImpl::SendHelloAndSubscribe(const std::shared_ptr<control::Session>& s) {
  return regions_.SendHelloAndSubscribe(s, [this](const auto& r) { return MakeHello(r); });
}

std::shared_ptr<PeerState> EngineImpl::MakePeerState(const wire::Hello& hello, bool outbound,
                                                     const std::string& host, int control_fd,
                                                     const std::string& auth_key,
                                                     std::string* transport_error) {
  auto st = std::make_shared<PeerState>();
  st->auth_key = auth_key;
  st->info.name = hello.name;
  st->info.incarnation = hello.incarnation;
  st->info.host_id = hello.host_id;
  st->info.pid = hello.pid;
  st->info.transport = "none";
  st->info.outbound = outbound;
  LabelPeer(*st);
  transport::PeerContext peer;
  peer.name = hello.name;
  peer.incarnation = hello.incarnation;
  peer.pid = hello.pid;
  peer.host = host;
  peer.auth_key = auth_key;
  // A claim to be on this host chooses paths that act on the peer's pid and addresses (cma
  // writes into that pid, shm takes its descriptors, local and cuda use the addresses as
  // ours): it holds only once that process is seen to hold the control connection.
  net::Fd pidfd;
  peer.same_host = hello.host_id == host_id_;
  if (peer.same_host && control_fd >= 0) {
    if (Status v = host::VerifyConnectionOwner(control_fd, hello.pid, &pidfd); !v.ok()) {
      XLOG(WARN) << "peer " << hello.name << " says it is pid " << hello.pid
                 << " on this host, which does not check out (" << v.message()
                 << "): no same-host transport is used for it";
      peer.same_host = false;
    }
  }
  peer.same_process = peer.same_host && hello.pid == ::getpid();
  peer.pidfd = pidfd.get();
  const bool itself = hello.incarnation == incarnation_;
  if (pidfd.valid() && !itself) {
    if (!shared_memory::PeerMapper::Open(hello.pid, pidfd.get(), &st->mapper).ok()) st->mapper.reset();
    if (rings_possible_) {
      st->outbox = NotifyOutbox::Make(incarnation_, next_ring_key_.fetch_add(1), opts_.notify.ring_bytes,
                                      opts_.notify.max_message_bytes);
    }
  }
  // (The routes live in the peer's state, which outlives them.)
  peer.find_region = [regions = &st->regions](uint64_t a, uint64_t l, bool w) { return regions->Find(a, l, w); };
  st->routes.routes = backends_.Connect(peer, hello.backends, itself, transport_error);
  st->routes.staging = staging_ != nullptr;
  st->routes.stage_all = opts_.staging == Staging::kAlways;
  st->routes.staging_bytes = opts_.staging_buffer_bytes;
  st->staging = staging_;
  for (const auto& r : st->routes.routes) st->copies_inline = st->copies_inline || r->CopiesInline(1);
  // The transport: the best route that is a link (one that staging may use), else the best.
  for (const auto& r : st->routes.routes) {
    if (r->Stageable()) {
      st->info.transport = std::string(r->backend());
      break;
    }
  }
  if (st->info.transport == "none" && st->Reachable()) {
    st->info.transport = std::string(st->routes.routes[0]->backend());
  }
  if (!st->Reachable()) {
    *transport_error = "no transport reaches peer " + hello.name + " (" + *transport_error + ")";
  }
  st->regions.Reset(hello.regions);
  return st;
}

std::vector<std::shared_ptr<RemoteRegion>> EngineImpl::DropPeerState(PeerState& state) {
  state.alive.store(false);
  if (state.outbox) state.outbox->Close();
  auto gone = state.regions.RevokeAll();
  for (const auto& r : state.routes.routes) r->link().Shutdown();
  backends_.DropPeer(state.info.incarnation);
  ForgetInlineTargets(&state);
  return gone;
}

Status EngineImpl::Connect(const std::string& remote, std::chrono::milliseconds timeout) {
  Status s = CheckRunning("Connect");
  if (s.ok() && metadata::IsClusterName(remote)) return ConnectByName(remote, timeout);
  net::Address addr;
  if (s.ok()) s = net::ParseAddress(remote, &addr);
  if (s.ok() && !addr.has_port) {
    s = {StatusCode::kInvalidArgument, "Connect: '" + remote + "' has no port"};
  }
  if (!s.ok()) {
    XLOG(WARN) << "Connect: " << s.ToString();
    return s;
  }
  if (remote == name_) return Status::Ok();  // this engine is always reachable by itself
  const auto deadline = DeadlineAfter(timeout);
  if (s = peers_.Claim(remote, deadline); !s.ok()) {
    if (s.code() == StatusCode::kResourceExhausted) {
      s = {s.code(), "Connect to '" + remote + "': " + s.message()};
      XLOG(WARN) << s.message();
    }
    return s;
  }
  std::shared_ptr<control::Session> session;
  struct Settle {  // (whatever happens below, Finalize is not left waiting for this Connect)
    EngineImpl* engine;
    std::shared_ptr<control::Session>* session;
    ~Settle() {
      if (*session) engine->EndConnecting(*session);
    }
  } settle{this, &session};
  wire::Message reply;
  s = OpenSession(addr, remote, deadline, &session, &reply);
  bool crossed = false;  // the peer is connecting to us at the same time: its session stays
  if (s.ok()) {
    if (auto* bye = std::get_if<wire::Goodbye>(&reply)) {
      crossed = bye->reason.find("already connected") != std::string::npos;
      const bool auth = bye->reason.starts_with("authentication");  // (Refuse's reasons)
      const bool full = bye->reason.find("max_sessions") != std::string::npos;
      s = {auth ? StatusCode::kRemoteAccessDenied
                : (full ? StatusCode::kResourceExhausted : StatusCode::kConnectionLost),
           "'" + remote + "' refused the connection: " + bye->reason};
    } else if (auto* hello = std::get_if<wire::Hello>(&reply)) {
      s = InstallOutbound(session, remote, *hello, addr.host);
    } else {
      s = {StatusCode::kConnectionLost, "'" + remote + "' did not answer with a hello"};
    }
  }
  if (!s.ok()) AbandonConnect(session, remote, crossed ? "already connected" : s.message());
  if (session) EndConnecting(session);  // (before the wait below)
  if (crossed) return peers_.AwaitCrossed(remote, deadline);
  if (!s.ok()) XLOG(WARN) << "Connect to '" << remote << "' failed: " << s.ToString();
  return s;
}

Status EngineImpl::BeginConnecting(const std::shared_ptr<control::Session>& session) {
  std::lock_guard l(connecting_mu_);
  if (settling_) return {StatusCode::kCanceled, "the engine is finalizing"};
  connecting_.insert(session);
  return Status::Ok();
}

void EngineImpl::EndConnecting(const std::shared_ptr<control::Session>& session) {
  std::lock_guard l(connecting_mu_);
  if (connecting_.erase(session) != 0) connecting_cv_.notify_all();
}

void EngineImpl::SettleConnects(Clock::time_point deadline) {
  std::unique_lock l(connecting_mu_);
  settling_ = true;
  if (!connecting_cv_.wait_until(l, deadline, [&] { return connecting_.empty(); })) {
    for (const auto& s : connecting_) {
      XLOG(WARN) << "the connection to " << s->remote_addr() << " did not finish within the heartbeat "
                 << "timeout while the engine finalized; closing it";
      s->Shutdown("engine finalized");
    }
    connecting_cv_.wait(l, [&] { return connecting_.empty(); });  // (their reads fail at once now)
  }
}

void EngineImpl::AbandonConnect(const std::shared_ptr<control::Session>& session,
                                const std::string& remote, const std::string& why) {
  if (session) {
    (void)session->Send(wire::Goodbye{why});  // (what the socket takes at once: it closes next)
    regions_.Unsubscribe(session);
    session->Close();
  }
  peers_.Unclaim(remote);
}

Status EngineImpl::OpenSession(const net::Address& addr, const std::string& remote,
                               Clock::time_point deadline,
                               std::shared_ptr<control::Session>* session, wire::Message* reply) {
  net::Fd fd;
  Status s = net::ConnectTcp(addr, deadline, &fd, &running_);  // (Finalize: given up at once)
  if (!s.ok()) return s;
  *session = std::make_shared<control::Session>(std::move(fd), true, addr.ToString());
  (*session)->set_max_queued(opts_.max_unsent_bytes);
  if (s = BeginConnecting(*session); !s.ok()) {
    session->reset();
    return {s.code(), "Connect: " + s.message()};
  }
  if (!secret_.empty()) {  // nothing about this engine leaves before the peer proved itself
    if (s = AuthenticateOutbound(**session, remote, deadline); !s.ok()) return s;
  }
  s = SendHelloAndSubscribe(*session);
  if (s.ok()) s = (*session)->FlushUntil(deadline);  // (the control loop does not watch it yet)
  if (!s.ok()) return s;
  s = (*session)->ReadOne(deadline, reply);
  if (!s.ok()) return {s.code(), "no hello from '" + remote + "': " + s.message()};
  return Status::Ok();
}

Status EngineImpl::InstallOutbound(const std::shared_ptr<control::Session>& session,
                                   const std::string& remote, const wire::Hello& hello,
                                   const std::string& host) {
  if (std::string why = WhyBadTable(hello.regions, opts_.max_peer_regions); !why.empty()) {
    return {StatusCode::kConnectionLost, "'" + remote + "' sent a bad region table: " + why};
  }
  if (session->auth && (hello.name != session->auth->their_name() ||
                        hello.incarnation != session->auth->their_incarnation())) {
    return {StatusCode::kRemoteAccessDenied,
            "'" + remote + "' sent a hello for another engine than it authenticated as"};
  }
  std::string transport_error;
  auto state = MakePeerState(hello, true, host, session->fd(), session->auth_key, &transport_error);
  if (!state->Reachable()) return {StatusCode::kUnsupported, transport_error};
  session->peer = state;
  session->peer_key = remote;
  session->established.store(true);
  OfferNotifyRing(session, state);  // (before any notification can be sent on the session)
  if (!peers_.InstallClaimed(remote, Peer{session, state})) {
    session->Close();  // a crossing session from the peer got in first: it stays
    regions_.Unsubscribe(session);
    return Status::Ok();
  }
  loop_->Add(session);
  metrics_->SessionOpened(remote);
  XLOG(INFO) << "connected to " << remote << " (pid " << hello.pid << ", transport "
             << state->info.transport << ", " << hello.regions.size() << " regions)";
  return Status::Ok();
}

void EngineImpl::SayGoodbye(const std::vector<std::shared_ptr<control::Session>>& sessions,
                            const std::string& reason) {
  std::vector<std::pair<std::shared_ptr<control::Session>, uint64_t>> pending;
  for (auto& s : sessions) {
    uint64_t seq = 0;
    auto bye = [&](uint64_t n) { return wire::Goodbye{reason, n}; };
    if (s->SendNumbered(bye, &seq).ok()) {
      pending.emplace_back(s, seq);
    }
  }
  auto deadline = DeadlineAfter(opts_.heartbeat_timeout);
  for (auto& [s, seq] : pending) {
    if (!s->WaitAcked(seq, deadline) && !s->closed()) {
      XLOG(WARN) << "peer " << s->peer_key << " did not confirm the goodbye in time";
    }
  }
  for (auto& s : sessions) s->Shutdown(reason);
}

Status EngineImpl::ConnectAsync(const std::string& remote, std::chrono::milliseconds timeout,
                                ConnectHandle* handle) {
  Status s = CheckRunning("ConnectAsync");
  if (s.ok() && handle == nullptr) s = {StatusCode::kInvalidArgument, "ConnectAsync: null handle"};
  if (!s.ok()) {
    XLOG(WARN) << s.message();
    return s;
  }
  const auto deadline = DeadlineAfter(timeout);
  *handle = async_connects_.Start([this, remote, deadline] {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      return Status{StatusCode::kTimeout, "ConnectAsync to '" + remote + "': its timeout passed "
                                          "while it waited for a connect thread"};
    }
    return Connect(remote, left);
  });
  return Status::Ok();
}

Status EngineImpl::GetConnectStatus(ConnectHandle handle, ConnectStatus* status) {
  if (status == nullptr) return {StatusCode::kInvalidArgument, "GetConnectStatus: null status"};
  if (!async_connects_.Poll(handle, status)) {
    return {StatusCode::kInvalidArgument, "GetConnectStatus: unknown handle " + std::to_string(handle) +
                                              " (never returned by ConnectAsync, or already reported done)"};
  }
  return Status::Ok();
}

Status EngineImpl::Disconnect(const std::string& remote) {
  Status s = CheckRunning("Disconnect");
  if (!s.ok()) return s;
  Peer peer;
  if (!peers_.Take(AddressOf(remote), &peer)) {
    return {StatusCode::kNotConnected, "Disconnect: not connected to '" + remote + "'"};
  }
  auto gone = DropPeerState(*peer.state);
  FenceStreams(DeadlineAfter(opts_.heartbeat_timeout));  // our batches to the peer have finished
  for (auto& r : gone) r->CloseAll();
  SayGoodbye({peer.session}, "disconnected by " + name_);
  return Status::Ok();
}

Status EngineImpl::GetPeerInfo(const std::string& remote, PeerInfo* info) {
  Status s = CheckRunning("GetPeerInfo");
  if (!s.ok()) return s;
  if (info == nullptr) return {StatusCode::kInvalidArgument, "GetPeerInfo: null info"};
  Peer peer;
  if (!LookupPeer(remote, &peer)) {
    return {StatusCode::kNotConnected, "not connected to '" + remote + "'"};
  }
  const PeerState& st = *peer.state;
  *info = st.info;
  for (const auto& r : st.routes.routes) {  // (built here: the routes are the one record)
    info->routes.emplace_back(r->backend());
    info->moved.push_back({std::string(r->backend()), r->bytes().load(std::memory_order_relaxed)});
    for (auto& [path, bytes] : r->link().PathBytes()) info->nic_pairs.push_back({std::move(path), bytes});
  }
  info->moved.push_back({"staged", st.staged_bytes.load(std::memory_order_relaxed)});
  return Status::Ok();
}

bool EngineImpl::SyncWith(const std::shared_ptr<control::Session>& s, Clock::time_point deadline) {
  uint64_t seq = 0;
  if (!s->SendNumbered([](uint64_t n) { return wire::Sync{n}; }, &seq).ok()) return false;
  return s->WaitAcked(seq, deadline);
}

Status EngineImpl::GetRemoteRegions(const std::string& remote, std::vector<RegionInfo>* regions) {
  Status s = CheckRunning("GetRemoteRegions");
  if (!s.ok()) return s;
  if (regions == nullptr) return {StatusCode::kInvalidArgument, "GetRemoteRegions: null output"};
  Peer peer;
  s = FindPeer(remote, &peer);
  if (!s.ok()) return s;
  if (peer.session && !SyncWith(peer.session, DeadlineAfter(opts_.heartbeat_timeout))) {
    return {StatusCode::kConnectionLost, "peer '" + remote + "' did not answer"};
  }
  *regions = peer.state->regions.List();
  return Status::Ok();
}

// ---------------------------------------------------------------- control thread
void EngineImpl::OnHello(const std::shared_ptr<control::Session>& s, wire::Hello&& hello) {
  if (hello.name.empty() || hello.incarnation == 0) {
    XLOG(WARN) << "hello from " << s->remote_addr() << " without name or incarnation; closing";
    s->Shutdown("invalid hello");
    return;
  }
  if (std::string why = WhyBadTable(hello.regions, opts_.max_peer_regions); !why.empty()) {
    XLOG(WARN) << "hello from " << s->remote_addr() << " has a bad region table (" << why << "); closing";
    (void)s->Send(wire::Goodbye{"bad region table: " + why});
    s->Shutdown("bad region table");
    return;
  }
  if (s->auth && (hello.name != s->auth->their_name() || hello.incarnation != s->auth->their_incarnation())) {
    Refuse(s, "authentication failed", "its hello names another engine than it authenticated as");
    return;
  }
  const std::string key = PeerKey(hello);
  Peer replaced;
  if (Status st = peers_.BeginAccept(key, hello.incarnation, &replaced); !st.ok()) {
    if (st.code() == StatusCode::kResourceExhausted) {
      if (uint64_t more = 0; too_many_sessions_log_.Due(&more)) {
        XLOG(WARN) << "refused the hello of " << key << " from " << s->remote_addr() << ": "
                   << st.message() << log::Limit::More(more);
      }
      (void)s->Send(wire::Goodbye{st.message()});
      s->Shutdown("too many sessions");
      return;
    }
    (void)s->Send(wire::Goodbye{"already connected to " + name_});
    s->Shutdown("duplicate connection from " + key);
    return;
  }
  if (replaced.session) {  // the peer restarted: forget everything about the old one
    DropPeerState(*replaced.state);
    XLOG(INFO) << "peer " << key << " restarted (new incarnation); dropping the old session";
    replaced.session->Shutdown("peer restarted");
  }
  std::string transport_error;
  auto state = MakePeerState(hello, false, net::HostOf(s->remote_addr()), s->fd(), s->auth_key,
                             &transport_error);
  if (!state->Reachable()) {
    XLOG(INFO) << "peer " << key << " connected; this engine cannot initiate transfers to it: "
               << transport_error;
  } else {
    XLOG(INFO) << "peer " << key << " connected (pid " << hello.pid << ", transport "
               << state->info.transport << ")";
  }
  // Known before the reply leaves, so the peer's Connect() never returns ahead of us.
  s->peer = state;
  s->peer_key = key;
  s->established.store(true);
  peers_.FinishAccept(key, Peer{s, state});
  metrics_->SessionOpened(key);
  if (!SendHelloAndSubscribe(s).ok()) s->Shutdown("cannot send hello");
  OfferNotifyRing(s, state);  // (after the hello, which the peer reads first)
}

void EngineImpl::OnMessage(const std::shared_ptr<control::Session>& s, wire::Message&& msg) {
  if (!s->established.load()) {
    if (OnUnauthenticated(s, msg)) return;
    if (auto* hello = std::get_if<wire::Hello>(&msg)) return OnHello(s, std::move(*hello));
    XLOG(WARN) << "control connection from " << s->remote_addr() << " sent "
               << "a frame before its hello; closing it";
    s->Shutdown("protocol error: no hello");
    return;
  }
  PeerState& peer = *s->peer;
  std::visit(
      [&](auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, wire::RegionAdd>) {
          if (peer.regions.size() >= opts_.max_peer_regions) {
            XLOG(WARN) << "peer " << s->peer_key << " advertised more than " << opts_.max_peer_regions
                       << " regions (EngineOptions::max_peer_regions); closing its session";
            s->Shutdown("too many regions");
          } else if (std::string why; !peer.regions.Add(m.region, &why)) {
            XLOG(WARN) << "peer " << s->peer_key << " sent a bad region (" << why << "); closing its session";
            s->Shutdown("bad region: " + why);
          }
        } else if constexpr (std::is_same_v<T, wire::RegionRemove>) {
          auto gone = peer.regions.Revoke(m.id);
          FenceBatches(&peer, ControlFenceDeadline());  // batches into the region that already started have finished
          if (gone) {
            ForgetInlineTargets(&peer, gone.get());
            gone->CloseAll();
          }
          s->SendSoon(wire::RegionRemoveAck{m.id, m.seq});
        } else if constexpr (std::is_same_v<T, wire::RegionRemoveAck> ||
                             std::is_same_v<T, wire::SyncAck>) {
          s->Acked(m.seq);
        } else if constexpr (std::is_same_v<T, wire::Notify>) {
          OnNotify(s, std::move(m));
        } else if constexpr (std::is_same_v<T, wire::NotifyAck>) {
          s->Acked(m.seq);
          Status queued;
          if (m.code != StatusCode::kOk) queued = {m.code, "peer " + s->peer_key + ": " + m.why};
          if (!s->Answer(m.seq, std::move(queued))) {
            XLOG(WARN) << "peer " << s->peer_key << " answered a notification never sent; closing";
            s->Shutdown("protocol error: unexpected notification answer");
          }
        } else if constexpr (std::is_same_v<T, wire::NotifyRingOffer>) {
          OnNotifyRingOffer(s, m);
        } else if constexpr (std::is_same_v<T, wire::Sync>) {
          s->SendSoon(wire::SyncAck{m.seq});
        } else if constexpr (std::is_same_v<T, wire::Goodbye>) {
          // Stop using the peer's memory, then say so: it may free that memory next.
          auto gone = DropPeerState(peer);
          FenceStreams(ControlFenceDeadline());
          for (auto& r : gone) r->CloseAll();
          // The answer goes now or not at all: a peer that does not read what we sent it must
          // not hold the control thread (it sees the session close instead, which also says
          // that we stopped).
          if (m.seq != 0) {
            s->SendSoon(wire::SyncAck{m.seq});
            if (s->Flush() != control::Session::Flushed::kAll) {
              XLOG(WARN) << "peer " << s->peer_key << " does not read its control connection; "
                         << "closing it without answering its goodbye";
            }
          }
          s->Shutdown("peer said goodbye: " + m.reason);
        } else if constexpr (std::is_same_v<T, wire::Hello>) {
          XLOG(WARN) << "peer " << s->peer_key << " sent a second hello; closing";
          s->Shutdown("protocol error: second hello");
        }
      },
      msg);
}

void EngineImpl::OnClosed(const std::shared_ptr<control::Session>& s, const std::string& reason) {
  regions_.Unsubscribe(s);
  if (s->peer) DropPeerState(*s->peer);
  inbox_->Retire(s);
  const bool was_peer = peers_.RemoveSession(s->peer_key, s);
  if (was_peer || s->established.load()) {
    XLOG(INFO) << "session with " << (s->peer_key.empty() ? s->remote_addr() : s->peer_key)
               << " ended: " << reason;
  }
}

}  // namespace xfer
