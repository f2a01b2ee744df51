// PeerService, outbound: Connect and its steps; and what both sides make of a hello (ours,
// and the peer state from theirs).
#include <unistd.h>

#include "core/peers/peer_service.h"
#include "core/stage/bounce_route.h"
#include "util/checksum.h"
#include "util/host.h"
#include "util/log.h"
#include "util/process_check.h"

namespace xfer {

wire::Hello PeerService::MakeHello(const std::vector<wire::WireRegion>& regions) const {
  wire::Hello h;
  h.name = self_.name;
  h.incarnation = self_.incarnation;
  h.host_id = self_.host_id;
  h.pid = static_cast<int32_t>(::getpid());
  if (self_.options.notify.outcomes) h.features |= wire::kFeatureNotifyOutcomes;
  if (checksum::Available()) h.features |= wire::kFeatureDigests | wire::kFeatureGpuDigests;
  h.features |= wire::kFeatureRingEnds | wire::kFeatureDigestCancel;
  if (self_.options.staging != Staging::kOff) h.features |= wire::kFeatureTargetStaging;
  if (self_.options.staging == Staging::kAlways) h.features |= wire::kFeatureStagesAll;
  h.backends = backends_.HelloBlobs();
  h.regions = regions;
  return h;
}

Status PeerService::SendHelloAndSubscribe(const std::shared_ptr<control::Session>& s) {
  return regions_.SendHelloAndSubscribe(s, [this](const auto& r) { return MakeHello(r); });
}

std::shared_ptr<PeerState> PeerService::MakePeerState(const wire::Hello& hello, RemoteRegions::Table&& table,
                                                      bool outbound, const std::string& host, int control_fd,
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
  st->notify_outcomes = hello.features & wire::kFeatureNotifyOutcomes;
  st->answers_digests = hello.features & wire::kFeatureDigests;
  st->sums_gpu_digests = hello.features & wire::kFeatureGpuDigests;
  st->ring_ends = hello.features & wire::kFeatureRingEnds;
  st->cancels_digests = hello.features & wire::kFeatureDigestCancel;
  if (self_.options.metrics) {  // (counted under the peer's name)
    st->metrics = metrics_;
    st->metrics_slot = metrics_->SlotOf(st->info.name);
  }
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
  peer.same_host = hello.host_id == self_.host_id;
  if (peer.same_host && control_fd >= 0) {
    if (Status v = host::VerifyConnectionOwner(control_fd, hello.pid, &pidfd); !v.ok()) {
      XLOG(WARN) << "peer " << hello.name << " says it is pid " << hello.pid
                 << " on this host, which does not check out (" << v.message()
                 << "): no same-host transport is used for it";
      peer.same_host = false;
    }
  }
  if (control_fd >= 0) st->control_host = net::HostOf(net::PeerOf(control_fd));
  peer.same_process = peer.same_host && hello.pid == ::getpid();
  peer.pidfd = pidfd.get();
  const bool itself = hello.incarnation == self_.incarnation;
  if (pidfd.valid() && !itself) {
    st->on_this_host = true;
    if (!shared_memory::PeerMapper::Open(hello.pid, pidfd.get(), &st->mapper).ok()) st->mapper.reset();
  }
  // (The routes live in the peer's state, which outlives them.)
  peer.find_region = [st = st.get()](uint64_t a, uint64_t l, bool w) {
    std::shared_ptr<RemoteRegion> r = st->regions.Find(a, l, w);
    return r || !st->stage ? r : st->stage->SlotsRegion(a, l);  // (the peer's staging slots)
  };
  st->routes.routes = backends_.Connect(peer, hello.backends, itself, transport_error);
  if ((hello.features & wire::kFeatureTargetStaging) && !itself) AddBounceRoutes(*st, hello.features);
  st->routes.staging = staging_ != nullptr;
  st->routes.stage_all = self_.options.staging == Staging::kAlways;
  st->routes.staging_bytes = self_.options.staging_buffer_bytes;
  for (const auto& r : st->routes.routes) {
    auto& staged = st->routes.staged_links.emplace_back();
    if (!staging_ || !r->Stageable()) continue;
    staged[0] = std::make_shared<transport::StagedLink>(staging_, r->shared_link(), false);
    staged[1] = std::make_shared<transport::StagedLink>(staging_, r->shared_link(), true);
  }
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
  st->regions.Adopt(std::move(table));
  if (!itself) events_.made(st);
  return st;
}

void PeerService::AddBounceRoutes(PeerState& st, uint32_t features) {
  auto& routes = st.routes.routes;
  for (size_t i = 0; i < routes.size(); ++i) {
    if (!routes[i]->OneSided()) continue;
    if (!st.stage) st.stage = std::make_shared<StageChannel>();
    // (Ahead of it: with kFeatureStagesAll, the peer's memory goes through its slots.)
    auto bounce = std::make_shared<BounceRoute>(routes[i], st.stage, features & wire::kFeatureStagesAll);
    routes.insert(routes.begin() + static_cast<std::ptrdiff_t>(i), std::move(bounce));
    ++i;
  }
}

Status PeerService::Connect(const std::string& remote, std::chrono::milliseconds timeout) {
  Status s = self_.CheckRunning("Connect");
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
  if (remote == self_.name) return Status::Ok();  // this engine is always reachable by itself
  const auto deadline = DeadlineAfter(timeout);
  if (s = table_.Claim(remote, deadline); !s.ok()) {
    if (s.code() == StatusCode::kResourceExhausted) {
      s = {s.code(), "Connect to '" + remote + "': " + s.message()};
      XLOG(WARN) << s.message();
    }
    return s;
  }
  std::shared_ptr<control::Session> session;
  struct Settle {  // (whatever happens below, Finalize is not left waiting for this Connect)
    SessionsOpening* opening;
    std::shared_ptr<control::Session>* session;
    ~Settle() {
      if (*session) opening->End(*session);
    }
  } settle{&opening_, &session};
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
  if (session) opening_.End(session);  // (before the wait below)
  if (crossed) return table_.AwaitCrossed(remote, deadline);
  if (!s.ok()) XLOG(WARN) << "Connect to '" << remote << "' failed: " << s.ToString();
  return s;
}

Status PeerService::ConnectByName(const std::string& name, std::chrono::milliseconds timeout) {
  // (The lookup takes up to a second per metadata endpoint; Connect gets what is left of timeout.)
  const auto deadline = DeadlineAfter(timeout);
  ClusterPeer entry;
  if (Status s = names_.Resolve(name, &entry); !s.ok()) {
    XLOG(WARN) << s.message();
    return s;
  }
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) {
    return {StatusCode::kTimeout,
            "Connect: looking '" + name + "' up in the cluster metadata took the whole timeout"};
  }
  Status s = Connect(entry.address, left);
  if (!s.ok() && s.code() != StatusCode::kAlreadyConnected) return s;
  // The name goes to the address only when the engine there is the entry's (its incarnation):
  // a rogue or stale entry naming another engine, this one, or a dead address leaves the name
  // where it was. (ALREADY_CONNECTED while another Connect to it is still under way finds no
  // session yet: the name is not taken this time; a retry takes it.)
  Peer peer;
  if (!Lookup(entry.address, &peer) || peer.state->info.incarnation != entry.incarnation) {
    if (s.ok()) {
      s = {StatusCode::kRemoteAccessDenied,
           "Connect: the cluster metadata entry of '" + name + "' names " + entry.address +
               ", where another engine answers (not the entry's incarnation): "
               "the name is not taken"};
      XLOG(WARN) << s.message();
    }
    return s;
  }
  names_.Remember(name, entry.address);
  return s;
}

