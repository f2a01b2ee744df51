// TransferService: the data path. A request's descriptors are checked and planned (the
// planner), made a Request, and its batches run on the streams, on the caller's thread, or
// over a pipelined link; small copies go inline (InlineCopies). It keeps the asynchronous
// requests by handle, the prepared lists (prepared_transfers.cc), and the fences that order a
// deregistration or a peer's end with the batches in flight. It finds peers through the
// PeerService and checks local memory against the registry; it never sees a session.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/datapath/inline_copies.h"
#include "core/datapath/planner.h"
#include "core/datapath/prepared_lists.h"
#include "core/datapath/request.h"
#include "core/datapath/request_table.h"
#include "core/datapath/stream_pool.h"
#include "core/local_engine.h"
#include "core/metrics/metrics.h"
#include "core/peers/peer_service.h"
#include "core/regions/region_service.h"
#include "transport/common/buffer_pool.h"

namespace xfer {

class TransferService {
 public:
  using Clock = std::chrono::steady_clock;
  using Peer = PeerTable::Peer;

  // A request's notification, as the notifier sends it (EngineImpl wires it).
  struct Notifications {
    // kInvalidArgument when the message is longer than the options allow.
    std::function<Status(const char* what, const std::string& message)> check;
    // Sends message to peer once called, then calls the given function with the outcome.
    std::function<Request::Deliver(const Peer& peer, std::string message)> delivery;
  };

  TransferService(LocalEngine& self, PeerService& peers, RegionService& regions)
      : self_(self), peers_(peers), regions_(regions) {}

  // Initialize: the streams. staging: the buffer pool (null when staging is off), for its gauge.
  // checksums: how a request asks a peer for the checksums of its memory (Verifier::AskerFor).
  using Checksums = std::function<RequestChecks::Ask(const Peer& peer)>;
  void Start(std::shared_ptr<EngineMetrics> metrics, std::shared_ptr<transport::BufferPool> staging,
             Notifications notifications, Checksums checksums);
  // Finalize, once the sessions are closed: requests end (canceled), the streams run what is
  // queued and stop, the inline targets go (a caller's copy may hold a slot for up to the
  // heartbeat timeout).
  void Stop();
  // Finalize, last: the requests and prepared lists are forgotten.
  void Clear();

  // Engine API.
  Status TransferSync(const std::string& remote, Op op, const std::vector<TransferDesc>& descs,
                      std::chrono::milliseconds timeout, const TransferOptions& options,
                      RequestStatus* result);
  Status TransferAsync(const std::string& remote, Op op, const std::vector<TransferDesc>& descs,
                       std::chrono::milliseconds timeout, const TransferOptions& options,
                       RequestHandle* request);
  Status PrepareLocalList(const std::vector<MemRange>& ranges, ListHandle* list);
  Status PrepareRemoteList(const std::string& remote, const std::vector<MemRange>& ranges, ListHandle* list);
  Status ReleaseList(ListHandle list);
  Status TransferSync(Op op, const PreparedDescs& descs, std::chrono::milliseconds timeout,
                      const TransferOptions& options, RequestStatus* result);
  Status TransferAsync(Op op, const PreparedDescs& descs, std::chrono::milliseconds timeout,
                       const TransferOptions& options, RequestHandle* request);
  Status GetTransferStatus(RequestHandle request, RequestStatus* status);
  Status Wait(RequestHandle request, std::chrono::milliseconds timeout, RequestStatus* status);
  Status Cancel(RequestHandle request);

  // Returns once every batch to `peer` (all peers: null) that started before the call has
  // ended: those that streams and callers run, and those in flight on pipelined links. At the
  // deadline, batches that a peer stalls are interrupted (Link::Interrupt) and fail.
  // control_thread: the control thread calls it (a peer's region removal or goodbye), and
  // passes by the batches that wait for it (core/awaiting_control.h).
  void FenceBatches(PeerState* peer, Clock::time_point deadline, bool control_thread = false);
  // The part of it for the batches that streams and callers run.
  void FenceStreams(Clock::time_point deadline, bool control_thread = false);
  // The inline copies let go of a peer (and region): InlineCopies::Forget; OnTick: the
  // control thread's tick (InlineCopies::OnTick).
  void ForgetInlineTargets(const PeerState* peer, const RemoteRegion* region = nullptr) {
    inline_->Forget(peer, region);
  }
  void OnTick() { inline_->OnTick(); }
  void AddGauges(MetricsSnapshot* out) const;

