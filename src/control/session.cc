#include "control/session.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "util/log.h"

namespace xfer::control {

Session::Session(net::Fd fd, bool outbound, std::string remote_addr)
    : fd_(std::move(fd)), outbound_(outbound), remote_addr_(std::move(remote_addr)) {}

namespace {}  // namespace

Status Session::Send(const wire::Message& msg) {
  std::vector<uint8_t> frame = wire::Encode(msg);
  std::unique_lock lock(send_mu_);
  if (closed_.load() || !fd_.valid()) return {StatusCode::kConnectionLost, "session closed"};
  out_.insert(out_.end(), frame.begin(), frame.end());
  return AfterQueued(lock, true);
}

void Session::SendSoon(const wire::Message& msg) {
  std::vector<uint8_t> frame = wire::Encode(msg);
  std::unique_lock lock(send_mu_);
  if (closed_.load() || !fd_.valid()) return;
  out_.insert(out_.end(), frame.begin(), frame.end());
  (void)AfterQueued(lock, false);
}

Status Session::SendNumbered(const std::function<wire::Message(uint64_t)>& make, uint64_t* seq, Reply reply) {
  std::unique_lock lock(send_mu_);
  *seq = next_seq_.fetch_add(1, std::memory_order_acq_rel) + 1;  // (under send_mu_: in order)
  if (closed_.load() || !fd_.valid()) {
    lock.unlock();
    if (reply) reply({StatusCode::kConnectionLost, "the session with " + peer_key + " has ended"});
    return {StatusCode::kConnectionLost, "session closed"};
  }
  std::vector<uint8_t> frame = wire::Encode(make(*seq));
  if (reply) {  // before the frame leaves: the answer may come at once
    std::lock_guard expect(mu_);
    expected_.emplace(*seq, std::move(reply));
  }
  out_.insert(out_.end(), frame.begin(), frame.end());
  return AfterQueued(lock, true);  // (a failure closes the session: Close answers the reply)
}

Status Session::AfterQueued(std::unique_lock<std::mutex>& lock, bool write_now) {
  // While the control loop waits for room (bytes it was told of are left), it writes this too.
  write_now = write_now && !loop_owes_;
  const Flushed f = write_now                                     ? WriteQueued()
                    : out_.size() - out_off_ > max_queued_.load() ? Flushed::kFailed
                                                                  : Flushed::kPending;
  std::function<void()> pending;
  if (f == Flushed::kPending && write_now && on_pending_) {
    pending = on_pending_;
    loop_owes_ = true;
  }
  const uint64_t unsent = out_.size() - out_off_;
  lock.unlock();
  if (f == Flushed::kFailed && unsent > max_queued_.load() && shutdown_reason().empty()) {
    XLOG(WARN) << (peer_key.empty() ? remote_addr_ : peer_key) << " leaves " << unsent
               << " bytes of our control frames unread (more than max_unsent_bytes); closing its session";
  }
  if (f == Flushed::kFailed) {
    Shutdown("the peer does not read its control connection, or it broke");
    return {StatusCode::kConnectionLost, "cannot send to " + (peer_key.empty() ? remote_addr_ : peer_key)};
  }
  if (pending) pending();
  return Status::Ok();
}

Session::Flushed Session::WriteQueued() {
  while (out_off_ < out_.size()) {
    if (!fd_.valid()) return Flushed::kFailed;
    const ssize_t n =
        ::send(fd_.get(), out_.data() + out_off_, out_.size() - out_off_, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      out_off_ += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      break;
    } else {
      return Flushed::kFailed;
    }
  }
  if (out_off_ == out_.size()) {
    out_.clear();
    out_off_ = 0;
    loop_owes_ = false;
    return Flushed::kAll;
  }
  if (out_off_ >= (1u << 20)) {  // drop what was written, now and then
    out_.erase(out_.begin(), out_.begin() + static_cast<long>(out_off_));
    out_off_ = 0;
  }
  return out_.size() - out_off_ > max_queued_.load() ? Flushed::kFailed : Flushed::kPending;
}

Session::Flushed Session::Flush() {
  std::lock_guard lock(send_mu_);
  return WriteQueued();
}

Status Session::FlushUntil(Clock::time_point deadline) {
  for (;;) {
    Flushed f;
    int fd;
    {
      std::lock_guard lock(send_mu_);
      f = WriteQueued();
      fd = fd_.get();
    }
    if (f == Flushed::kAll) return Status::Ok();
    if (f == Flushed::kFailed) return {StatusCode::kConnectionLost, "cannot send the handshake"};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return {StatusCode::kTimeout, "the peer did not read the handshake in time"};
    pollfd p{fd, POLLOUT, 0};
    (void)::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 100)));
  }
}

