#include "transport/tcp/tcp_transport.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <system_error>
#include <thread>
#include <vector>

#include "transport/common/staging.h"
#include "transport/tcp/tcp_wire.h"
#include "util/checksum.h"
#include "util/crypto.h"
#include "util/log.h"
#include "util/text.h"

namespace xfer::transport {
using namespace tcp_wire;
using text::Hex;
namespace {

// How fast an initiator is assumed to read a READ reply out of its socket (2 GB/s, below what
// loopback does: bench/RESULTS.md, "How the defaults were chosen"), for how long the target
// spins after sending one, and the most it spins.
constexpr uint64_t kDrainBytesPerUs = 2000;
constexpr uint64_t kMaxDrainSpinUs = 1000;

// The header of an accepted READ's reply, into h (kReplyHeaderBytes + kAlign bytes); returns
// its length: the payload that follows starts at the alignment of its source address.
uint64_t ReadReplyHeader(uint8_t* h, const void* first_source) {
  const uint64_t lead = PadFor(kReplyHeaderBytes, reinterpret_cast<uint64_t>(first_source));
  std::memset(h, 0, kReplyHeaderBytes + lead);
  Put<uint16_t>(h + 6, static_cast<uint16_t>(lead));
  return kReplyHeaderBytes + lead;
}

// A reply without payload: header, message, padding.
Status SendReply(int fd, StatusCode code, std::string msg, Clock::time_point deadline) {
  msg.resize(std::min<size_t>(msg.size(), kMaxMessage));
  std::vector<uint8_t> b(kReplyHeaderBytes + msg.size());
  b.resize(b.size() + PadFor(b.size(), 0));
  Put<uint32_t>(b.data(), static_cast<uint32_t>(code));
  Put<uint16_t>(b.data() + 4, static_cast<uint16_t>(msg.size()));
  std::memcpy(b.data() + kReplyHeaderBytes, msg.data(), msg.size());
  return net::SendAll(fd, b.data(), b.size(), deadline);
}
// The reply to a WRITE whose payload did not match its checksum (it landed all the same).
Status SendMismatch(int fd, Clock::time_point deadline) {
  const Status m = Mismatch("WRITE", "at the target");
  return SendReply(fd, m.code(), m.message(), deadline);
}

}  // namespace

// ---------------------------------------------------------------- target side
struct TcpTransport::Service {
  std::mutex fd_mu;  // guards closing fd against Shutdown()
  net::Fd fd;
  // Held while a batch touches this engine's memory: Fence() takes it (timed: a fence gives up
  // on a connection at its deadline and closes it).
  std::timed_mutex exec;
  uint64_t peer_incarnation = 0;
  uint64_t replied = 0;  // payload bytes of the READ reply just sent (Serve's)
  std::atomic<bool> done{false};
  std::atomic<bool> shut{false};  // we closed it (a fence, the peer's end, Stop): no warning

  void Shutdown() {
    shut.store(true);
    std::lock_guard l(fd_mu);
    if (fd.valid()) ::shutdown(fd.get(), SHUT_RDWR);
  }
};

// The target's side of one data connection's handshake, moved on by the acceptor thread each
// time its socket is ready: no thread of its own until the peer has proved who it is. Steps:
// receive the hello; with a secret, send a nonce and receive the proof; then the verdict.
struct TcpTransport::Handshaking {
  enum class Step { kHello, kNonce, kProof };
  net::Fd fd;
  std::string from;  // the peer's address, for log lines
  Clock::time_point deadline;
  Step step = Step::kHello;
  uint8_t in[kHelloBytes] = {};  // the hello, then the proof
  size_t have = 0;               // bytes of in received
  crypto::Nonce nonce{};
  size_t sent = 0;         // bytes of the nonce sent
  uint64_t initiator = 0;  // the incarnation the hello claims
  // With a secret: the keys of the initiator's sessions (at its hello), then the one it proved.
  std::vector<std::string> keys;
  std::string key;

