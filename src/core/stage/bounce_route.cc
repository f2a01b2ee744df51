#include "core/stage/bounce_route.h"

#include <algorithm>

namespace xfer {

Status BounceLink::Run(Op op, std::span<const transport::Slice> batch, transport::Clock::time_point deadline,
                       transport::PieceHook* hook) {
  size_t first = 0;
  uint64_t done = 0, moved = 0;
  while (first < batch.size()) {
    if (Status s = Chunk(op, batch, &first, &done, &moved, hook, deadline); !s.ok()) return s;
  }
  return Status::Ok();
}

namespace {

// The batch's hook, for a chunk that begins `before` bytes into the batch.
class ChunkHook final : public transport::PieceHook {
 public:
  ChunkHook(transport::PieceHook& batch, uint64_t before) : batch_(batch), before_(before) {}
  Status Ready(uint64_t upto) override { return batch_.Ready(before_ + upto); }
  Status Landed(uint64_t upto) override { return batch_.Landed(before_ + upto); }
  uint64_t piece() const override { return batch_.piece(); }

 private:
  transport::PieceHook& batch_;
  const uint64_t before_;
};

}  // namespace

Status BounceLink::Across(Op op, std::span<const transport::Slice> to_slot, uint64_t moved,
                          transport::PieceHook* hook, transport::Clock::time_point deadline) {
  if (hook == nullptr) return inner_->Execute(op, to_slot, deadline);
  ChunkHook chunk(*hook, moved);
  return inner_->ExecutePieces(op, to_slot, deadline, chunk);
}

Status BounceLink::Chunk(Op op, std::span<const transport::Slice> batch, size_t* first, uint64_t* done,
                         uint64_t* moved, transport::PieceHook* hook, transport::Clock::time_point deadline) {
  StageChannel::Slot slot;
  if (Status s = channel_->Acquire(deadline, &slot); !s.ok()) return s;
  std::vector<transport::Slice> to_slot;  // our memory <-> the slot
  std::vector<wire::DigestRange> ranges;  // the slot <-> the peer's memory
  uint64_t used = 0;
  while (*first < batch.size() && used < slot.bytes && ranges.size() < wire::kMaxStageRanges) {
    const transport::Slice& s = batch[*first];
    const uint64_t n = std::min(s.len - *done, slot.bytes - used);
    to_slot.push_back({s.local + *done, slot.addr + used, n});
    ranges.push_back({s.remote + *done, n});
    used += n;
    *done += n;
    if (*done == s.len) {
      ++*first;
      *done = 0;
    }
  }
  const bool write = op == Op::kWrite;
  const uint64_t before = *moved;
  *moved += used;
  if (write) {
    if (Status s = Across(op, to_slot, before, hook, deadline); !s.ok()) {
      channel_->Release(slot);
      return s;
    }
  }
  if (Status s = channel_->Move(slot, write, std::move(ranges), deadline); !s.ok()) return s;
  // (READ: the slot is ours till then.)
  Status s = write ? Status::Ok() : Across(op, to_slot, before, hook, deadline);
  channel_->Release(slot);
  return s;
}

bool BounceRoute::Reach(MemType local, transport::RemoteRegion& r, uint8_t**) {
  if (local != MemType::kHost) return false;  // (GPU memory here: the buffer pool, then this route)
  uint8_t* mapped = nullptr;
  return stages_all_ || !inner_->Reach(local, r, &mapped);
}

std::string BounceRoute::WhyNot(MemType local, const transport::RemoteRegion&) const {
  return local != MemType::kHost
             ? std::string(backend()) + " through the peer's staging: from host memory only"
             : "";
}

}  // namespace xfer
