#include "core/stage/stage_server.h"

#include "util/log.h"
#include "util/text.h"

namespace xfer {

namespace {
// Pools' region ids: apart from the registry's (which count up from 1).
constexpr uint64_t kPoolIds = 1ull << 63;
}  // namespace

void StageServer::Start(Prepare prepare) {
  prepare_ = std::move(prepare);
  thread_ = std::thread([this] { Serve(); });
}

void StageServer::Stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    moves_.clear();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mu_);
  pools_.clear();  // (the backends' mappings first, then the memory: Pool's member order)
}

size_t StageServer::pools() const {
  std::lock_guard lock(mu_);
  return pools_.size();
}

size_t StageServer::pools_lent() const {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const auto& p : pools_) n += p->owner != nullptr;
  return n;
}

StageServer::Pool* StageServer::PoolOf(const control::Session* s) const {
  for (const auto& p : pools_) {
    if (p->owner == s) return p.get();
  }
  return nullptr;
}

StageServer::Pool* StageServer::Lend(const control::Session* s, Status* why) {
  if (Pool* own = PoolOf(s)) return own;
  for (const auto& p : pools_) {
    if (p->owner == nullptr && !p->Moving()) {
      p->owner = s;
      return p.get();
    }
  }
  if (pools_.size() >= max_pools()) {
    *why = {StatusCode::kResourceExhausted, "all " + std::to_string(max_pools()) +
                                                " staging pools of this engine are lent to other peers "
                                                "(EngineOptions::staging_pools)"};
    return nullptr;
  }
  auto pool = std::make_unique<Pool>();
  const uint64_t bytes = slot_bytes() * slots();
  if (Status a = transport::StagingBuffer::Allocate(bytes, &pool->memory); !a.ok()) {
    *why = {a.code(), "cannot allocate " + std::to_string(bytes) + " bytes of staging slots: " + a.message()};
    return nullptr;
  }
  pool->region.id = kPoolIds | pools_.size();
  pool->region.info.addr = reinterpret_cast<uint64_t>(pool->memory->data());
  pool->region.info.len = bytes;
  if (Status p = prepare_(pool->region.info, &pool->resources, &pool->region.blobs); !p.ok()) {
    *why = {p.code(), "cannot offer staging slots: " + p.message()};
    return nullptr;
  }
  pool->slot_moving.assign(slots(), false);
  pool->owner = s;
  pools_.push_back(std::move(pool));
  return pools_.back().get();
}

void StageServer::OnOpen(const std::shared_ptr<control::Session>& s, const wire::StageOpen& m) {
  wire::StageOpened answer;
  answer.id = m.id;
  Status refused;
  if (self_.options.staging == Staging::kOff) {
    refused = {StatusCode::kUnsupported, "this engine's staging is off (EngineOptions::staging)"};
  } else {
    std::lock_guard lock(mu_);
    if (stop_) {
      refused = {StatusCode::kCanceled, "the engine is stopping"};
    } else if (Pool* p = Lend(s.get(), &refused)) {
      answer.region = p->region;
      answer.slot_bytes = slot_bytes();
      answer.slots = slots();
    }
  }
  if (!refused.ok()) {
    XLOG(WARN) << "refused staging slots to " << s->peer_key << ": " << refused.message();
    answer.code = refused.code();
    answer.why = refused.message();
  }
  s->SendSoon(answer);
}