  short events() const { return step == Step::kNonce ? POLLOUT : POLLIN; }
  // What one non-blocking receive or send did: the step's bytes are all through, not yet, or
  // the connection ended or failed.
  enum class Io { kDone, kMore, kFailed };
  Io Receive(size_t want) {
    const ssize_t n = ::recv(fd.get(), in + have, want - have, MSG_DONTWAIT);
    if (n > 0) have += static_cast<size_t>(n);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return Io::kFailed;
    return have == want ? Io::kDone : Io::kMore;
  }
  Io SendNonce() {
    const ssize_t n = ::send(fd.get(), nonce.data() + sent, nonce.size() - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) sent += static_cast<size_t>(n);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return Io::kFailed;
    return sent == nonce.size() ? Io::kDone : Io::kMore;
  }
};

TcpTransport::TcpTransport(TcpOptions opts, TcpTargetHooks hooks)
    : opts_(opts),
      hooks_(std::move(hooks)),
      target_staging_(kStagingBuffers, std::min(hooks_.staging_bytes, 2 * kStagePiece),
                      kStagingBuffersPerPeer) {}

TcpTransport::~TcpTransport() { Stop(); }

Status TcpTransport::Start(const std::string& host) {
  net::Address bound;
  listeners_.emplace_back();
  Status s = net::Listen(net::Address{host, 0, true}, &listeners_.back(), &bound);
  if (!s.ok()) return {StatusCode::kUnsupported, s.message()};  // (tcp is then not offered)
  port_ = bound.port;
  for (const net::Nic& nic : opts_.nics) {  // (one more listener on each NIC)
    listeners_.emplace_back();
    if (s = net::Listen(net::Address{nic.address, 0, true}, &listeners_.back(), &bound); !s.ok()) {
      return {StatusCode::kInvalidArgument,
              "tcp.nics: cannot listen on " + nic.name + " (" + nic.address + "): " + s.message()};
    }
    nic_addresses_.push_back(bound);
  }
  if (s = serving_.Start(); !s.ok()) return s;
  acceptor_ = std::thread([this] { AcceptLoop(); });
  return Status::Ok();
}

void TcpTransport::Stop() {
  if (stop_.exchange(true)) return;
  for (auto& l : listeners_) {
    if (l.valid()) ::shutdown(l.get(), SHUT_RDWR);  // wakes the acceptor's poll
  }
  if (acceptor_.joinable()) acceptor_.join();
  std::list<std::shared_ptr<Service>> all;
  {
    std::lock_guard l(services_mu_);
    all.swap(services_);
  }
  for (auto& s : all) s->Shutdown();
  {  // (each one's I/O fails at once now: its Serve ends it)
    std::unique_lock l(services_mu_);
    services_ended_.wait(
        l, [&] { return std::all_of(all.begin(), all.end(), [](const auto& s) { return s->done.load(); }); });
  }
  serving_.Stop();
}

void TcpTransport::AcceptLoop() {
  std::list<Handshaking> handshaking;  // (this thread's alone)
  std::vector<pollfd> polled;
  while (!stop_.load()) {
    // The listener while accepting (not while out of descriptors), and every handshake.
    polled.clear();
    const bool accepting = accept_pause_.Over();
    if (accepting) {
      for (const auto& l : listeners_) polled.push_back({l.get(), POLLIN, 0});
    }
    auto wake = Clock::now() + (accepting ? std::chrono::milliseconds(1000) : std::chrono::milliseconds(10));
    for (const Handshaking& h : handshaking) {
      polled.push_back({h.fd.get(), h.events(), 0});
      wake = std::min(wake, h.deadline);
    }
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(wake - Clock::now()).count();
    ::poll(polled.data(), polled.size(), static_cast<int>(std::clamp<int64_t>(wait + 1, 0, 1000)));
    ReapServices();
    const size_t listening = accepting ? listeners_.size() : 0;
    size_t i = listening;
    for (auto it = handshaking.begin(); it != handshaking.end(); ++i) {
      const bool ready = polled[i].revents != 0;
      it = !ready && Clock::now() < it->deadline ? std::next(it)
           : Advance(*it)                        ? std::next(it)
                                                 : handshaking.erase(it);
    }
    for (size_t l = 0; l < listening; ++l) {
      if (polled[l].revents & POLLIN) Accept(listeners_[l].get(), &handshaking);
    }
  }
}

void TcpTransport::ReapServices() {
  std::lock_guard l(services_mu_);
  for (auto it = services_.begin(); it != services_.end();) {
    if ((*it)->done.load()) {
      it = services_.erase(it);
    } else {
      ++it;
    }
  }
}

void TcpTransport::Accept(int listener, std::list<Handshaking>* handshaking) {
  for (int n = 0; n < 16 && !stop_.load(); ++n) {  // (a burst at a time, then the handshakes' turn)
    int fd = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      accept_pause_.Shortage(errno);  // out of descriptors: accepting again now would spin
      return;
    }
    TuneSocket(fd);
    net::Fd owned(fd);
    if (handshaking->size() >= kMaxPendingHandshakes) {
      // A flood of connections that do not finish their handshake: one goes
      // (net::FloodVictim), so that a peer that does its handshake at once still gets in.
      std::vector<std::string> from;
      for (const auto& h : *handshaking) from.push_back(h.from);
      auto victim = std::next(handshaking->begin(), static_cast<std::ptrdiff_t>(net::FloodVictim(from)));
      LogRefusal("tcp: " + std::to_string(kMaxPendingHandshakes) +
                 " data connections have not "
                 "finished their handshake; closed the oldest from the host with the most, from " +
                 victim->from);
      handshaking->erase(victim);
    }
    Handshaking& h = handshaking->emplace_back();
    h.fd = std::move(owned);
    h.from = net::PeerOf(fd);
    h.deadline = Clock::now() + opts_.io_timeout;
  }
}

