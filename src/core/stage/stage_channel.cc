#include "core/stage/stage_channel.h"

#include "util/log.h"

namespace xfer {

namespace {
constexpr uint32_t kMaxSlots = 1024;  // (EngineOptions::staging_buffers allows 64)
Status Lost() { return {StatusCode::kConnectionLost, "the peer's session ended"}; }
Status Interrupted() {
  return {StatusCode::kConnectionLost, "the peer did not answer a staging ask before a fence gave up on it"};
}
}  // namespace

void StageChannel::Attach(const std::shared_ptr<control::Session>& s) {
  std::lock_guard lock(mu_);
  if (!closed_) session_ = s;
}

void StageChannel::Close() {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
    session_.reset();
    for (auto& [id, m] : moves_) {
      if (!m.answered) m.status = Lost();
      m.answered = true;
    }
    std::erase_if(moves_, [](const auto& e) { return e.second.abandoned; });
  }
  cv_.notify_all();
}

void StageChannel::Interrupt(Clock::time_point since, bool control_thread) {
  {
    std::lock_guard lock(mu_);
    if (control_thread) {
      ++interrupts_;
    } else {
      interrupt_since_ = std::max(interrupt_since_, since);
    }
  }
  cv_.notify_all();
}

bool StageChannel::OnOpened(wire::StageOpened&& m) {
  {
    std::lock_guard lock(mu_);
    if (pool_ != Pool::kAsked || m.id != open_id_) return false;
    last_answer_ = Clock::now();
    if (m.code != StatusCode::kOk) {
      open_failed_ = {m.code, "the peer lent no staging slots: " + m.why};
      pool_ = Pool::kNone;
    } else if (m.slots == 0 || m.slots > kMaxSlots || m.slot_bytes == 0 ||
               m.slot_bytes > m.region.info.len / m.slots || m.region.info.type != MemType::kHost ||
               m.region.info.addr + m.region.info.len < m.region.info.addr) {
      XLOG(WARN) << "the peer's staging slots do not fit their region";
      open_failed_ = {StatusCode::kInternal, "the peer's staging slots do not fit their region"};
      pool_ = Pool::kNone;
    } else {
      region_ = std::make_shared<transport::RemoteRegion>();
      region_->id = m.region.id;
      region_->info = m.region.info;
      region_->blobs = m.region.blobs;
      slots_ = std::move(m);
      for (uint32_t i = slots_.slots; i > 0; --i) free_.push_back(i - 1);
      pool_ = Pool::kOpen;
    }
  }
  cv_.notify_all();
  return true;
}

std::shared_ptr<transport::RemoteRegion> StageChannel::SlotsRegion(uint64_t addr, uint64_t len) {
  std::lock_guard lock(mu_);
  if (!region_ || addr < region_->info.addr || len > region_->info.len ||
      addr - region_->info.addr > region_->info.len - len) {
    return nullptr;
  }
  return region_;
}

bool StageChannel::OnMoved(const wire::StageMoved& m) {
  {
    std::lock_guard lock(mu_);
    auto it = moves_.find(m.id);
    if (it == moves_.end() || it->second.answered) return false;
    last_answer_ = Clock::now();
    Asked& a = it->second;
    a.answered = true;
    if (m.code != StatusCode::kOk) a.status = {m.code, "the peer's staging: " + m.why};
    if (a.abandoned) {
      free_.push_back(a.slot);
      moves_.erase(it);
    }
  }
  cv_.notify_all();
  return true;
}

Status StageChannel::Open(std::unique_lock<std::mutex>& lock, Clock::time_point deadline) {
  while (pool_ != Pool::kOpen) {
    if (closed_ || !session_) return Lost();
    if (pool_ == Pool::kNone) {
      open_failed_ = Status::Ok();
      const uint64_t id = open_id_ = next_id_++;
      pool_ = Pool::kAsked;
      const std::shared_ptr<control::Session> session = session_;
      lock.unlock();  // (the others wait for its answer; a send is a system call)
      Status sent = session->Send(wire::StageOpen{id});
      lock.lock();
      if (!sent.ok()) {
        if (pool_ == Pool::kAsked && open_id_ == id) pool_ = Pool::kNone;
        cv_.notify_all();
        return sent;
      }
    }
    const uint64_t asked = open_id_;
    const Waited w = Await(lock, deadline, [&] { return pool_ != Pool::kAsked || closed_; });
    if (w == Waited::kTimedOut) return {StatusCode::kTimeout, "the peer did not lend staging slots in time"};
    if (w == Waited::kGaveUp) return Interrupted();
    if (pool_ == Pool::kNone && asked == open_id_ && !open_failed_.ok()) return open_failed_;
  }
  return Status::Ok();
}

Status StageChannel::Acquire(Clock::time_point deadline, Slot* out) {
  std::unique_lock lock(mu_);
  if (Status s = Open(lock, deadline); !s.ok()) return s;
  // (A slot comes back with an answer, or another batch's end.)
  const Waited w = Await(lock, deadline, [&] { return !free_.empty() || closed_; });
  if (w == Waited::kTimedOut) {
    return {StatusCode::kTimeout, "no staging slot of the peer's came free in time"};
  }
  if (w == Waited::kGaveUp) return Interrupted();
  if (closed_) return Lost();
  out->index = free_.back();
  free_.pop_back();
  out->bytes = slots_.slot_bytes;
  out->addr = slots_.region.info.addr + out->index * slots_.slot_bytes;
  return Status::Ok();
}

void StageChannel::Release(const Slot& slot) {
  {
    std::lock_guard lock(mu_);
    free_.push_back(slot.index);
  }
  cv_.notify_all();
}

Status StageChannel::Move(const Slot& slot, bool write, std::vector<wire::DigestRange> ranges,
                          Clock::time_point deadline) {
  std::unique_lock lock(mu_);
  if (closed_ || !session_) {
    free_.push_back(slot.index);
    return Lost();
  }
  // (The wait begins before the ask goes out: a fence that gave up meanwhile ends it.)
  const uint64_t id = next_id_++, epoch = interrupts_;
  const auto began = Clock::now();
  moves_[id].slot = slot.index;  // (before it is sent: its answer finds it waiting)
  const std::shared_ptr<control::Session> session = session_;
  lock.unlock();  // (a send is a system call)
  Status sent = session->Send(wire::StageMove{id, write, slot.index, std::move(ranges)});
  lock.lock();
  if (!sent.ok()) {
    moves_.erase(id);
    free_.push_back(slot.index);
    cv_.notify_all();
    return sent;
  }
  const Waited waited = Await(lock, deadline, began, epoch, [&] { return moves_.at(id).answered; });
  if (closed_) {  // (the peer left, answered or not: its slots may be lent to another already)
    moves_.erase(id);
    return Lost();
  }
  if (!moves_.at(id).answered) {
    moves_.at(id).abandoned = true;  // (its slot goes back with the answer, or the session's end)
    return waited == Waited::kGaveUp
               ? Interrupted()
               : Status(StatusCode::kTimeout, "the peer did not stage a batch by its deadline");
  }
  Status s = std::move(moves_.at(id).status);
  moves_.erase(id);
  if (!s.ok()) {
    free_.push_back(slot.index);
    cv_.notify_all();
  }
  return s;
}

}  // namespace xfer
