// PeerService on the control thread: a session's frames before and with its hello, then the
// peer's region updates, round trips and goodbye, and the session's end.
#include "core/peers/peer_service.h"
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

// A big hello's region table, made on the control loop's worker (Session::prepared).
struct PreparedTable final : control::SessionContext {
  PreparedTable(const wire::Hello& hello, size_t max_regions) : table(hello.regions, max_regions) {}
  RemoteRegions::Table table;
};

}  // namespace

std::shared_ptr<control::SessionContext> PeerService::Prepare(const wire::Hello& hello, size_t max_regions) {
  return std::make_shared<PreparedTable>(hello, max_regions);
}

void PeerService::OnHello(const std::shared_ptr<control::Session>& s, wire::Hello&& hello) {
  if (hello.name.empty() || hello.incarnation == 0) {
    LogBroken(std::string("hello from ") + s->remote_addr() + " without name or incarnation; closing");
    s->Shutdown("invalid hello");
    return;
  }
  auto prepared = std::dynamic_pointer_cast<PreparedTable>(s->prepared);
  if (!prepared) prepared = std::make_shared<PreparedTable>(hello, self_.options.max_peer_regions);
  RemoteRegions::Table& table = prepared->table;
  if (const std::string& why = table.why_bad(); !why.empty()) {
    LogBroken(std::string("hello from ") + s->remote_addr() + " has a bad region table (" + why +
              "); closing");
    (void)s->Send(wire::Goodbye{"bad region table: " + why});
    s->Shutdown("bad region table");
    return;
  }
  if (s->auth && (hello.name != s->auth->their_name() || hello.incarnation != s->auth->their_incarnation())) {
    auth_.Refuse(s, "authentication failed", "its hello names another engine than it authenticated as");
    return;
  }
  const std::string key = PeerKey(hello);
  if (IsAliveUnderAnotherIncarnation(key, hello.incarnation)) {
    auth_.Refuse(s, "name in use (its session is alive)",
                 "its hello as " + key + ", a new incarnation, while the session of that peer is alive");
    return;
  }
  Peer replaced;
  const std::shared_ptr<control::Session> vouched = SameEngineDialled(*s, key, hello);
  if (Status st = table_.BeginAccept(key, hello.name, hello.incarnation, net::HostOf(s->remote_addr()),
                                     vouched.get(), &replaced);
      !st.ok()) {
    if (st.code() == StatusCode::kResourceExhausted) {
      if (uint64_t more = 0; too_many_sessions_log_.Due(&more)) {
        XLOG(WARN) << "refused the hello of " << key << " from " << s->remote_addr() << ": " << st.message()
                   << log::Limit::More(more);
      }
      (void)s->Send(wire::Goodbye{st.message()});
      s->Shutdown("too many sessions");
      return;
    }
    if (st.code() == StatusCode::kInvalidArgument) {  // (an impostor, or a broken engine)
      auth_.Refuse(s, "incarnation in use", "its hello as " + key + ": " + st.message());
      return;
    }
    (void)s->Send(wire::Goodbye{"already connected to " + self_.name});
    s->Shutdown("duplicate connection from " + key);
    return;
  }
  if (replaced.session) {  // the peer restarted: forget everything about the old one
    FreeLater(Drop(*replaced.state));
    XLOG(WARN) << "peer " << key << " restarted (a new incarnation, from " << s->remote_addr()
               << ", while the old session was silent for heartbeat_timeout); dropping the old session";
    replaced.session->Shutdown("peer restarted");
  }
  std::string transport_error;
  auto state = MakePeerState(hello, std::move(table), false, net::HostOf(s->remote_addr()), s->fd(),
                             s->auth_key, &transport_error);
  if (!state->Reachable()) {
    XLOG(INFO) << "peer " << key
               << " connected; this engine cannot initiate transfers to it: " << transport_error;
  } else {
    XLOG(INFO) << "peer " << key << " connected (pid " << hello.pid << ", transport " << state->info.transport
               << ")";
  }
  // Known before the reply leaves, so the peer's Connect() never returns ahead of us.
  s->context = state;
  s->peer_key = key;
  s->established.store(true);
  if (state->stage) state->stage->Attach(s);  // (before a transfer can find the peer)
  table_.FinishAccept(key, Peer{s, state});
  metrics_->SessionOpened(key);
  if (!SendHelloAndSubscribe(s).ok()) s->Shutdown("cannot send hello");
  events_.up(s, state);  // (after the hello, which the peer reads first)
}