void TcpTransport::LogRefusal(const std::string& line) {
  std::lock_guard l(refusal_log_mu_);
  if (uint64_t more = 0; refusal_log_.Due(&more)) XLOG(WARN) << line << log::Limit::More(more);
}

bool TcpTransport::Advance(Handshaking& h) {
  using Io = Handshaking::Io;
  if (Clock::now() >= h.deadline) {
    LogRefusal("tcp: closed the data connection from " + h.from + ": its handshake did not finish within " +
               std::to_string(opts_.io_timeout.count()) + " ms");
    return false;
  }
  switch (h.step) {
    case Handshaking::Step::kHello: {
      const Io io = h.Receive(kHelloBytes);
      if (io != Io::kDone) return io == Io::kMore;
      if (Get<uint32_t>(h.in) != kDataMagic || Get<uint16_t>(h.in + 4) != kDataVersion) {
        LogRefusal("tcp: closed the connection from " + h.from +
                   " to the data port: not an xfer data connection");
        return false;
      }
      h.initiator = Get<uint64_t>(h.in + 16);
      const bool known = Get<uint64_t>(h.in + 8) == hooks_.incarnation && hooks_.is_peer(h.initiator);
      if (!hooks_.authenticate) {
        Admit(h, known ? StatusCode::kOk : StatusCode::kConnectionLost);
        return false;
      }
      if (known) h.keys = hooks_.peer_auth_keys(h.initiator);
      if (h.keys.empty()) return false;  // a stranger: closed without a challenge
      h.nonce = crypto::RandomNonce();
      h.step = Handshaking::Step::kNonce;
      [[fallthrough]];
    }
    case Handshaking::Step::kNonce: {
      const Io io = h.SendNonce();
      if (io != Io::kDone) return io == Io::kMore;
      h.step = Handshaking::Step::kProof;
      h.have = 0;
      return true;  // (the proof comes after a round trip)
    }
    case Handshaking::Step::kProof: {
      const Io io = h.Receive(crypto::kMacBytes);
      if (io != Io::kDone) return io == Io::kMore;
      // (Any of its sessions' keys: the initiator proves the key of the session it opened the
      // connection for, which may be either of two, ours to it or its own to us.)
      const std::span<const uint8_t> got(h.in, crypto::kMacBytes);
      for (const std::string& key : h.keys) {
        if (crypto::Equal(got, DataProof(key, h.nonce.data(), hooks_.incarnation, h.initiator))) h.key = key;
      }
      if (h.key.empty()) {
        LogRefusal("tcp: refused the data connection from " + h.from +
                   ": it did not prove it knows its control session's key");
        return false;
      }
      Admit(h, StatusCode::kOk);
      return false;
    }
  }
  return false;
}

bool TcpTransport::StillPeer(const Handshaking& h) const {
  if (!hooks_.is_peer(h.initiator)) return false;
  if (!hooks_.authenticate) return true;
  const std::vector<std::string> keys = hooks_.peer_auth_keys(h.initiator);
  return std::find(keys.begin(), keys.end(), h.key) != keys.end();
}

