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
                 transport::Clock::time_point deadline) override;
  void Shutdown() override { inner_->Shutdown(); }
  // (The batches waiting for the peer's answers give up too: only the control thread, which
  // the fence holds, hears them.)
  void Interrupt(transport::Clock::time_point since) override {
    inner_->Interrupt(since);
    channel_->Interrupt();
  }

 private:
  // One slot's worth of the batch (what fits from slice `first`, offset `done` into it on).
  Status Chunk(Op op, std::span<const transport::Slice> batch, size_t* first, uint64_t* done,
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