void PeerService::AbandonConnect(const std::shared_ptr<control::Session>& session, const std::string& remote,
                                 const std::string& why) {
  if (session) {
    (void)session->Send(wire::Goodbye{why});  // (what the socket takes at once: it closes next)
    regions_.Unsubscribe(session);
    session->Close();
  }
  table_.Unclaim(remote);
}

Status PeerService::OpenSession(const net::Address& addr, const std::string& remote,
                                Clock::time_point deadline, std::shared_ptr<control::Session>* session,
                                wire::Message* reply) {
  net::Fd fd;
  Status s = net::ConnectTcp(addr, deadline, &fd, &self_.running);  // (Finalize: given up at once)
  if (!s.ok()) return s;
  *session = std::make_shared<control::Session>(std::move(fd), true, addr.ToString());
  (*session)->set_max_queued(self_.options.max_unsent_bytes);
  if (s = opening_.Begin(*session); !s.ok()) {
    session->reset();
    return {s.code(), "Connect: " + s.message()};
  }
  if (auth_.on()) {  // nothing about this engine leaves before the peer proved itself
    if (s = auth_.Outbound(**session, remote, deadline); !s.ok()) return s;
  }
  s = SendHelloAndSubscribe(*session);
  if (s.ok()) s = (*session)->FlushUntil(deadline);  // (the control loop does not watch it yet)
  if (!s.ok()) return s;
  s = (*session)->ReadOne(deadline, reply);
  if (!s.ok()) return {s.code(), "no hello from '" + remote + "': " + s.message()};
  return Status::Ok();
}

Status PeerService::InstallOutbound(const std::shared_ptr<control::Session>& session,
                                    const std::string& remote, const wire::Hello& hello,
                                    const std::string& host) {
  RemoteRegions::Table table(hello.regions, self_.options.max_peer_regions);
  if (!table.why_bad().empty()) {
    return {StatusCode::kConnectionLost, "'" + remote + "' sent a bad region table: " + table.why_bad()};
  }
  if (session->auth && (hello.name != session->auth->their_name() ||
                        hello.incarnation != session->auth->their_incarnation())) {
    return {StatusCode::kRemoteAccessDenied,
            "'" + remote + "' sent a hello for another engine than it authenticated as"};
  }
  std::string transport_error;
  auto state =
      MakePeerState(hello, std::move(table), true, host, session->fd(), session->auth_key, &transport_error);
  if (!state->Reachable()) return {StatusCode::kUnsupported, transport_error};
  session->context = state;
  session->peer_key = remote;
  session->established.store(true);
  if (state->stage) state->stage->Attach(session);  // (before a transfer can find the peer)
  events_.up(session, state);                       // (before any notification can be sent on the session)
  if (!table_.InstallClaimed(remote, Peer{session, state})) {
    session->Close();  // a crossing session from the peer got in first: it stays
    regions_.Unsubscribe(session);
    return Status::Ok();
  }
  loop_->Add(session);
  metrics_->SessionOpened(remote);
  XLOG(INFO) << "connected to " << remote << " (pid " << hello.pid << ", transport " << state->info.transport
             << ", " << hello.regions.size() << " regions)";
  return Status::Ok();
}

}  // namespace xfer