void TcpTransport::Admit(Handshaking& h, StatusCode verdict) {
  // (The peer's session may have ended since its hello, a round trip before its proof.)
  if (verdict == StatusCode::kOk && !StillPeer(h)) {
    verdict = StatusCode::kConnectionLost;
    LogRefusal("tcp: refused a data connection from " + h.from +
               ": its engine's control session ended during the handshake");
  }
  if (verdict == StatusCode::kOk && ConnectionsOf(h.initiator) >= kMaxConnectionsPerPeer) {
    verdict = StatusCode::kResourceExhausted;
    LogRefusal("tcp: refused a data connection from " + h.from + ": its engine has " +
               std::to_string(kMaxConnectionsPerPeer) + " already");
  }
  uint8_t reply[kAcceptBytes] = {};
  Put<uint32_t>(reply, static_cast<uint32_t>(verdict));
  // (A fresh connection's send buffer has room for these bytes: they go out at once. The
  // connection is not kept for a peer that does not read them.)
  if (::send(h.fd.get(), reply, sizeof reply, MSG_DONTWAIT | MSG_NOSIGNAL) !=
          static_cast<ssize_t>(sizeof reply) ||
      verdict != StatusCode::kOk) {
    return;  // (a refused stranger is closed without a warning)
  }
  auto svc = std::make_shared<Service>();
  svc->fd = std::move(h.fd);
  svc->peer_incarnation = h.initiator;
  {
    std::lock_guard l(services_mu_);
    services_.push_back(svc);  // (listed before it is served: its end is then reaped like any other)
  }
  // (Grouped by host, then by peer engine: each gets its share of the serve threads.) Asked
  // again once listed: a session that ended meanwhile, whose DropPeer passed this connection
  // by, ends it here; one that ends later finds it listed.
  const uint64_t host = std::hash<std::string>{}(net::HostOf(h.from));
  Status s = StillPeer(h)
                 ? Status::Ok()
                 : Status{StatusCode::kConnectionLost, "its engine's control session ended meanwhile"};
  if (s.ok()) s = serving_.Add(svc->fd.get(), svc.get(), h.initiator, host);
  if (!s.ok()) {
    XLOG(WARN) << "tcp: closed the data connection from " << h.from << ": " << s.message();
    {
      std::lock_guard l(svc->fd_mu);
      svc->fd.Reset();
    }
    std::lock_guard l(services_mu_);
    svc->done.store(true);
    services_ended_.notify_all();
  }
}

size_t TcpTransport::ConnectionsOf(uint64_t incarnation) {
  std::lock_guard l(services_mu_);
  return static_cast<size_t>(std::count_if(services_.begin(), services_.end(), [&](const auto& s) {
    return !s->done.load() && s->peer_incarnation == incarnation;
  }));
}

// One batch frame as the target reads it, and what its check found (buffers reused).
struct TcpTransport::Frame {
  bool write = false;
  bool checksummed = false;  // WRITE: a checksum follows the payload; READ: the reply's must
  uint32_t count = 0;
  uint64_t total = 0, tail = 0;
  std::vector<uint8_t> descs;  // count x {addr, len}, then padding (READ: to the frame's end)
  std::vector<iovec> iov;      // the ranges, once checked
  std::vector<TcpTargetAccess> access;
  bool staged = false;  // some range goes through the staging buffer
  std::string denied;   // why the batch is refused; empty: accepted
  StatusCode deny = StatusCode::kRemoteAccessDenied;
  uint8_t header[kBatchHeaderBytes] = {};
  Clock::time_point deadline;  // the frame's first byte came io_timeout before it
  uint64_t trailer() const { return checksummed ? kTrailerBytes : 0; }
  // What a checksum covers before the payload: the header and descriptors as they came.
  checksum::Running StartChecksum() const {
    checksum::Running sum;
    sum.Add(header, sizeof header);
    sum.Add(descs.data(), count * kSliceBytes);
    return sum;
  }
  uint64_t addr(uint32_t i) const { return Get<uint64_t>(&descs[i * kSliceBytes]); }
  uint64_t len(uint32_t i) const { return Get<uint64_t>(&descs[i * kSliceBytes + 8]); }
};

net::ServePool::Next TcpTransport::Serve(Service& svc) {
  std::string why;
  static thread_local Frame f;  // (its buffers, reused)
  bool idle = false;
  while (ReadFrame(svc, svc.replied, &f, &why, &idle) && ServeFrame(svc, &f, &svc.replied, &why)) {
    // Every thread busy: this connection's next batch queues behind the other connections
    // that have one (a few busy connections cannot starve the rest).
    if (serving_.Saturated()) return net::ServePool::Next::kIdle;
  }
  if (idle) return net::ServePool::Next::kIdle;
  if (!why.empty() && !svc.shut.load()) XLOG(WARN) << "tcp: closing a data connection: " << why;
  {
    std::lock_guard l(svc.fd_mu);
    svc.fd.Reset();
  }
  std::lock_guard l(services_mu_);
  svc.done.store(true);
  services_ended_.notify_all();
  return net::ServePool::Next::kDone;
}