void Session::set_on_pending(std::function<void()> f) {
  std::lock_guard lock(send_mu_);
  on_pending_ = std::move(f);
}

bool Session::ParseFrames(const Handlers& on, std::string* why) {
  size_t pos = 0;
  // (Nothing more once shut down: a refused hello's session hands on nothing behind it.)
  while (!held_ && !shut_.load(std::memory_order_relaxed) && rx_.size() - pos >= wire::kHeaderSize) {
    wire::Header h;
    std::span<const uint8_t> rest(rx_.data() + pos, rx_.size() - pos);
    if (!wire::DecodeHeader(rest, &h, why)) return false;
    if (TooLong(h, why)) return false;
    if (h.type == wire::MsgType::kHello && hello_seen_) {  // (by its header alone: it may be big)
      *why = "a second hello";
      return false;
    }
    if (rest.size() < wire::kHeaderSize + h.length) break;  // wait for the rest
    const auto payload = rest.subspan(wire::kHeaderSize, h.length);
    const bool hello = h.type == wire::MsgType::kHello;
    if (hello && h.length >= kBigHello && on.big_hello) {
      held_ = true;
      if (on.big_hello(payload)) {  // (else it stays, to be parsed again on Resume)
        pos += wire::kHeaderSize + h.length;
        hello_seen_ = true;
      }
      break;
    }
    hello_seen_ = hello_seen_ || hello;
    pos += wire::kHeaderSize + h.length;
    wire::Message msg;
    if (!wire::DecodePayload(h.type, payload, &msg, why)) return false;
    on.message(std::move(msg));
  }
  rx_.erase(rx_.begin(), rx_.begin() + static_cast<long>(pos));
  FitBuffer();
  return true;
}

void Session::FitBuffer() {
  // Room for what the next reads bring: twice what is read of the frame under way (the next
  // read's 64 KiB at least), never past the frame's end as its header says; and once frames
  // are done, no more than 64 KiB. The room is what buffered() counts: a frame that only
  // announces its length is counted for what came, not for what it says.
  size_t frame = rx_.size();
  wire::Header h;
  if (std::string ignored; rx_.size() >= wire::kHeaderSize && wire::DecodeHeader(rx_, &h, &ignored)) {
    frame = std::max<size_t>(frame, wire::kHeaderSize + h.length);
  }
  const size_t next_read = std::min(frame, rx_.size() + 64 * 1024);
  const size_t want = std::min(frame, std::max(2 * rx_.size(), next_read));
  if (rx_.capacity() > std::max<size_t>(want, kBigHello)) {
    std::vector<uint8_t> fitted;
    fitted.reserve(want);
    fitted.assign(rx_.begin(), rx_.end());
    rx_.swap(fitted);
  } else if (rx_.capacity() < next_read) {
    rx_.reserve(want);  // (doubling: a big frame is copied a few times, not once a read)
  }
}

