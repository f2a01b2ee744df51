// A route through the target's staging slots (stage_server.h): for memory of the peer's that
// a one-sided route cannot reach itself (GPU memory that the peer's UCX does not register;
// with the peer's staging = always, all its memory). Each batch takes one of the peer's
// slots: WRITE puts the bytes into the slot over the one-sided route, then asks the peer to
// copy them out; READ asks the peer to fill the slot, then gets it. Batches of several
// streams take several slots, so one is copied while another is on the wire.
#pragma once

#include <memory>

#include "core/stage/stage_channel.h"
#include "transport/backend.h"

namespace xfer {

class BounceLink final : public transport::Link {
 public:
  BounceLink(std::shared_ptr<StageChannel> channel, std::shared_ptr<transport::Link> inner)
      : channel_(std::move(channel)), inner_(std::move(inner)) {}
  Status Execute(Op op, std::span<const transport::Slice> batch,
                 transport::Clock::time_point deadline) override {
    return Run(op, batch, deadline, nullptr);
  }
  // Each slot's worth goes into the slot (or out of it) piece by piece, the hook told in
  // between; the peer copies the slot in one move.
  Status ExecutePieces(Op op, std::span<const transport::Slice> batch, transport::Clock::time_point deadline,
                       transport::PieceHook& hook) override {
    return Run(op, batch, deadline, &hook);
  }
  void Shutdown() override { inner_->Shutdown(); }
  // (The batches waiting for the peer's answers give up too: StageChannel::Interrupt.)
  void Interrupt(transport::Clock::time_point since, bool control_thread) override {
    inner_->Interrupt(since, control_thread);
    channel_->Interrupt(since, control_thread);
  }

 private:
  Status Run(Op op, std::span<const transport::Slice> batch, transport::Clock::time_point deadline,
             transport::PieceHook* hook);
  // One slot's worth of the batch (what fits from slice `first`, offset `done` into it on;
  // *moved: the batch's bytes before it, then after it).
  Status Chunk(Op op, std::span<const transport::Slice> batch, size_t* first, uint64_t* done, uint64_t* moved,
               transport::PieceHook* hook, transport::Clock::time_point deadline);
  // Between our memory and the slot: at once, or piece by piece with a hook (moved: as Chunk's).
  Status Across(Op op, std::span<const transport::Slice> to_slot, uint64_t moved, transport::PieceHook* hook,
                transport::Clock::time_point deadline);
  const std::shared_ptr<StageChannel> channel_;
  const std::shared_ptr<transport::Link> inner_;
};

// The route, named after the one-sided route it goes over (its bytes are counted there).
class BounceRoute final : public transport::Route {
 public:
  // stages_all: the peer stages all its memory (its staging = always), standing in for GPU memory.
  BounceRoute(std::shared_ptr<transport::Route> inner, std::shared_ptr<StageChannel> channel, bool stages_all)
      : Route(inner->backend(), std::make_shared<BounceLink>(std::move(channel), inner->shared_link()),
              inner->limits()),
        inner_(std::move(inner)),
        stages_all_(stages_all) {}
  bool Reach(MemType local, transport::RemoteRegion& r, uint8_t**) override;
  std::string WhyNot(MemType local, const transport::RemoteRegion& r) const override;

 private:
  const std::shared_ptr<transport::Route> inner_;
  const bool stages_all_;
};

}  // namespace xfer