bool TcpTransport::ReadFrame(Service& svc, uint64_t replied, Frame* f, std::string* why, bool* idle) {
  const int fd = svc.fd.get();
  uint8_t h[kBatchHeaderBytes];
  // A READ reply sits in the socket buffers until the initiator has read it, and only then
  // does its next batch come: spin through that drain too, or every such request would pay
  // this thread's wake-up. (spin = 0 still turns spinning off.)
  const auto drain = std::chrono::microseconds(
      opts_.spin.count() > 0 ? std::min(replied / kDrainBytesPerUs, kMaxDrainSpinUs) : 0);
  // The next batch within kServeGrace, or the connection is idle (its end closes it without a
  // word); from the frame's first byte on, the whole frame must come within io_timeout.
  Clock::time_point started;
  const Status got =
      net::RecvIfStarting(fd, h, sizeof h, opts_.io_timeout, opts_.spin + drain, kServeGrace, &started);
  *idle = !got.ok() && started == Clock::time_point{} && got.code() == StatusCode::kTimeout;
  if (!got.ok()) return false;
  f->deadline = started + opts_.io_timeout;
  std::memcpy(f->header, h, sizeof h);
  const uint8_t op = h[0], lead = h[1], flags = h[2];
  f->count = Get<uint32_t>(h + 4);
  f->total = Get<uint64_t>(h + 8);
  f->write = op == static_cast<uint8_t>(Op::kWrite);
  f->checksummed = flags & kChecksummed;
  if (op > static_cast<uint8_t>(Op::kWrite) || f->count == 0 || f->count > kMaxSlices ||
      f->total > kMaxBatchBytes || lead >= kAlign || (!f->write && lead != 0) ||
      (flags & ~kChecksummed) != 0 || h[3] != 0) {
    *why = "malformed batch header";
    return false;
  }
  const uint64_t prefix = kBatchHeaderBytes + f->count * kSliceBytes + lead;
  f->tail = PadFor(prefix + (f->write ? f->total : 0) + f->trailer(), 0);
  // Descriptors, padding, and for READ the end of the frame.
  f->descs.resize(prefix - kBatchHeaderBytes + (f->write ? 0 : f->trailer() + f->tail));
  if (!net::RecvAll(fd, f->descs.data(), f->descs.size(), f->deadline, opts_.spin).ok()) {
    *why = "batch descriptors did not arrive in time";
    return false;
  }
  uint64_t sum = 0;
  bool sane = true;
  for (uint32_t i = 0; i < f->count; ++i) {
    const uint64_t addr = f->addr(i), len = f->len(i);
    sane = sane && len > 0 && addr + len >= addr && sum + len >= sum;
    sum += len;
  }
  if (!sane || sum != f->total) {
    *why = "batch descriptors do not add up";
    return false;
  }
  return true;
}

void TcpTransport::CheckRanges(Frame* f) const {
  f->denied.clear();
  f->deny = StatusCode::kRemoteAccessDenied;
  f->iov.clear();
  f->access.clear();
  f->staged = false;
  if (f->checksummed && !checksum::Available()) {
    f->denied = "a checksummed batch: this engine's build cannot check checksums (no libxxhash)";
    f->deny = StatusCode::kUnsupported;
    return;
  }
  for (uint32_t i = 0; i < f->count && f->denied.empty(); ++i) {
    const uint64_t addr = f->addr(i), len = f->len(i);
    f->access.push_back(hooks_.region_access(addr, len, f->write));
    if (!f->access.back().allowed) {
      f->denied = " is not inside one registered region";
    } else if (f->write && !f->access.back().writable) {
      f->denied = " lies in a region that is read-only for peers";
    } else if (f->access.back().staged && hooks_.staging_bytes == 0) {
      f->denied =
          " is GPU memory, which this engine reaches only through staging buffers, and "
          "its staging is off";
      f->deny = StatusCode::kUnsupported;
    }
    if (!f->denied.empty()) {
      f->denied = "slice " + std::to_string(i) + " (" + std::to_string(len) + " bytes at " + Hex(addr) + ")" +
                  f->denied;
    }
    f->staged = f->staged || f->access.back().staged;
    f->iov.push_back({reinterpret_cast<void*>(addr), len});
  }
}

namespace {
// Whether connection fd failed (the peer reset it: it gave up on what it sent, Stream::Abort
// after a deadline or on a path it left), though the kernel still hands over the bytes queued
// before the reset. (SO_ERROR: a cheap look, once a frame.)
bool ResetByPeer(int fd) {
  int error = 0;
  socklen_t len = sizeof error;
  return ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) == 0 && error != 0;
}
}  // namespace