 private:
  // An async request that is one copy of up to this many bytes runs on the caller: the copy
  // costs less than a hand-off to a stream.
  static constexpr uint64_t kAsyncInlineBytes = 64 << 10;

  // One small descriptor into a same-host peer's AllocMem memory (or this process's memory,
  // over local), of up to max_len bytes: a memcpy on this thread through the target its slot
  // remembers (InlineCopies::TryRemembered), with no request object. *eligible: the copy may
  // still go inline once the peer is looked up (Submit's try_inline).
  bool TryInline(const std::string& remote, Op op, const std::vector<TransferDesc>& descs,
                 std::chrono::milliseconds timeout, const TransferOptions& options, uint64_t max_len,
                 bool* eligible) {
    *eligible = false;
    return descs.size() == 1 && descs[0].len <= max_len && Plain(options) && inline_ &&
           inline_->TryRemembered(remote, op, descs[0], timeout, eligible);
  }
  // Whether a request checks its bytes end to end (TransferOptions::checksum, else the engine's).
  bool Checksummed(const TransferOptions& o) const { return o.checksum.value_or(self_.options.checksum); }
  // Whether a checksummed request over this plan can be checked (kUnsupported: why not).
  Status CanCheck(const Peer& peer, const Plan& plan) const;
  // A request that may go without a request object (no notification, no checksums).
  bool Plain(const TransferOptions& o) const { return !o.notify && !Checksummed(o); }
  // track: keep the request in requests_ under its handle (async requests; a sync one is
  // only ever seen by its caller). try_inline: the one descriptor may be copied inline once
  // the peer is looked up (the lookup then serves the request too): ok, and *out stays null.
  Status Submit(const std::string& remote, Op op, const std::vector<TransferDesc>& descs,
                std::chrono::milliseconds timeout, const TransferOptions& options, bool track,
                bool try_inline, std::shared_ptr<Request>* out);
  // Submit's end: a refusal logged and counted (returned; remote "": before the prepared
  // lists, and so the peer, were known), or the request made.
  Status Refused(Op op, const std::string& remote, const Status& s);
  Status NewRequest(Op op, Clock::time_point start, std::chrono::milliseconds timeout, const Peer& peer,
                    std::shared_ptr<const Plan> plan, const TransferOptions& options, bool track,
                    std::shared_ptr<Request>* out);
  // TransferSync's part once submitted (submitted: how that went) and TransferAsync's.
  Status RunSync(const Status& submitted, const std::shared_ptr<Request>& req,
                 std::chrono::milliseconds timeout, RequestStatus* result);
  void Start(const std::shared_ptr<Request>& req);
  void Dispatch(const std::shared_ptr<Request>& req, bool caller_helps);
  void HelpWith(Request& req, Clock::time_point until);
  // Starts every batch of a pipelined request on its link.
  void StartAll(const std::shared_ptr<Request>& req);

  // Prepared lists (prepared_transfers.cc). A request's two lists, looked up once for both of
  // the steps below (status: why not found).
  struct FoundLists {
    Status status;
    std::shared_ptr<const LocalList> local;
    std::shared_ptr<const RemoteList> remote;
  };
  FoundLists FindLists(const PreparedDescs& descs) const;
  Status SubmitPrepared(Op op, const PreparedDescs& descs, FoundLists found,
                        std::chrono::milliseconds timeout, const TransferOptions& options, bool track,
                        std::shared_ptr<Request>* out);
  // An inline copy of a prepared request of one pair of at most max_len bytes.
  bool TryInlinePrepared(Op op, const PreparedDescs& descs, const FoundLists& found,
                         std::chrono::milliseconds timeout, uint64_t max_len);
  // The local list with handle h, checked again first when a region was registered or
  // deregistered since it was checked.
  std::shared_ptr<const LocalList> CurrentLocal(ListHandle h, std::shared_ptr<const LocalList> list);

  LocalEngine& self_;
  PeerService& peers_;
  RegionService& regions_;
  Notifications notifications_;
  Checksums checksums_;
  std::shared_ptr<EngineMetrics> metrics_;
  std::shared_ptr<transport::BufferPool> staging_;  // null when EngineOptions::staging is off
  std::unique_ptr<StreamPool> pool_;
  std::unique_ptr<InlineCopies> inline_;  // from Start on (null before Initialize)
  RequestTable requests_;
  ListTable lists_;
};

}  // namespace xfer
