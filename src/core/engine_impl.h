// EngineImpl: the engine behind the public facade (src/api/engine.cc), and wiring only. It
// owns the backends and the services, starts and stops them in order, tells each service of
// the others' events, and routes each control frame to the service that owns it:
//
//   peers/     PeerService      hellos, sessions, authentication, cluster names, the peer table
//   regions/   RegionService    our registered regions and their fences
//   datapath/  TransferService  plan, requests, streams, inline copies, prepared lists
//   notify/    Notifier         sending, the queue, same-host rings
//   verify/    Verifier         end-to-end checksums: asking peers, answering them
//   metrics/   EngineMetrics    counters, histograms, /metrics
//
// Dependencies run one way: peers -> regions; datapath -> peers, regions; notify, verify ->
// peers, regions;
// this file -> all (tests/tools/core_layers.sh holds them).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "control/control_loop.h"
#include "core/datapath/transfer_service.h"
#include "core/local_engine.h"
#include "core/metrics/metrics.h"
#include "core/metrics/metrics_server.h"
#include "core/notify/notifier.h"
#include "core/peers/peer_service.h"
#include "core/regions/region_service.h"
#include "core/stage/stage_server.h"
#include "core/verify/verifier.h"
#include "transport/backend_set.h"
#include "xfer/engine.h"

namespace xfer {

class EngineImpl final : public control::ControlHandler {
 public:
  EngineImpl() = default;
  ~EngineImpl() override { Finalize(); }

  // check: refuses options out of their ranges (the API's options table); called once the
  // engine is known to be new.
  using OptionsCheck = std::function<Status(const EngineOptions&)>;
  Status Initialize(const std::string& local_name, const EngineOptions& options, const OptionsCheck& check);
  void Finalize();
  std::string LocalName() const { return self_.name; }

  PeerService& peers() { return peers_; }
  RegionService& regions() { return regions_; }
  TransferService& transfers() { return transfers_; }
  Notifier& notifier() { return notifier_; }
  Status GetMetrics(MetricsSnapshot* out) const;
  std::string MetricsAddress() const { return metrics_address_; }

  // control::ControlHandler (control thread)
  void OnMessage(const std::shared_ptr<control::Session>& s, wire::Message&& msg) override;
  // A peer's answer to our staging asks (its StageOpened or StageMoved).
  void OnStageAnswer(const std::shared_ptr<control::Session>& s, wire::Message&& msg);
  std::shared_ptr<control::SessionContext> Prepare(const wire::Message& hello) override;
  void OnClosed(const std::shared_ptr<control::Session>& s, const std::string& reason) override;
  void OnTick() override;

 private:
  // Initialize's steps: the backends (listen_host: where they listen, if they do); what the
  // services tell each other; the /metrics server (at EngineOptions::metrics_listen, if set).
  Status StartBackends(const std::string& listen_host);
  void StartServices();
  Status StartMetricsServer();

  LocalEngine self_;
  bool finalized_ = false;  // an engine is initialized at most once
  BackendSet backends_;
  RegionService regions_{self_};
  PeerService peers_{self_, backends_, regions_};
  TransferService transfers_{self_, peers_, regions_};
  Notifier notifier_{self_, peers_};
  Verifier verifier_{self_, regions_};
  StageServer stager_{self_, regions_};     // our staging slots, lent to peers' one-sided routes
  std::shared_ptr<EngineMetrics> metrics_;  // from Initialize on
  std::string metrics_address_;             // where metrics_server_ serves (set by Initialize)
  // Last, so that it stops first: it reads the services while it serves.
  std::unique_ptr<MetricsServer> metrics_server_;
};

}  // namespace xfer