bool TcpTransport::LendStagingBuffer(Service& svc, Frame* f, std::unique_lock<std::timed_mutex>& exec,
                                     BufferPool::Lease* stage, std::string* why) {
  if (!f->staged || !f->denied.empty() ||
      target_staging_.Acquire(Clock::time_point{}, stage, svc.peer_incarnation).ok()) {
    return true;
  }
  // None free now: waited for without the exec lock (a fence need not wait for a frame that
  // has touched nothing, nor DropPeer), then the frame is looked at again as if it had just
  // come.
  exec.unlock();
  if (Status w = target_staging_.Acquire(f->deadline, stage, svc.peer_incarnation, &svc.shut); !w.ok()) {
    *why = "staged batch: " + w.message();
    return false;
  }
  if (svc.shut.load() || ResetByPeer(svc.fd.get())) {
    *why = "the connection was reset or shut down while its frame waited for a staging buffer; it is dropped";
    return false;
  }
  exec.lock();
  CheckRanges(f);
  if (!f->staged || !f->denied.empty()) *stage = BufferPool::Lease();  // (not kept while it drains)
  return true;
}

bool TcpTransport::ServeFrame(Service& svc, Frame* f, uint64_t* replied, std::string* why) {
  const int fd = svc.fd.get();
  // A frame read after its initiator reset the connection is not served: it may have sent the
  // batch again elsewhere since, and the memory may hold newer bytes by now. (Read long after
  // it came: while every thread was busy, say.)
  if (svc.shut.load() || ResetByPeer(fd)) {  // (shut: this engine ended it, DropPeer or a fence)
    *why = "the connection was reset or shut down; its last frame is dropped";
    return false;
  }
  auto io_deadline = [&] { return Clock::now() + opts_.io_timeout; };  // (a reply: a step of its own)
  *replied = 0;
  // A checksummed READ request: damage to its addresses shows before anything is read.
  if (!f->write && f->checksummed && checksum::Available() &&
      f->StartChecksum().Value() != Get<uint64_t>(&f->descs[f->count * kSliceBytes])) {
    const Status m = Mismatch("READ request", "at the target");
    Status s = SendReply(fd, m.code(), m.message(), io_deadline());
    if (!s.ok()) *why = "reply: " + s.message();
    return s.ok();
  }
  std::unique_lock exec(svc.exec);
  // Checked under the exec lock: a deregistration's fence either waits for this batch or this
  // check already sees the region gone.
  CheckRanges(f);
  BufferPool::Lease stage;  // a staged frame's buffer
  if (!LendStagingBuffer(svc, f, exec, &stage, why)) return false;
  const bool ok = f->denied.empty();
  Status s;
  uint64_t sum = 0;  // the checksum that came with a WRITE's payload
  bool intact = true;
  if (f->staged && ok) {
    const bool moved = ServeStaged(svc, *f, stage.data(), &intact, why);
    stage = BufferPool::Lease();  // (back before the reply: the peer's next frame may want it)
    exec.unlock();
    if (!moved) return false;
    if (!f->write) *replied = f->total;  // (as a direct READ's: the next frame is spun for)
    if (f->write)
      s = intact ? SendReply(fd, StatusCode::kOk, "", io_deadline()) : SendMismatch(fd, io_deadline());
  } else if (f->write) {
    if (ok && f->checksummed) {
      // Range by range, each hashed as it lands: ranges that overlap in our memory hold only
      // the last copy afterwards, which the sender's checksum did not see.
      const auto deadline = f->deadline;
      checksum::Running ours = f->StartChecksum();
      for (size_t i = 0; i < f->iov.size() && s.ok(); ++i) {
        s = net::RecvAll(fd, f->iov[i].iov_base, f->iov[i].iov_len, deadline);
        ours.Add(f->iov[i].iov_base, f->iov[i].iov_len);
      }
      iovec rest[2] = {{&sum, kTrailerBytes}, {PadSink(), f->tail}};
      if (s.ok()) s = net::RecvVWaitAll(fd, rest, 2, deadline);
      intact = !s.ok() || sum == ours.Value();
    } else if (ok) {
      f->iov.push_back({PadSink(), f->tail});
      s = net::RecvVWaitAll(fd, f->iov.data(), f->iov.size(), f->deadline);
    } else {  // refuse without touching memory: drain the payload to keep the stream framed
      // (checksummed: the refusal may come of damage, to an address say; the checksum says)
      exec.unlock();  // (a fence need not wait for bytes that go nowhere)
      static thread_local std::vector<uint8_t> scratch(64 << 10);
      std::optional<checksum::Running> ours;
      if (f->checksummed && checksum::Available()) ours.emplace(f->StartChecksum());
      uint8_t trailer[kTrailerBytes] = {};
      for (uint64_t at = 0, end = f->total + f->trailer() + f->tail; at < end && s.ok();) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(end - at, scratch.size()));
        s = net::RecvAll(fd, scratch.data(), n, f->deadline);
        const uint64_t lo = std::max(at, f->total), hi = std::min(at + n, f->total + f->trailer());
        for (uint64_t p = lo; p < hi; ++p) trailer[p - f->total] = scratch[p - at];  // (may straddle reads)
        if (ours && at < f->total)
          ours->Add(scratch.data(), static_cast<size_t>(std::min<uint64_t>(n, f->total - at)));
        at += n;
      }
      intact = !ours || Get<uint64_t>(trailer) == ours->Value();
    }
    if (exec.owns_lock()) exec.unlock();
    if (!s.ok()) {
      *why = "WRITE payload: " + s.message();
      return false;
    }
    s = !intact ? SendMismatch(fd, io_deadline())
                : SendReply(fd, ok ? StatusCode::kOk : f->deny, f->denied, io_deadline());
  } else if (ok) {
    uint8_t head_bytes[kReplyHeaderBytes + kAlign];
    const uint64_t head = ReadReplyHeader(head_bytes, f->iov[0].iov_base);
    if (f->checksummed) {
      checksum::Running ours = f->StartChecksum();
      for (const iovec& v : f->iov) ours.Add(v.iov_base, v.iov_len);
      sum = ours.Value();
      f->iov.push_back({&sum, kTrailerBytes});
    }
    f->iov.insert(f->iov.begin(), iovec{head_bytes, head});
    f->iov.push_back({const_cast<uint8_t*>(kZeros), PadFor(head + f->total + f->trailer(), 0)});
    s = net::SendVWaitAll(fd, f->iov.data(), f->iov.size(), io_deadline());
    *replied = f->total;
  } else {
    exec.unlock();
    s = SendReply(fd, f->deny, f->denied, io_deadline());
  }
  if (!s.ok()) *why = "reply: " + s.message();
  return s.ok();
}