bool Session::ReadAvailable(const Handlers& on, std::string* why) {
  if (held_) return true;
  // At most 64 KiB per call (a flood of small frames: about a thousand): the loop comes back
  // for the rest after the other sessions and its heartbeats. (With 1 MiB, 100,000 region
  // frames from one peer held the loop for over a heartbeat timeout under ASan.)
  uint8_t buf[64 * 1024];
  const ssize_t n = ::recv(fd_.get(), buf, sizeof buf, 0);
  if (n > 0) {
    last_rx.store(Clock::now());
    rx_.insert(rx_.end(), buf, buf + n);
    return ParseFrames(on, why);
  }
  if (n == 0) {
    *why = "connection closed by peer";
    return false;
  }
  if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) return true;
  *why = std::string("receive failed: ") + std::strerror(errno);
  return false;
}

bool Session::Resume(const Handlers& on, std::string* why) {
  held_ = false;
  return ParseFrames(on, why);
}

bool Session::TooLong(const wire::Header& h, std::string* why) const {
  const uint32_t most = max_payload_.load();
  if (h.length <= most) return false;
  *why = "a frame of " + std::to_string(h.length) + " bytes before authenticating (at most " +
         std::to_string(most) + ")";
  return true;
}

Status Session::ReadOne(Clock::time_point deadline, wire::Message* msg) {
  uint8_t hdr[wire::kHeaderSize];
  Status s = net::RecvAll(fd_.get(), hdr, sizeof hdr, deadline);
  if (!s.ok()) return s;
  wire::Header h;
  std::string why;
  if (!wire::DecodeHeader(hdr, &h, &why)) return {StatusCode::kConnectionLost, "bad frame: " + why};
  if (TooLong(h, &why)) return {StatusCode::kConnectionLost, why};  // (nothing big is allocated)
  std::vector<uint8_t> payload(h.length);
  s = net::RecvAll(fd_.get(), payload.data(), payload.size(), deadline);
  if (!s.ok()) return s;
  if (!wire::DecodePayload(h.type, payload, msg, &why)) {
    return {StatusCode::kConnectionLost, "bad frame: " + why};
  }
  // (The peer's hello, on a session we opened: the control loop then refuses another.)
  hello_seen_ = hello_seen_ || h.type == wire::MsgType::kHello;
  last_rx.store(Clock::now());
  return Status::Ok();
}

void Session::Shutdown(const std::string& reason) {
  {
    std::lock_guard lock(mu_);
    if (shutdown_why_.empty()) shutdown_why_ = reason;
  }
  shut_.store(true);
  std::lock_guard lock(send_mu_);
  if (fd_.valid()) ::shutdown(fd_.get(), SHUT_RDWR);
}

std::string Session::shutdown_reason() const {
  std::lock_guard lock(mu_);
  return shutdown_why_;
}

void Session::Close() {
  {
    std::lock_guard lock(send_mu_);
    closed_.store(true);
    fd_.Reset();
  }
  std::map<uint64_t, Reply> unanswered;
  {
    std::lock_guard lock(mu_);
    unanswered.swap(expected_);
    cv_.notify_all();
  }
  for (auto& [seq, reply] : unanswered) {
    reply({StatusCode::kConnectionLost, "the session with " + (peer_key.empty() ? remote_addr_ : peer_key) +
                                            " ended before the peer answered"});
  }
}

bool Session::Answer(uint64_t seq, Status status) {
  Reply reply;
  {
    std::lock_guard lock(mu_);
    auto it = expected_.find(seq);
    if (it == expected_.end()) return false;
    reply = std::move(it->second);
    expected_.erase(it);
  }
  reply(std::move(status));
  return true;
}

bool Session::Acked(uint64_t seq) {
  if (seq > next_seq_.load(std::memory_order_acquire))
    return false;  // (it would answer our next round trips before they were sent)
  std::lock_guard lock(mu_);
  if (seq > acked_) acked_ = seq;
  cv_.notify_all();
  return true;
}

bool Session::WaitAcked(uint64_t seq, Clock::time_point deadline) {
  std::unique_lock lock(mu_);
  return cv_.wait_until(lock, deadline, [&] { return acked_ >= seq || closed_.load(); }) && acked_ >= seq;
}

}  // namespace xfer::control
