// The initiator side of the ucx transport: a link to one peer, `links` endpoints (each on a
// worker of its own: a queue pair / rail each).
//
// Batches are started without waiting (Start), so one thread keeps many in flight: a WRITE
// ends with a flush, a round trip, and the next batches' puts fill the wire meanwhile. Each
// endpoint has one leader at a time, the thread that makes every UCX call on its worker for
// all the batches there: it posts what was started and progresses until what it waits for is
// over (Drive), then the lead goes to whichever thread needs it next; threads waiting for
// batches on an endpoint that another leads sleep (on two cores a third spinning thread,
// beside the leader and the target's, slows everyone). A thread that only starts a batch leads
// for a round (a few, for batches other threads start meanwhile) if nobody leads; if then
// nobody drives for a while, the transport's progress thread does (Rescue). A peer error (UCX's peer error
// handling) fails the batches on that endpoint with kConnectionLost; the next batch rebuilds the endpoint.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "transport/ucx/ucx_common.h"
#include "transport/ucx/ucx_transport.h"

namespace xfer::transport::ucx {

struct Flight;
struct Conn;

class UcxLink final : public Link, public std::enable_shared_from_this<UcxLink> {
 public:
  // nudge: wakes the transport's progress thread (see Rescue); called when batches appear.
  UcxLink(std::shared_ptr<Context> ctx, UcxPeer peer, int links, std::function<void()> nudge = {});
  ~UcxLink() override;  // batches still in flight end with kConnectionLost

  bool pipelined() const override { return true; }
  Status Execute(Op op, std::span<const Slice> batch, Clock::time_point deadline) override;
  void Start(Op op, std::span<const Slice> batch, Clock::time_point deadline, Done done,
             std::function<Status()> ready = {}) override;
  void Drive(Clock::time_point until, const std::function<bool()>& finished) override;
  uint64_t QuiesceMark() override;
  void Quiesce(uint64_t mark, Clock::time_point deadline) override;
  // Link::Interrupt: batches that the peer stalls end as a late Quiesce ends them.
  void Interrupt(Clock::time_point since, bool control_thread) override;
  void Shutdown() override;

  // For the transport's progress thread, every few milliseconds while batches are in flight:
  // leads for about `budget` the endpoints with batches that nobody drove since the last call,
  // so that batches started by a caller that never drives still end. True while batches are
  // in flight.
  bool Rescue(std::chrono::microseconds budget);

 private:
  Status Gone() const;
  Status NotStarted() const;
  Status Interrupted() const;
  // kRound: one round (Start; leaving the lead); kDrive: a thread in Drive; kRescue: the
  // transport's progress thread.
  enum class LeadMode { kRound, kDrive, kRescue };
  void Lead(std::vector<Conn*>& mine, Clock::time_point until, const std::function<bool()>& finished,
            LeadMode mode);
  void Adopt(std::vector<Conn*>* mine, size_t limit);
  size_t Share() const;
  bool KeepShare(std::vector<Conn*>* mine);
  // What one round of Lead knows when it looks at an endpoint's flights.
  struct Sweep {
    bool clock;  // this round read the clock: deadlines are checked
    Clock::time_point now;
    bool shut;                 // the link is shut down
    bool may_drain;            // a late endpoint waits for what was posted before it closes
    uint64_t interrupt_below;  // flights of a smaller commit are interrupted (Quiesce)
  };
  // *interrupting: a flight of an endpoint that goes was interrupted (Interrupt, Quiesce).
  void SweepFlights(Conn& c, const Sweep& sweep, std::vector<std::pair<Conn*, Flight*>>* fresh,
                    std::vector<Conn*>* expired, std::vector<std::unique_ptr<Flight>>* over,
                    bool* interrupting);
  void LeaveLead(std::vector<Conn*>& mine, bool driver);
  void Sleep(const std::vector<Conn*>& mine);
  void Count();
  void End(Conn& c, Flight& f, Status result);
  void Post(Conn& c, Flight& f);
  void EndPosted(std::span<Conn* const> cs, std::chrono::milliseconds drain);
  Status Connect(Conn& c);
  Status Unpack(Conn& c, const UcxRemoteKey& key, ucp_rkey_h* out);
  void Teardown(std::span<Conn* const> cs, std::chrono::milliseconds drain);
  void Close(Conn& c, void* flush);

  const std::shared_ptr<Context> ctx_;
  const UcxPeer peer_;
  const std::function<void()> nudge_;
  std::vector<std::unique_ptr<Conn>> conns_;
  std::atomic<uint32_t> rr_{0};
  std::atomic<bool> shut_{false};

  std::mutex mu_;               // every Conn's lead and flights, drivers_ and commits_
  std::condition_variable cv_;  // batches ended, or a lead is free
  int drivers_ = 0;             // threads in Drive
  uint64_t commits_ = 0;        // batches taken to be posted so far
  // Read without mu_ (by `finished` predicates), written under it.
  std::atomic<uint64_t> oldest_commit_{1};  // Flight::commit of the oldest not over (commits_ + 1: none)
  // Flights committed below it end (a Quiesce past its deadline); it only grows, without mu_.
  std::atomic<uint64_t> interrupt_below_{0};
  std::atomic<size_t> in_flight_{0};  // batches started and not yet ended
  std::atomic<int> waiting_{0};       // threads in Drive waiting for a lead
};

}  // namespace xfer::transport::ucx