namespace {

// A staged batch at the target, in steps: a range that is not staged moves straight between
// the socket and memory; staged ranges, consecutive ones gathered, move in pieces of at most
// `half` bytes through alternating halves of the staging buffer lent to the frame, so that the
// copy engines copy one piece while the socket moves the other (GPU memory; host memory is
// copied in turn, piece by piece, while the piece is still in the cache).
struct StagedStep {
  uint8_t* direct = nullptr;    // a range moved straight; null: a piece
  uint64_t len = 0;             // the range's bytes, or the piece's
  uint8_t* piece = nullptr;     // where the piece lies in the buffer
  bool device = false;          // the piece's memory is GPU memory
  size_t first = 0, count = 0;  // the piece's copies (memory as local sides, the buffer as remote)
};

void PlanStaged(std::span<const iovec> ranges, std::span<const TcpTargetAccess> access, uint8_t* buf,
                uint64_t half, std::vector<StagedStep>* steps, std::vector<Slice>* copies) {
  steps->clear();
  copies->clear();
  size_t pieces = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    auto* base = static_cast<uint8_t*>(ranges[i].iov_base);
    if (!access[i].staged) {
      steps->push_back({base, ranges[i].iov_len});
      continue;
    }
    for (uint64_t off = 0; off < ranges[i].iov_len;) {
      StagedStep* last = steps->empty() ? nullptr : &steps->back();
      if (last == nullptr || last->direct != nullptr || last->len == half ||
          last->device != access[i].device) {
        steps->push_back({nullptr, 0, buf + (pieces++ % 2) * half, access[i].device, copies->size(), 0});
        last = &steps->back();
      }
      const uint64_t n = std::min(half - last->len, ranges[i].iov_len - off);
      copies->push_back(
          {reinterpret_cast<uint64_t>(base + off), reinterpret_cast<uint64_t>(last->piece + last->len), n});
      last->len += n;
      ++last->count;
      off += n;
    }
  }
}

}  // namespace

