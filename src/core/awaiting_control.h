// A batch that waits for what only the control thread delivers (a peer's answer over its
// session: the staging at a peer, core/stage/) says so while it waits, on the execution slot
// it holds (StreamPool). A fence that the control thread itself runs (a peer's region removal
// or goodbye) passes such a batch by: it could not end before the control thread read that
// answer, so waiting for it would hold every peer's control traffic until the fence's deadline
// and then fail it. Only batches that touch no memory of that peer's but its staging slots
// wait so (the peer's own engine copies between the slots and its regions).
#pragma once

#include <atomic>

namespace xfer {

class AwaitingControl {
 public:
  AwaitingControl() : mark_(Mark()) {
    if (mark_ != nullptr) mark_->store(true, std::memory_order_release);
  }
  ~AwaitingControl() {
    if (mark_ != nullptr) mark_->store(false, std::memory_order_release);
  }
  AwaitingControl(const AwaitingControl&) = delete;
  AwaitingControl& operator=(const AwaitingControl&) = delete;

  // The mark of the execution slot this thread holds, set and cleared by the slot
  // (StreamPool::ExecSlot; null while it holds none).
  static std::atomic<bool>*& Mark() {
    thread_local std::atomic<bool>* mark = nullptr;
    return mark;
  }

 private:
  std::atomic<bool>* const mark_;
};

}  // namespace xfer