void StageServer::OnMove(const std::shared_ptr<control::Session>& s, wire::StageMove&& m) {
  Status refused;
  {
    std::lock_guard lock(mu_);
    Pool* p = PoolOf(s.get());
    uint64_t room = slot_bytes();  // (what the ranges leave of the slot, as long as they fit)
    bool overflow = false;
    for (const wire::DigestRange& r : m.ranges) {
      overflow = overflow || r.len > room;
      room -= overflow ? 0 : r.len;
    }
    if (stop_) {
      refused = {StatusCode::kCanceled, "the engine is stopping"};
    } else if (p == nullptr) {
      refused = {StatusCode::kInvalidArgument, "a staged move before this engine lent slots to the peer"};
    } else if (m.slot >= slots()) {
      refused = {StatusCode::kInvalidArgument,
                 "slot " + std::to_string(m.slot) + " of " + std::to_string(slots())};
    } else if (overflow) {
      refused = {StatusCode::kInvalidArgument,
                 "the ranges of a staged move pass its slot's " + std::to_string(slot_bytes()) + " bytes"};
    } else if (p->slot_moving[m.slot]) {
      refused = {StatusCode::kResourceExhausted, "slot " + std::to_string(m.slot) + " has a move under way"};
    } else {
      p->slot_moving[m.slot] = true;
      moves_.push_back(Move{s, p, std::move(m)});
      cv_.notify_one();
      return;
    }
  }
  XLOG(WARN) << "refused a staged move from " << s->peer_key << ": " << refused.message();
  s->SendSoon(wire::StageMoved{m.id, refused.code(), refused.message()});
}

void StageServer::SessionClosed(const control::Session* s) {
  std::lock_guard lock(mu_);
  Pool* p = PoolOf(s);
  if (p == nullptr) return;
  p->owner = nullptr;  // (lent again once its moves are over)
  std::erase_if(moves_, [&](const Move& m) {
    if (m.session.get() != s) return false;
    p->slot_moving[m.ask.slot] = false;
    return true;
  });
}

void StageServer::Fence(Clock::time_point) { std::lock_guard wait(copying_); }

void StageServer::Serve() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !moves_.empty(); });
    if (stop_) return;
    Move m = std::move(moves_.front());
    moves_.pop_front();
    lock.unlock();
    const bool wanted = !m.session->closed();
    Status copied;
    if (wanted) {
      std::lock_guard copying(copying_);
      copied = Copy(m);
    }
    lock.lock();
    m.pool->slot_moving[m.ask.slot] = false;  // (before the answer: the peer may move it again next)
    lock.unlock();
    if (wanted) {
      if (!copied.ok()) XLOG(WARN) << "staged move for " << m.session->peer_key << ": " << copied.message();
      (void)m.session->Send(wire::StageMoved{m.ask.id, copied.code(), copied.ok() ? "" : copied.message()});
    }
    lock.lock();
  }
}

Status StageServer::Copy(const Move& m) {
  uint8_t* slot = m.pool->memory->data() + m.ask.slot * slot_bytes();
  const auto deadline = Clock::now() + self_.options.heartbeat_timeout;
  std::vector<bool> device(m.ask.ranges.size());
  for (size_t i = 0; i < m.ask.ranges.size(); ++i) {
    const wire::DigestRange& r = m.ask.ranges[i];
    const transport::TargetAccess a = regions_.Access(r.addr, r.len, m.ask.write);
    device[i] = a.device;
    if (!a.allowed || (m.ask.write && !a.writable)) {
      return {StatusCode::kRemoteAccessDenied,
              "range " + std::to_string(i) + " (" + std::to_string(r.len) + " bytes at " + text::Hex(r.addr) +
                  (a.allowed ? ") lies in a region that is read-only for peers"
                             : ") is not inside one region registered here")};
    }
  }
  uint64_t at = 0;
  for (size_t i = 0; i < m.ask.ranges.size(); ++i) {
    const wire::DigestRange& r = m.ask.ranges[i];
    const transport::Slice copy{r.addr, reinterpret_cast<uint64_t>(slot + at), r.len};
    // (WRITE: out of the slot into our memory, StageCopy's "from the buffer".)
    if (Status s = transport::StageCopy(!m.ask.write, std::span(&copy, 1), device[i], deadline); !s.ok())
      return s;
    at += r.len;
  }
  return Status::Ok();
}

}  // namespace xfer
