#include "control/session.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace xfer::control {

Session::Session(net::Fd fd, bool outbound, std::string remote_addr)
    : fd_(std::move(fd)), outbound_(outbound), remote_addr_(std::move(remote_addr)) {}

Status Session::Send(const wire::Message& msg, std::chrono::milliseconds timeout) {
  std::vector<uint8_t> frame = wire::Encode(msg);
  std::lock_guard lock(send_mu_);
  if (closed_.load() || !fd_.valid()) return {StatusCode::kConnectionLost, "session closed"};
  if (!soon_.empty()) {  // (those queued first go first)
    frame.insert(frame.begin(), soon_.begin(), soon_.end());
    soon_.clear();
  }
  return net::SendAll(fd_.get(), frame.data(), frame.size(), Clock::now() + timeout);
}

Status Session::SendNumbered(const std::function<wire::Message(uint64_t)>& make,
                             std::chrono::milliseconds timeout, uint64_t* seq, Reply reply) {
  Status st;
  bool expected = false;
  {
    std::lock_guard lock(send_mu_);
    *seq = ++next_seq_;
    std::vector<uint8_t> frame = wire::Encode(make(*seq));
    if (closed_.load() || !fd_.valid()) {
      st = {StatusCode::kConnectionLost, "session closed"};
    } else {
      if (reply) {  // before the frame leaves: the answer may come at once
        std::lock_guard expect(mu_);
        expected_.emplace(*seq, std::move(reply));
        expected = true;
      }
      frame.insert(frame.begin(), soon_.begin(), soon_.end());
      soon_.clear();
      st = net::SendAll(fd_.get(), frame.data(), frame.size(), Clock::now() + timeout);
    }
  }
  if (!st.ok()) {
    Status lost{StatusCode::kConnectionLost,
                "could not send to " + (peer_key.empty() ? remote_addr_ : peer_key) + ": " + st.message()};
    if (expected) {
      Answer(*seq, std::move(lost));  // (unless Close answered it first)
    } else if (reply) {
      reply(std::move(lost));
    }
  }
  return st;
}

void Session::SendSoon(const wire::Message& msg) {
  std::vector<uint8_t> frame = wire::Encode(msg);
  std::lock_guard lock(send_mu_);
  soon_.insert(soon_.end(), frame.begin(), frame.end());
}

Session::Flushed Session::Flush() {
  constexpr size_t kMaxPending = 64u << 20;  // a peer that reads none of its answers
  std::lock_guard lock(send_mu_);
  size_t sent = 0;
  while (sent < soon_.size() && fd_.valid()) {
    const ssize_t n = ::send(fd_.get(), soon_.data() + sent, soon_.size() - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      break;
    } else {
      return Flushed::kFailed;
    }
  }
  soon_.erase(soon_.begin(), soon_.begin() + static_cast<long>(sent));
  if (soon_.empty()) return Flushed::kAll;
  return soon_.size() > kMaxPending || !fd_.valid() ? Flushed::kFailed : Flushed::kPending;
}

bool Session::ParseFrames(const std::function<void(wire::Message&&)>& on_msg, std::string* why) {
  size_t pos = 0;
  while (rx_.size() - pos >= wire::kHeaderSize) {
    wire::Header h;
    std::span<const uint8_t> rest(rx_.data() + pos, rx_.size() - pos);
    if (!wire::DecodeHeader(rest, &h, why)) return false;
    if (rest.size() < wire::kHeaderSize + h.length) break;  // wait for the rest
    wire::Message msg;
    if (!wire::DecodePayload(h.type, rest.subspan(wire::kHeaderSize, h.length), &msg, why)) {
      return false;
    }
    pos += wire::kHeaderSize + h.length;
    on_msg(std::move(msg));
  }
  rx_.erase(rx_.begin(), rx_.begin() + static_cast<long>(pos));
  return true;
}

bool Session::ReadAvailable(const std::function<void(wire::Message&&)>& on_msg, std::string* why) {
  for (;;) {
    uint8_t buf[64 * 1024];
    ssize_t n = ::recv(fd_.get(), buf, sizeof buf, 0);
    if (n > 0) {
      last_rx.store(Clock::now());
      rx_.insert(rx_.end(), buf, buf + n);
      if (!ParseFrames(on_msg, why)) return false;
      continue;
    }
    if (n == 0) {
      *why = "connection closed by peer";
      return false;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
    *why = std::string("receive failed: ") + std::strerror(errno);
    return false;
  }
}

Status Session::ReadOne(Clock::time_point deadline, wire::Message* msg) {
  uint8_t hdr[wire::kHeaderSize];
  Status s = net::RecvAll(fd_.get(), hdr, sizeof hdr, deadline);
  if (!s.ok()) return s;
  wire::Header h;
  std::string why;
  if (!wire::DecodeHeader(hdr, &h, &why)) return {StatusCode::kConnectionLost, "bad frame: " + why};
  std::vector<uint8_t> payload(h.length);
  s = net::RecvAll(fd_.get(), payload.data(), payload.size(), deadline);
  if (!s.ok()) return s;
  if (!wire::DecodePayload(h.type, payload, msg, &why)) {
    return {StatusCode::kConnectionLost, "bad frame: " + why};
  }
  last_rx.store(Clock::now());
  return Status::Ok();
}

void Session::Shutdown(const std::string& reason) {
  {
    std::lock_guard lock(mu_);
    if (shutdown_why_.empty()) shutdown_why_ = reason;
  }
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
    reply({StatusCode::kConnectionLost,
           "the session with " + (peer_key.empty() ? remote_addr_ : peer_key) +
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

void Session::Acked(uint64_t seq) {
  std::lock_guard lock(mu_);
  if (seq > acked_) acked_ = seq;
  cv_.notify_all();
}

bool Session::WaitAcked(uint64_t seq, Clock::time_point deadline) {
  std::unique_lock lock(mu_);
  return cv_.wait_until(lock, deadline, [&] { return acked_ >= seq || closed_.load(); }) &&
         acked_ >= seq;
}

}  // namespace xfer::control