bool TcpTransport::ServeStaged(Service& svc, const Frame& f, uint8_t* buffer, bool* intact,
                               std::string* why) {
  const bool write = f.write;
  const uint64_t total = f.total;
  uint64_t tail = f.tail;
  // The checksum, when the batch carries one, of the payload as it passes (the WRITE's, or the
  // READ reply's), each piece as it lands or leaves.
  std::optional<checksum::Running> sum;
  if (f.checksummed) sum.emplace(f.StartChecksum());
  const int fd = svc.fd.get();
  const auto deadline = f.deadline;  // (a READ's reply too: staged, it is one step with the copies)
  Status s;
  thread_local std::vector<StagedStep> steps;
  thread_local std::vector<Slice> copies;
  PlanStaged(f.iov, f.access, buffer, target_staging_.buffer_bytes() / 2, &steps, &copies);
  const auto copies_of = [&](const StagedStep& p) { return std::span(copies).subspan(p.first, p.count); };
  PendingCopy pending;  // WRITE: the last piece's copy out of the buffer; READ: the next's into it
  if (write) {
    for (size_t k = 0; k < steps.size() && s.ok(); ++k) {
      const StagedStep& p = steps[k];
      uint8_t* at = p.direct != nullptr ? p.direct : p.piece;
      // (Finished before memory is written again: descriptors may overlap, the last one wins.)
      if (p.direct != nullptr) s = pending.Finish(deadline);
      if (s.ok()) s = net::RecvAll(fd, at, p.len, deadline);
      if (s.ok() && sum) sum->Add(at, p.len);
      if (s.ok() && p.direct == nullptr) s = pending.Finish(deadline);
      if (s.ok() && p.direct == nullptr) s = pending.Start(false, copies_of(p), p.device);
    }
    if (s.ok()) s = pending.Finish(deadline);
  } else {
    uint8_t ok[kReplyHeaderBytes + kAlign];
    const uint64_t head = ReadReplyHeader(ok, f.iov[0].iov_base);
    s = net::SendAll(fd, ok, head, deadline);
    tail = PadFor(head + total + f.trailer(), 0);
    size_t copied = steps.size();  // the piece whose copy into the buffer was started last
    for (size_t k = 0; k < steps.size() && s.ok(); ++k) {
      const StagedStep& p = steps[k];
      if (p.direct == nullptr) {
        if (copied != k) s = pending.Start(true, copies_of(p), p.device);
        if (s.ok()) s = pending.Finish(deadline);
        // The next piece's copy, into the other half, while this one is sent.
        size_t next = k + 1;
        while (next < steps.size() && steps[next].direct != nullptr) ++next;
        if (s.ok() && next < steps.size()) {
          s = pending.Start(true, copies_of(steps[next]), steps[next].device);
          copied = next;
        }
      }
      uint8_t* at = p.direct != nullptr ? p.direct : p.piece;
      if (s.ok() && sum) sum->Add(at, p.len);
      if (s.ok()) s = net::SendAll(fd, at, p.len, deadline);
    }
  }
  // The checksum, when the batch carries one, and the frame's padding. (A failed copy closes
  // the connection: the initiator's batch then fails with the link, rather than the stream
  // losing its framing.)
  uint64_t theirs = 0;
  const uint64_t ours = sum ? sum->Value() : 0;
  if (s.ok() && f.checksummed) {
    s = write ? net::RecvAll(fd, &theirs, kTrailerBytes, deadline)
              : net::SendAll(fd, &ours, kTrailerBytes, deadline);
  }
  *intact = !write || !f.checksummed || theirs == ours;
  if (s.ok())
    s = write ? net::RecvAll(fd, PadSink(), tail, deadline) : net::SendAll(fd, kZeros, tail, deadline);
  if (!s.ok()) *why = "staged batch: " + s.message();
  return s.ok();
}

void TcpTransport::DropPeer(uint64_t incarnation) {
  std::lock_guard l(services_mu_);
  for (auto& s : services_) {
    if (s->peer_incarnation == incarnation) s->Shutdown();
  }
}

void TcpTransport::Fence(Clock::time_point deadline) {
  std::list<std::shared_ptr<Service>> all;
  {
    std::lock_guard l(services_mu_);
    all = services_;
  }
  // Every batch ends within io_timeout of its start, but batch after batch could hold a fence
  // that waits for one connection after the other: one deadline for them all, and a connection
  // still busy then is closed.
  for (auto& s : all) {
    std::unique_lock l(s->exec, deadline);
    if (l.owns_lock()) continue;
    XLOG(WARN) << "tcp: a peer's batch still held this engine's memory at the fence's deadline; "
               << "closed its data connection";
    s->Shutdown();
    l.lock();  // (its I/O fails at once now)
  }
}

}  // namespace xfer::transport
