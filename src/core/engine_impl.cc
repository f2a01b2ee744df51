#include "core/engine_impl.h"

#include <cstdlib>

#include "util/host.h"
#include "util/log.h"

namespace xfer {

Status EngineImpl::Initialize(const std::string& local_name, const EngineOptions& options,
                              const OptionsCheck& check) {
  if (self_.running.load()) return {StatusCode::kInvalidArgument, "Initialize: already initialized"};
  if (finalized_) {
    return {StatusCode::kInvalidArgument, "Initialize: this engine was finalized; create a new one"};
  }
  if (Status s = check(options); !s.ok()) return {s.code(), "Initialize: " + s.message()};
  net::Address addr;
  Status s = net::ParseAddress(local_name, &addr);
  if (!s.ok()) {
    XLOG(WARN) << "Initialize: " << s.ToString();
    return s;
  }
  self_.options = options;
  s = peers_.LoadSecret(&self_.options);
  if (!s.ok()) {
    XLOG(WARN) << "Initialize: " << s.ToString();
    return {s.code(), "Initialize: " + s.message()};
  }
  net::Fd listener;
  if (addr.has_port) {
    net::Address bound;
    s = net::Listen(addr, &listener, &bound);
    if (!s.ok()) {
      XLOG(WARN) << "Initialize: cannot listen on " << local_name << ": " << s.message();
      return s;
    }
    addr = bound;
  }
  self_.name = addr.ToString();
  self_.incarnation = host::RandomU64();
  self_.host_id = options.host_id.empty() ? host::BootId() : options.host_id;
  if (const char* k = std::getenv("XFER_TEST_CORRUPT_LANDED"); k != nullptr && *k != '\0') {
    char* end = nullptr;  // (LocalEngine::corrupt_landed: a descriptor's index, else ignored)
    const long long v = std::strtoll(k, &end, 10);
    if (*end == '\0' && v >= 0) {
      self_.corrupt_landed = v;
      XLOG(WARN) << "XFER_TEST_CORRUPT_LANDED=" << v << ": this engine corrupts checksummed requests' data";
    } else {
      XLOG(WARN) << "XFER_TEST_CORRUPT_LANDED='" << k << "' is not a descriptor's index: ignored";
    }
  }
  if (const char* t = std::getenv("XFER_TEST_STAGE_TAG"); t != nullptr && *t != '\0') {
    self_.stage_tag = t;
    XLOG(WARN) << "XFER_TEST_STAGE_TAG=" << t << ": this engine stages its regions of that tag as GPU memory";
  }
  metrics_ = std::make_shared<EngineMetrics>(self_.options.metrics_max_peers, transport::BackendNames());
  notifier_.Start(metrics_);  // (first: GetMetrics and GetNotifies read it even after a failed start)
  if (s = StartBackends(addr.host); !s.ok()) return {s.code(), "Initialize: " + s.message()};
  StartServices();
  if (s = peers_.StartNames(addr.has_port); !s.ok()) {
    XLOG(WARN) << "Initialize: " << s.ToString();
    return {s.code(), "Initialize: " + s.message()};
  }
  if (s = StartMetricsServer(); !s.ok()) {
    peers_.StopNames();
    XLOG(WARN) << "Initialize: " << s.ToString();
    return {s.code(), "Initialize: " + s.message()};
  }
  if (s = peers_.StartLoop(std::move(listener), this); !s.ok()) {
    peers_.StopNames();
    metrics_server_.reset();
    return s;
  }
  self_.running.store(true);
  const EngineOptions& o = self_.options;
  if (!peers_.authenticates() && addr.has_port && !net::IsLoopback(addr.host)) {
    XLOG(WARN) << "engine " << self_.name << " listens beyond loopback without a secret: any process "
               << "that reaches the port can read and write its registered memory (set "
               << "EngineOptions::secret or secret_file; docs/security.md)";
  }
  XLOG(INFO) << "engine " << self_.name << " up (incarnation " << std::hex << self_.incarnation << std::dec
             << ", " << o.streams << " streams; " << (peers_.authenticates() ? "peers authenticated; " : "")
             << backends_.Summary() << "; staging " << StagingName(o.staging) << ")";
  return Status::Ok();
}

Status EngineImpl::StartBackends(const std::string& listen_host) {
  transport::EngineContext ctx;
  ctx.incarnation = self_.incarnation;
  ctx.listen_host = listen_host;
  ctx.options = &self_.options;
  ctx.forced = self_.options.transport;
  ctx.region_access = [this](uint64_t a, uint64_t l, bool w) { return regions_.Access(a, l, w); };
  ctx.is_peer = [this](uint64_t inc) { return peers_.HasLive(inc); };
  ctx.authenticate = peers_.authenticates();
  ctx.peer_auth_keys = [this](uint64_t inc) { return peers_.AuthKeysOf(inc); };
  ctx.staging_bytes = self_.options.staging != Staging::kOff ? self_.options.staging_buffer_bytes : 0;
  return backends_.Start(ctx);
}

void EngineImpl::StartServices() {
  const EngineOptions& o = self_.options;
  std::shared_ptr<transport::BufferPool> staging;  // (the routes' staged links go through it)
  if (o.staging != Staging::kOff) {
    staging = std::make_shared<transport::BufferPool>(o.staging_buffers, o.staging_buffer_bytes);
  }
  peers_.Begin(
      metrics_, staging,
      PeerService::Events{
          .made = [this](const auto& peer) { notifier_.PeerMade(peer); },
          .up = [this](const auto& s, const auto& peer) { notifier_.PeerUp(s, peer); },
          .gone =
              [this](PeerState& peer) {
                notifier_.PeerGone(peer);
                transfers_.ForgetInlineTargets(&peer);
              },
          .closed =
              [this](const auto& s) {
                notifier_.SessionClosed(s);
                verifier_.SessionClosed(s);
                stager_.SessionClosed(s.get());
                if (PeerState* peer = PeerOf(*s); peer && peer->stage) peer->stage->Close();
              },
          .fence =
              [this](PeerState* peer, const RemoteRegion* revoked, LocalEngine::Clock::time_point deadline) {
                transfers_.FenceBatches(peer, deadline, /*control_thread=*/true);
                if (revoked != nullptr) transfers_.ForgetInlineTargets(peer, revoked);
              },
          .fence_streams = [this](LocalEngine::Clock::time_point deadline,
                                  bool control_thread) { transfers_.FenceStreams(deadline, control_thread); },
      });
  regions_.Start(
      &backends_, &peers_.self_state().regions,
      RegionService::Hooks{
          .fence =
              [this](LocalEngine::Clock::time_point deadline) {
                transfers_.FenceBatches(nullptr, deadline);  // our own transfers from or into the region
                transfers_.ForgetInlineTargets(&peers_.self_state());
                backends_.Fence(deadline);  // and peers' batches that our backends' threads execute
                verifier_.Fence(deadline);  // and the checksums peers asked for
                stager_.Fence(deadline);    // and the copies through our staging slots
              },
          .tags_changed = [this] { peers_.TagsChanged(); },
      });
  verifier_.Start();
  stager_.Start(
      [this](const RegionInfo& info, std::unique_ptr<RegionResources>* res, transport::Blobs* blobs) {
        *res = std::make_unique<RegionResources>();
        return backends_.PrepareRegion(info, res->get(), blobs);
      });
  transfers_.Start(
      metrics_, staging,
      TransferService::Notifications{
          .check = [this](const char* what, const std::string& m) { return notifier_.CheckMessage(what, m); },
          .delivery = [this](const PeerService::Peer& peer,
                             std::string m) { return notifier_.Delivery(peer, std::move(m)); },
      },
      [this](const PeerService::Peer& peer) { return verifier_.AskerFor(peer); });
}

Status EngineImpl::StartMetricsServer() {
  if (self_.options.metrics_listen.empty()) return Status::Ok();
  Status s = MetricsServer::Start(
      self_.options.metrics_listen,
      [this] {
        MetricsSnapshot snapshot;  // (until the engine runs: "", which answers 503)
        if (!self_.running.load() || !GetMetrics(&snapshot).ok()) return std::string();
        return snapshot.PrometheusText();
      },
      &metrics_server_);
  if (s.ok()) metrics_address_ = metrics_server_->address();
  return s;
}

void EngineImpl::Finalize() {
  if (!self_.running.exchange(false)) return;
  finalized_ = true;
  metrics_server_.reset();  // (first: it reads what the rest of Finalize takes down)
  // Peers stop using our memory before Finalize returns (the application may free it next).
  peers_.Stop();
  notifier_.Close();  // (what is queued stays readable)
  verifier_.Stop();
  transfers_.Stop();
  backends_.StopServing();
  stager_.Stop();  // (no peer uses its slots any more)
  transfers_.Clear();
  regions_.ReleaseAll();  // peers were told goodbye: none uses the memory any more
  backends_.Clear();      // (UCX goes after the mappings of our regions)
}

Status EngineImpl::GetMetrics(MetricsSnapshot* out) const {
  if (out == nullptr) return {StatusCode::kInvalidArgument, "GetMetrics: null output"};
  if (!metrics_) return {StatusCode::kInvalidArgument, "GetMetrics: engine is not initialized"};
  out->metrics.clear();
  metrics_->Snapshot(out);
  regions_.AddGauges(out);
  peers_.AddGauges(out);
  notifier_.AddGauges(out);
  transfers_.AddGauges(out);
  return Status::Ok();
}

void EngineImpl::OnMessage(const std::shared_ptr<control::Session>& s, wire::Message&& msg) {
  if (!s->established.load()) return peers_.OnBeforeHello(s, std::move(msg));
  if (auto* m = std::get_if<wire::Notify>(&msg)) return notifier_.OnNotify(s, std::move(*m));
  if (auto* m = std::get_if<wire::NotifyBegin>(&msg)) return notifier_.OnNotifyBegin(s, std::move(*m));
  if (auto* m = std::get_if<wire::NotifyEnded>(&msg)) return notifier_.OnNotifyEnded(s, std::move(*m));
  if (auto* m = std::get_if<wire::NotifyAck>(&msg)) return notifier_.OnAnswer(s, *m);
  if (auto* m = std::get_if<wire::NotifyRingOffer>(&msg)) return notifier_.OnRingOffer(s, *m);
  if (auto* m = std::get_if<wire::Digest>(&msg)) return verifier_.OnDigest(s, std::move(*m));
  if (auto* m = std::get_if<wire::DigestAnswer>(&msg)) return verifier_.OnDigestAnswer(s, std::move(*m));
  if (auto* m = std::get_if<wire::DigestCancel>(&msg)) return verifier_.OnDigestCancel(s, *m);
  if (auto* m = std::get_if<wire::StageOpen>(&msg)) return stager_.OnOpen(s, *m);
  if (auto* m = std::get_if<wire::StageMove>(&msg)) return stager_.OnMove(s, std::move(*m));
  if (std::holds_alternative<wire::StageOpened>(msg) || std::holds_alternative<wire::StageMoved>(msg)) {
    return OnStageAnswer(s, std::move(msg));
  }
  peers_.OnMessage(s, msg);
}

void EngineImpl::OnStageAnswer(const std::shared_ptr<control::Session>& s, wire::Message&& msg) {
  PeerState* peer = PeerOf(*s);
  StageChannel* channel = peer ? peer->stage.get() : nullptr;
  bool expected = false;
  if (auto* m = std::get_if<wire::StageOpened>(&msg)) expected = channel && channel->OnOpened(std::move(*m));
  if (auto* m = std::get_if<wire::StageMoved>(&msg)) expected = channel && channel->OnMoved(*m);
  if (expected) return;
  XLOG(WARN) << "peer " << s->peer_key << " answered a staging ask never made; closing";
  s->Shutdown("protocol error: unexpected staging answer");
}

std::shared_ptr<control::SessionContext> EngineImpl::Prepare(const wire::Message& hello) {
  const auto* h = std::get_if<wire::Hello>(&hello);
  return h ? PeerService::Prepare(*h, self_.options.max_peer_regions) : nullptr;
}

void EngineImpl::OnClosed(const std::shared_ptr<control::Session>& s, const std::string& reason) {
  peers_.OnClosed(s, reason);
}

void EngineImpl::OnTick() {
  transfers_.OnTick();  // inline targets forgotten while their slot was busy
  verifier_.OnTick();   // checksums asked for past their requests' deadlines
}

}  // namespace xfer