bool PeerService::IsAliveUnderAnotherIncarnation(const std::string& key, uint64_t incarnation) const {
  Peer old;
  if (!table_.Find(key, &old) || !old.session || old.state->info.incarnation == incarnation) return false;
  // Until the control loop declares it dead (silent for heartbeat_timeout): a peer's own
  // heartbeat interval is not ours, and its heartbeats may wait in this loop turn's events.
  return Clock::now() - old.session->last_rx.load() < self_.options.heartbeat_timeout;
}

void PeerService::LogBroken(const std::string& line) {
  if (uint64_t more = 0; broken_log_.Due(&more)) XLOG(WARN) << line << log::Limit::More(more);
}

std::shared_ptr<control::Session> PeerService::SameEngineDialled(const control::Session& s,
                                                                 const std::string& key,
                                                                 const wire::Hello& hello) const {
  Peer ours;
  if (!table_.DialledUnderAnotherKey(key, hello.name, hello.incarnation, &ours)) return nullptr;
  // With a secret, the hello's name and incarnation are those its proof bound (OnHello checked
  // them): a holder of the secret is taken at its word, as in every hello.
  if (s.auth) return ours.session;
  // Without one, a hello's name and incarnation are no proof (anyone may state them, and the
  // incarnation of a peer we dialled is in its hello to us and in the cluster metadata): the
  // session must come from where that engine is. On this host, from its process (seen to hold
  // our session to it); elsewhere, from the address our session reaches. (What this cannot
  // tell apart: another process at that address.)
  if (ours.state->on_this_host) {
    net::Fd pidfd;
    if (!host::VerifyConnectionOwner(s.fd(), ours.state->info.pid, &pidfd).ok()) return nullptr;
  } else if (ours.state->control_host.empty() || ours.state->control_host != net::HostOf(s.remote_addr())) {
    return nullptr;
  }
  return ours.session;
}

void PeerService::OnBeforeHello(const std::shared_ptr<control::Session>& s, wire::Message&& msg) {
  if (auth_.OnUnauthenticated(s, msg)) return;
  if (auto* hello = std::get_if<wire::Hello>(&msg)) return OnHello(s, std::move(*hello));
  LogBroken(std::string("control connection from ") + s->remote_addr() +
            " sent a frame before its hello; closing it");
  s->Shutdown("protocol error: no hello");
}

void PeerService::OnMessage(const std::shared_ptr<control::Session>& s, wire::Message& msg) {
  PeerState& peer = *PeerOf(*s);
  const uint32_t max_regions = self_.options.max_peer_regions;
  std::visit(
      [&](auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, wire::RegionAdd>) {
          if (peer.regions.size() >= max_regions) {
            LogBroken(std::string("peer ") + s->peer_key + " advertised more than " +
                      std::to_string(max_regions) +
                      " regions (EngineOptions::max_peer_regions); closing its session");
            s->Shutdown("too many regions");
          } else if (std::string why; !peer.regions.Add(m.region, &why)) {
            LogBroken(std::string("peer ") + s->peer_key + " sent a bad region (" + why +
                      "); closing its session");
            s->Shutdown("bad region: " + why);
          }
        } else if constexpr (std::is_same_v<T, wire::RegionRemove>) {
          // Batches into the region that already started have finished before the answer. (A
          // region it never had, or removed already, is in no batch: no fence, which would hold
          // the control thread for every frame of a stream of such removals.)
          if (auto gone = peer.regions.Revoke(m.id)) {
            events_.fence(&peer, gone.get(), self_.ControlFenceDeadline());
            gone->CloseAll();
          }
          s->SendSoon(wire::RegionRemoveAck{m.id, m.seq});
        } else if constexpr (std::is_same_v<T, wire::RegionRemoveAck> || std::is_same_v<T, wire::SyncAck>) {
          s->Acked(m.seq);
        } else if constexpr (std::is_same_v<T, wire::Sync>) {
          s->SendSoon(wire::SyncAck{m.seq});
        } else if constexpr (std::is_same_v<T, wire::Goodbye>) {
          // Stop using the peer's memory, then say so: it may free that memory next.
          auto gone = Drop(peer);
          events_.fence_streams(self_.ControlFenceDeadline(), true);
          for (auto& r : gone.regions) r->CloseAll();
          FreeLater(std::move(gone));
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
        }  // (A second hello never comes here: the session refuses it undecoded.)
      },
      msg);
}

void PeerService::OnClosed(const std::shared_ptr<control::Session>& s, const std::string& reason) {
  regions_.Unsubscribe(s);
  if (PeerState* peer = PeerOf(*s)) FreeLater(Drop(*peer));
  events_.closed(s);
  const bool was_peer = table_.RemoveSession(s->peer_key, s);
  if (was_peer || s->established.load()) {
    XLOG(INFO) << "session with " << (s->peer_key.empty() ? s->remote_addr() : s->peer_key)
               << " ended: " << reason;
  }
}

}  // namespace xfer
