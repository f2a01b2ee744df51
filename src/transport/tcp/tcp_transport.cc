#include "transport/tcp/tcp_transport.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <optional>
#include <system_error>
#include <thread>
#include <cstring>
#include <vector>

#include "transport/staging.h"
#include "util/checksum.h"
#include "util/crypto.h"
#include "util/log.h"
#include "util/text.h"

namespace xfer::transport {
using text::Hex;
namespace {

constexpr uint32_t kDataMagic = 0x31444658;  // "XFD1"
constexpr uint16_t kDataVersion = 4;  // 3: the challenge of an authenticated engine; 4: checksums
constexpr size_t kHelloBytes = 64;  // 24 used

// With a secret, the target answers the hello with a fresh nonce and the initiator proves it
// knows the session key its control session derived (control/auth.h): the incarnations in the
// hello are then no credential. The proof covers the nonce and both incarnations.
crypto::Mac DataProof(const std::string& key, const uint8_t* nonce, uint64_t target, uint64_t initiator) {
  std::string m = "xfer-data-v1";
  m.append(reinterpret_cast<const char*>(nonce), crypto::kNonceBytes);
  m.append(reinterpret_cast<const char*>(&target), sizeof target);
  m.append(reinterpret_cast<const char*>(&initiator), sizeof initiator);
  return crypto::Hmac(crypto::Bytes(key), crypto::Bytes(m));
}
constexpr size_t kAcceptBytes = 64;  // 4 used
// Batch flags (the header's third byte).
constexpr uint8_t kChecksummed = 1;  // the payload is followed by its checksum (kTrailerBytes)
constexpr uint64_t kTrailerBytes = 8;

// A checksummed batch's checksum covers its header and descriptors as sent, then its payload:
// damage to an address is caught as well as damage to the data.
// (payload: the batch's local memory)
uint64_t ChecksumOf(std::span<const uint8_t> head, std::span<const Slice> payload) {
  checksum::Running sum;
  sum.Add(head.data(), head.size());
  for (const Slice& s : payload) sum.Add(reinterpret_cast<const void*>(s.local), s.len);
  return sum.Value();
}
Status Mismatch(std::string_view op, std::string_view where) {
  return {StatusCode::kDataCorrupted, "tcp: the checksum of a " + std::string(op) + " batch did not match " +
                                          std::string(where) + ": bytes were damaged on the way"};
}
constexpr size_t kBatchHeaderBytes = 16;
constexpr size_t kSliceBytes = 16;
constexpr size_t kReplyHeaderBytes = 8;
constexpr uint32_t kMaxMessage = 4096;
constexpr auto kForever = Clock::time_point::max();

// Every frame is a whole number of kAlign bytes, and a payload starts at a frame offset with
// the same remainder mod kAlign as its source address. The kernel copies a thread's sends into
// consecutive offsets of page fragments, so the copy into the socket then runs with source and
// destination equally aligned; misaligned, it runs at half the speed on this machine's AMD
// cores (READ was 1.7 GB/s with an 8-byte reply header in front of the payload, 3.2 with 64).
constexpr uint64_t kAlign = 64;
constexpr uint8_t kZeros[kAlign] = {};
uint64_t PadFor(uint64_t pos, uint64_t want) { return (want - pos) & (kAlign - 1); }
uint8_t* PadSink() {
  static thread_local uint8_t sink[kAlign];
  return sink;
}

template <class T>
void Put(uint8_t* p, T v) { std::memcpy(p, &v, sizeof v); }
template <class T>
T Get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// How fast an initiator is assumed to read a READ reply out of its socket (~2 GB/s: loopback
// here does 2.5-3.5), for how long the target spins after sending one, and the most it spins.
constexpr uint64_t kDrainBytesPerUs = 2000;
constexpr uint64_t kMaxDrainSpinUs = 1000;

// Large socket buffers keep a link busy across the round trip that ends each batch. Data
// sockets block, so bulk transfers wait in the kernel (MSG_WAITALL) rather than wake up once
// per segment; small reads pass MSG_DONTWAIT, spin briefly, then poll.
void TuneSocket(int fd) {
  net::SetNoDelay(fd);
  net::SetBlocking(fd);
  int size = 4 << 20;
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
}

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

// Reads a reply up to its payload; *verdict is the target's. When a payload of payload_bytes
// follows (a READ the target accepted), *tail is the padding after it, else everything is read.
Status RecvReply(int fd, uint64_t payload_bytes, Clock::time_point deadline,
                 std::chrono::microseconds spin, Status* verdict, uint64_t* tail) {
  uint8_t h[kReplyHeaderBytes];
  Status s = net::RecvAll(fd, h, sizeof h, deadline, spin);
  if (!s.ok()) return s;
  const uint32_t code = Get<uint32_t>(h);
  const uint16_t len = Get<uint16_t>(h + 4), lead = Get<uint16_t>(h + 6);
  if (code > static_cast<uint32_t>(kLastStatusCode) || len > kMaxMessage ||
      lead >= kAlign || (code != 0 && lead != 0)) {
    return {StatusCode::kConnectionLost, "tcp: malformed reply from the target"};
  }
  if (code != 0) payload_bytes = 0;
  const uint64_t head = kReplyHeaderBytes + len + lead;
  *tail = PadFor(head + payload_bytes, 0);
  uint8_t rest[kMaxMessage + 2 * kAlign];  // message, lead and tail: no allocation per reply
  s = net::RecvAll(fd, rest, len + lead + (payload_bytes ? 0 : *tail), deadline);
  if (!s.ok()) return s;
  *verdict = code == 0 ? Status::Ok()
                       : Status(static_cast<StatusCode>(code),
                                "target: " + std::string(reinterpret_cast<char*>(rest), len));
  return Status::Ok();
}

// ---------------------------------------------------------------- initiator side
// One data connection. Batches are pipelined: a thread sends its frame, then waits for its turn
// to read the reply while the next thread already sends, so the target has the next frame at
// hand when it finishes one. Replies come back in frame order.
struct Stream {
  net::Fd fd;
  uint64_t sent = 0;  // frames sent; written only under the owning Conn's send_mu

  std::mutex mu;
  std::condition_variable turn;
  uint64_t received = 0;  // replies read
  bool broken = false;
  std::string why;        // set with broken

  // Frames may be half sent or half read: nobody may use the stream again. Wakes everyone
  // blocked on it. False when another batch had broken it already (then its reason stands).
  bool Break(const std::string& reason) {
    std::lock_guard l(mu);
    if (broken) return false;
    why = reason;
    broken = true;
    ::shutdown(fd.get(), SHUT_RDWR);
    turn.notify_all();
    return true;
  }
  bool IsBroken() {
    std::lock_guard l(mu);
    return broken;
  }
};

class TcpLink final : public Link {
 public:
  TcpLink(PeerEndpoint peer, uint64_t my_incarnation, TcpOptions opts)
      : peer_(std::move(peer)), me_(my_incarnation), opts_(opts) {
    for (int i = 0; i < std::max(opts.links, 1); ++i) conns_.push_back(std::make_unique<Conn>());
  }

  Status Execute(Op op, std::span<const Slice> batch, Clock::time_point deadline) override {
    Conn& c = Pick();
    c.busy.fetch_add(1);
    Status s = Attempt(c, op, batch, deadline);
    // Damaged on the way (a checksum did not match): batches are idempotent, so once more.
    if (s.code() == StatusCode::kDataCorrupted && !shut_.load() && Clock::now() < deadline) {
      XLOG(WARN) << s.message() << " (peer " << peer_.host << "); trying the batch once more";
      s = Attempt(c, op, batch, deadline);
    }
    c.busy.fetch_sub(1);
    if (!s.ok() && shut_.load()) return Gone();
    return s;
  }

  void Shutdown() override {
    shut_.store(true);
    for (auto& c : conns_) {
      std::lock_guard l(c->stream_mu);
      if (c->stream) c->stream->Break("the session ended");
    }
  }

 private:
  struct Conn {
    std::mutex send_mu;                // one frame on the wire at a time
    std::mutex stream_mu;              // guards replacing stream against Shutdown()
    std::shared_ptr<Stream> stream;    // the current connection; replaced once broken
    std::atomic<int> busy{0};          // batches on this connection now
  };

  Status Gone() const {
    return {StatusCode::kConnectionLost, "tcp: the session with " + peer_.host + " ended"};
  }

  Conn& Pick() {
    if (opts_.least_loaded) {
      Conn* best = conns_[0].get();
      for (auto& c : conns_) {
        if (c->busy.load() < best->busy.load()) best = c.get();
      }
      return *best;
    }
    return *conns_[rr_.fetch_add(1) % conns_.size()];
  }

  // A batch lost only because another batch broke the shared stream (its deadline passed,
  // say) is tried again on a fresh one while its own deadline allows: batches are
  // idempotent. A dead peer ends this at once: opening a stream to it fails.
  Status Attempt(Conn& c, Op op, std::span<const Slice> batch, Clock::time_point deadline) {
    bool bystander = false;
    Status s = ExecuteOn(c, op, batch, deadline, &bystander);
    while (bystander && !shut_.load() && Clock::now() < deadline) {
      s = ExecuteOn(c, op, batch, deadline, &bystander);
    }
    return s;
  }

  // This batch's I/O failed: break the stream, unless another batch broke it first (a passed
  // deadline of its own, say), which is what failed this one: then it may be retried.
  static Status Broken(Stream& st, const char* what, const Status& s, bool* bystander) {
    if (st.Break(what + s.message())) return s;
    *bystander = true;
    std::lock_guard l(st.mu);
    return {StatusCode::kConnectionLost, "tcp: data connection lost: " + st.why};
  }

  // Sends the frame, then reads the reply in turn. *bystander: the batch failed only because
  // another one broke the stream before this one's turn came.
  Status ExecuteOn(Conn& c, Op op, std::span<const Slice> batch, Clock::time_point deadline,
                   bool* bystander) {
    *bystander = false;
    // The frame up to its payload, and a WRITE's checksum: built before the send lock, so that
    // another batch's frame may go out meanwhile.
    FrameHead head(op, batch, opts_.checksum);
    // (A READ's covers its request: header and descriptors.)
    const uint64_t sum =
        opts_.checksum ? ChecksumOf(head.Checked(), op == Op::kWrite ? batch : std::span<const Slice>()) : 0;
    std::shared_ptr<Stream> st;
    uint64_t ticket = 0;
    {
      std::unique_lock sl(c.send_mu);
      if (shut_.load()) return Gone();
      {
        std::lock_guard l(c.stream_mu);
        st = c.stream;
      }
      if (!st || st->IsBroken()) {
        Status s = Open(c, deadline, &st);
        if (!s.ok()) return s;
      }
      ticket = st->sent++;
      Status s = SendFrame(st->fd.get(), head, batch, sum, deadline);
      if (!s.ok()) return Broken(*st, "a frame could not be sent: ", s, bystander);
    }
    {
      std::unique_lock l(st->mu);
      const bool my_turn = st->turn.wait_until(
          l, deadline, [&] { return st->received == ticket || st->broken; });
      if (st->broken) {
        *bystander = true;
        return {StatusCode::kConnectionLost, "tcp: data connection lost: " + st->why};
      }
      if (!my_turn) {
        l.unlock();
        st->Break("a batch's deadline passed while it waited for its reply");
        return {StatusCode::kTimeout, "tcp: deadline passed waiting for the target's reply"};
      }
    }
    bool framed = false;
    Status s = ReadReply(st->fd.get(), head, batch, deadline, &framed);
    if (!framed) return Broken(*st, "a reply could not be read: ", s, bystander);
    std::lock_guard l(st->mu);
    ++st->received;
    st->turn.notify_all();
    return s;
  }

  // A batch whose deadline ends the connect or handshake timed out; anything else lost the
  // link.
  static Status OpenFailed(const std::string& what, const Status& s) {
    return {s.code() == StatusCode::kTimeout ? StatusCode::kTimeout : StatusCode::kConnectionLost,
            "tcp: " + what + s.message()};
  }

  // Opens c's next stream (c.send_mu held). It is c's stream from the connect on, before the
  // handshake, so that Shutdown breaks a handshake that a hung peer never answers.
  Status Open(Conn& c, Clock::time_point deadline, std::shared_ptr<Stream>* out) {
    auto st = std::make_shared<Stream>();
    Status s = net::ConnectTcp(net::Address{peer_.host, peer_.tcp_port, true}, deadline, &st->fd);
    if (!s.ok()) return OpenFailed("", s);
    {
      std::lock_guard l(c.stream_mu);
      if (shut_.load()) return Gone();
      c.stream = st;
    }
    s = Handshake(*st, deadline);
    if (!s.ok()) {
      st->Break("the data connection's handshake failed");
      return s;
    }
    *out = std::move(st);
    return Status::Ok();
  }

  Status Handshake(Stream& st, Clock::time_point deadline) const {
    const int fd = st.fd.get();
    TuneSocket(fd);
    uint8_t hello[kHelloBytes] = {};
    Put<uint32_t>(hello, kDataMagic);
    Put<uint16_t>(hello + 4, kDataVersion);
    Put<uint64_t>(hello + 8, peer_.incarnation);
    Put<uint64_t>(hello + 16, me_);
    Status s = net::SendAll(fd, hello, sizeof hello, deadline);
    if (s.ok() && !peer_.auth_key.empty()) {
      uint8_t nonce[crypto::kNonceBytes];
      s = net::RecvAll(fd, nonce, sizeof nonce, deadline);
      const crypto::Mac proof = DataProof(peer_.auth_key, nonce, peer_.incarnation, me_);
      if (s.ok()) s = net::SendAll(fd, proof.data(), proof.size(), deadline);
    }
    uint8_t code[kAcceptBytes];
    if (s.ok()) s = net::RecvAll(fd, code, sizeof code, deadline);
    if (!s.ok()) return OpenFailed("data connection handshake: ", s);
    if (Get<uint32_t>(code) == static_cast<uint32_t>(StatusCode::kResourceExhausted)) {
      return {StatusCode::kResourceExhausted, "tcp: the target refused the data connection: this engine holds as many as it allows"};
    }
    if (Get<uint32_t>(code) != 0) {
      return {StatusCode::kConnectionLost, "tcp: the target refused the data connection (restarted?)"};
    }
    return Status::Ok();
  }

  // A batch's frame up to its payload: header, descriptors, and for WRITE the zeros that
  // align the payload with its source.
  struct FrameHead {
    FrameHead(Op op, std::span<const Slice> batch, bool checksummed)
        : write(op == Op::kWrite), checksummed(checksummed) {
      for (const Slice& s : batch) total += s.len;
      prefix = kBatchHeaderBytes + batch.size() * kSliceBytes;
      const uint64_t lead = write ? PadFor(prefix, batch[0].local) : 0;
      bytes.assign(prefix + lead, 0);
      bytes[0] = static_cast<uint8_t>(op);
      bytes[1] = static_cast<uint8_t>(lead);
      bytes[2] = checksummed ? kChecksummed : 0;
      Put<uint32_t>(bytes.data() + 4, static_cast<uint32_t>(batch.size()));
      Put<uint64_t>(bytes.data() + 8, total);
      for (size_t i = 0; i < batch.size(); ++i) {
        Put<uint64_t>(bytes.data() + kBatchHeaderBytes + i * kSliceBytes, batch[i].remote);
        Put<uint64_t>(bytes.data() + kBatchHeaderBytes + i * kSliceBytes + 8, batch[i].len);
      }
    }
    std::span<const uint8_t> Checked() const { return {bytes.data(), prefix}; }  // header, descriptors
    uint64_t trailer() const { return checksummed ? kTrailerBytes : 0; }
    const bool write, checksummed;
    uint64_t total = 0, prefix = 0;
    std::vector<uint8_t> bytes;
  };

  // The frame: its head, for WRITE the payload straight from the source memory, and when
  // checksummed the checksum sum (a WRITE's of head and payload, a READ's of its head).
  static Status SendFrame(int fd, const FrameHead& head, std::span<const Slice> batch, uint64_t sum,
                          Clock::time_point deadline) {
    const uint64_t tail = PadFor(head.bytes.size() + (head.write ? head.total : 0) + head.trailer(), 0);
    std::vector<iovec> iov;
    iov.reserve(batch.size() + 3);
    iov.push_back({const_cast<uint8_t*>(head.bytes.data()), head.bytes.size()});
    if (head.write) {
      for (const Slice& s : batch) iov.push_back({reinterpret_cast<void*>(s.local), s.len});
    }
    if (head.checksummed) iov.push_back({&sum, kTrailerBytes});
    iov.push_back({const_cast<uint8_t*>(kZeros), tail});
    return net::SendVWaitAll(fd, iov.data(), iov.size(), deadline);
  }

  // The target's verdict and, for an accepted READ, the payload into the local memory (and its
  // checksum checked). *framed: the reply was read whole (the stream can carry the next one).
  Status ReadReply(int fd, const FrameHead& head, std::span<const Slice> batch,
                   Clock::time_point deadline, bool* framed) const {
    *framed = false;
    Status verdict;
    uint64_t tail = 0;
    const uint64_t follows = head.write ? 0 : head.total + head.trailer();
    Status s = RecvReply(fd, follows, deadline, opts_.spin, &verdict, &tail);
    if (!s.ok()) return s;
    if (!verdict.ok() || head.write) {
      *framed = true;
      return verdict;
    }
    uint64_t theirs = 0;
    if (head.checksummed) {
      // Range by range, each hashed as it lands: ranges that overlap in local memory hold
      // only the last copy afterwards, which the sender's checksum did not see.
      checksum::Running ours;
      ours.Add(head.bytes.data(), head.prefix);
      for (const Slice& sl : batch) {
        if (s = net::RecvAll(fd, reinterpret_cast<void*>(sl.local), sl.len, deadline); !s.ok()) return s;
        ours.Add(reinterpret_cast<const void*>(sl.local), sl.len);
      }
      iovec rest[2] = {{&theirs, kTrailerBytes}, {PadSink(), tail}};
      if (s = net::RecvVWaitAll(fd, rest, 2, deadline); !s.ok()) return s;
      *framed = true;
      return theirs == ours.Value() ? Status::Ok() : Mismatch("READ", "here");
    }
    std::vector<iovec> iov;
    iov.reserve(batch.size() + 1);
    for (const Slice& sl : batch) iov.push_back({reinterpret_cast<void*>(sl.local), sl.len});
    iov.push_back({PadSink(), tail});
    s = net::RecvVWaitAll(fd, iov.data(), iov.size(), deadline);
    *framed = s.ok();
    return s;
  }

  const PeerEndpoint peer_;
  const uint64_t me_;
  const TcpOptions opts_;
  std::vector<std::unique_ptr<Conn>> conns_;
  std::atomic<uint32_t> rr_{0};
  std::atomic<bool> shut_{false};
};

}  // namespace

// ---------------------------------------------------------------- target side
struct TcpTransport::Service {
  std::mutex fd_mu;  // guards closing fd against Shutdown()
  net::Fd fd;
  std::mutex exec;   // held while a batch touches this engine's memory: Fence() takes it
  std::atomic<uint64_t> peer_incarnation{0};
  std::unique_ptr<StagingBuffer> stage;  // staged batches (GPU memory); the serving thread's
  std::thread thread;
  std::atomic<bool> handshaken{false};  // the peer proved who it is
  std::atomic<bool> done{false};

  void Shutdown() {
    std::lock_guard l(fd_mu);
    if (fd.valid()) ::shutdown(fd.get(), SHUT_RDWR);
  }
};

TcpTransport::TcpTransport(TcpOptions opts, TcpTargetHooks hooks)
    : opts_(opts), hooks_(std::move(hooks)) {}

TcpTransport::~TcpTransport() { Stop(); }

Status TcpTransport::Start(const std::string& host) {
  net::Address bound;
  Status s = net::Listen(net::Address{host, 0, true}, &listener_, &bound);
  if (!s.ok()) return s;
  port_ = bound.port;
  acceptor_ = std::thread([this] { AcceptLoop(); });
  return Status::Ok();
}

void TcpTransport::Stop() {
  if (stop_.exchange(true)) return;
  if (listener_.valid()) ::shutdown(listener_.get(), SHUT_RDWR);  // wakes the acceptor's poll
  if (acceptor_.joinable()) acceptor_.join();
  std::list<std::shared_ptr<Service>> all;
  {
    std::lock_guard l(services_mu_);
    all.swap(services_);
  }
  for (auto& s : all) s->Shutdown();
  for (auto& s : all) {
    if (s->thread.joinable()) s->thread.join();
  }
}

void TcpTransport::AcceptLoop() {
  while (!stop_.load()) {
    pollfd p{listener_.get(), POLLIN, 0};
    ::poll(&p, 1, 1000);
    {  // reap services whose connection ended
      std::lock_guard l(services_mu_);
      for (auto it = services_.begin(); it != services_.end();) {
        if ((*it)->done.load()) {
          (*it)->thread.join();
          it = services_.erase(it);
        } else {
          ++it;
        }
      }
    }
    int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (accept_pause_.Shortage(errno)) {  // out of fds: accepting again now would spin
        while (!accept_pause_.Over() && !stop_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      continue;
    }
    TuneSocket(fd);
    auto svc = std::make_shared<Service>();
    svc->fd = net::Fd(fd);
    std::lock_guard l(services_mu_);
    const auto pending = std::count_if(services_.begin(), services_.end(),
                                       [](const auto& s) { return !s->handshaken.load() && !s->done.load(); });
    if (static_cast<size_t>(pending) >= kMaxPendingHandshakes) {  // a flood of strangers: refuse the excess
      std::lock_guard rl(refusal_log_mu_);
      if (uint64_t more = 0; refusal_log_.Due(&more)) {
        XLOG(WARN) << "tcp: " << kMaxPendingHandshakes << " data connections have not finished their "
                   << "handshake; closed the one from " << net::PeerOf(fd) << log::Limit::More(more);
      }
      continue;  // (svc, and with it the connection, goes here)
    }
    try {
      svc->thread = std::thread([this, svc] { Serve(svc); });
    } catch (const std::system_error& e) {  // no thread to be had: refuse this one connection
      XLOG(WARN) << "tcp: refused a data connection from " << net::PeerOf(fd)
                 << ": cannot start its thread (" << e.what() << ")";
      continue;  // (svc, and with it the connection, goes here)
    }
    services_.push_back(svc);
  }
}

// One batch frame as the target reads it, and what its check found (buffers reused).
struct TcpTransport::Frame {
  bool write = false;
  bool checksummed = false;    // WRITE: a checksum follows the payload; READ: the reply's must
  uint32_t count = 0;
  uint64_t total = 0, tail = 0;
  std::vector<uint8_t> descs;  // count x {addr, len}, then padding (READ: to the frame's end)
  std::vector<iovec> iov;      // the ranges, once checked
  std::vector<TcpTargetAccess> access;
  bool staged = false;         // some range goes through the staging buffer
  std::string denied;          // why the batch is refused; empty: accepted
  StatusCode deny = StatusCode::kRemoteAccessDenied;
  uint8_t header[kBatchHeaderBytes] = {};
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

void TcpTransport::Serve(std::shared_ptr<Service> svc) {
  std::string why;
  Frame f;
  uint64_t replied = 0;  // payload bytes of the READ reply just sent
  if (Handshake(*svc, &why)) {
    while (ReadFrame(*svc, replied, &f, &why) && ServeFrame(*svc, &f, &replied, &why)) {
    }
  }
  if (!why.empty()) XLOG(WARN) << "tcp: closing a data connection: " << why;
  std::lock_guard l(svc->fd_mu);
  svc->fd.Reset();
  svc->done.store(true);
}

bool TcpTransport::Handshake(Service& svc, std::string* why) {
  const int fd = svc.fd.get();
  uint8_t hello[kHelloBytes];
  if (!net::RecvAll(fd, hello, sizeof hello, Clock::now() + opts_.io_timeout).ok()) {
    *why = "no handshake";
    return false;
  }
  if (Get<uint32_t>(hello) != kDataMagic || Get<uint16_t>(hello + 4) != kDataVersion) {
    *why = "not an xfer data connection";
    return false;
  }
  uint8_t refuse[kAcceptBytes] = {};
  if (Get<uint64_t>(hello + 8) != hooks_.incarnation || !hooks_.is_peer(Get<uint64_t>(hello + 16))) {
    Put<uint32_t>(refuse, static_cast<uint32_t>(StatusCode::kConnectionLost));
  }
  if (hooks_.authenticate) {
    const std::string key = Get<uint32_t>(refuse) != 0 ? "" : hooks_.peer_auth_key(Get<uint64_t>(hello + 16));
    *why = "";  // (refusals are logged here, at most once a second)
    if (key.empty()) return false;  // a stranger: closed without a challenge
    if (!Authenticate(fd, key, Get<uint64_t>(hello + 16))) {
      std::lock_guard l(refusal_log_mu_);
      if (uint64_t more = 0; refusal_log_.Due(&more)) {
        XLOG(WARN) << "tcp: refused the data connection from " << net::PeerOf(fd)
                   << ": it did not prove it knows its control session's key" << log::Limit::More(more);
      }
      return false;
    }
  }
  svc.peer_incarnation = Get<uint64_t>(hello + 16);
  if (Get<uint32_t>(refuse) == 0 && ConnectionsOf(svc.peer_incarnation) >= kMaxConnectionsPerPeer) {
    Put<uint32_t>(refuse, static_cast<uint32_t>(StatusCode::kResourceExhausted));
    std::lock_guard l(refusal_log_mu_);
    if (uint64_t more = 0; refusal_log_.Due(&more)) {
      XLOG(WARN) << "tcp: refused a data connection from " << net::PeerOf(fd) << ": its engine has "
                 << kMaxConnectionsPerPeer << " already" << log::Limit::More(more);
    }
  }
  const bool refused = Get<uint32_t>(refuse) != 0;
  svc.handshaken.store(!refused);  // (counted from here: the peer may open the next at once)
  if (!net::SendAll(fd, refuse, sizeof refuse, Clock::now() + opts_.io_timeout).ok()) {
    *why = refused ? "" : "handshake reply failed";
    return false;
  }
  return !refused;  // (a refused stranger is closed without a warning)
}

size_t TcpTransport::ConnectionsOf(uint64_t incarnation) {
  std::lock_guard l(services_mu_);
  return static_cast<size_t>(std::count_if(services_.begin(), services_.end(), [&](const auto& s) {
    return s->handshaken.load() && !s->done.load() && s->peer_incarnation.load() == incarnation;
  }));
}

bool TcpTransport::Authenticate(int fd, const std::string& key, uint64_t initiator) {
  const crypto::Nonce nonce = crypto::RandomNonce();
  uint8_t proof[crypto::kMacBytes];
  const auto deadline = Clock::now() + opts_.io_timeout;
  if (!net::SendAll(fd, nonce.data(), nonce.size(), deadline).ok() ||
      !net::RecvAll(fd, proof, sizeof proof, deadline).ok()) {
    return false;
  }
  return crypto::Equal(proof, DataProof(key, nonce.data(), hooks_.incarnation, initiator));
}

bool TcpTransport::ReadFrame(Service& svc, uint64_t replied, Frame* f, std::string* why) {
  const int fd = svc.fd.get();
  uint8_t h[kBatchHeaderBytes];
  // A READ reply sits in the socket buffers until the initiator has read it, and only then
  // does its next batch come: spin through that drain too, or every such request would pay
  // this thread's wake-up. (spin = 0 still turns spinning off.)
  const auto drain = std::chrono::microseconds(
      opts_.spin.count() > 0 ? std::min(replied / kDrainBytesPerUs, kMaxDrainSpinUs) : 0);
  // Idle until the next batch; its end closes the connection without a word.
  if (!net::RecvAll(fd, h, sizeof h, kForever, opts_.spin + drain).ok()) return false;
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
  if (!net::RecvAll(fd, f->descs.data(), f->descs.size(), Clock::now() + opts_.io_timeout, opts_.spin).ok()) {
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
      f->denied = " is GPU memory, which this engine reaches only through staging buffers, and "
                  "its staging is off";
      f->deny = StatusCode::kUnsupported;
    }
    if (!f->denied.empty()) {
      f->denied = "slice " + std::to_string(i) + " (" + std::to_string(len) + " bytes at " +
                  Hex(addr) + ")" + f->denied;
    }
    f->staged = f->staged || f->access.back().staged;
    f->iov.push_back({reinterpret_cast<void*>(addr), len});
  }
}

bool TcpTransport::ServeFrame(Service& svc, Frame* f, uint64_t* replied, std::string* why) {
  const int fd = svc.fd.get();
  auto io_deadline = [&] { return Clock::now() + opts_.io_timeout; };
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
  const bool ok = f->denied.empty();
  Status s;
  uint64_t sum = 0;  // the checksum that came with a WRITE's payload
  bool intact = true;
  if (f->staged && ok) {
    const bool moved = ServeStaged(svc, *f, &intact, why);
    exec.unlock();
    if (!moved) return false;
    if (f->write) s = intact ? SendReply(fd, StatusCode::kOk, "", io_deadline()) : SendMismatch(fd, io_deadline());
  } else if (f->write) {
    if (ok && f->checksummed) {
      // Range by range, each hashed as it lands: ranges that overlap in our memory hold only
      // the last copy afterwards, which the sender's checksum did not see.
      const auto deadline = io_deadline();
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
      s = net::RecvVWaitAll(fd, f->iov.data(), f->iov.size(), io_deadline());
    } else {  // refuse without touching memory: drain the payload to keep the stream framed
      // (checksummed: the refusal may come of damage, to an address say; the checksum says)
      static thread_local std::vector<uint8_t> scratch(64 << 10);
      std::optional<checksum::Running> ours;
      if (f->checksummed && checksum::Available()) ours.emplace(f->StartChecksum());
      uint8_t trailer[kTrailerBytes] = {};
      for (uint64_t at = 0, end = f->total + f->trailer() + f->tail; at < end && s.ok();) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(end - at, scratch.size()));
        s = net::RecvAll(fd, scratch.data(), n, io_deadline());
        const uint64_t lo = std::max(at, f->total), hi = std::min(at + n, f->total + f->trailer());
        for (uint64_t p = lo; p < hi; ++p) trailer[p - f->total] = scratch[p - at];  // (may straddle reads)
        if (ours && at < f->total) ours->Add(scratch.data(), static_cast<size_t>(std::min<uint64_t>(n, f->total - at)));
        at += n;
      }
      intact = !ours || Get<uint64_t>(trailer) == ours->Value();
    }
    exec.unlock();
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

bool TcpTransport::ServeStaged(Service& svc, const Frame& f, bool* intact, std::string* why) {
  const bool write = f.write;
  const std::span<const iovec> ranges = f.iov;
  const std::span<const TcpTargetAccess> access = f.access;
  const uint64_t total = f.total;
  uint64_t tail = f.tail;
  // The checksum, when the batch carries one, of the payload as it passes (the WRITE's, or the
  // READ reply's), each piece as it lands or leaves.
  std::optional<checksum::Running> sum;
  if (f.checksummed) sum.emplace(f.StartChecksum());
  const int fd = svc.fd.get();
  const auto deadline = Clock::now() + opts_.io_timeout;
  const uint64_t piece = hooks_.staging_bytes;
  Status s;
  if (!svc.stage) s = StagingBuffer::Allocate(piece, &svc.stage);
  uint8_t* buf = svc.stage ? svc.stage->data() : nullptr;
  if (s.ok() && !write) {
    uint8_t ok[kReplyHeaderBytes + kAlign];
    const uint64_t head = ReadReplyHeader(ok, ranges[0].iov_base);
    s = net::SendAll(fd, ok, head, deadline);
    tail = PadFor(head + total + f.trailer(), 0);
  }
  for (size_t i = 0; i < ranges.size() && s.ok(); ++i) {
    auto* base = static_cast<uint8_t*>(ranges[i].iov_base);
    if (!access[i].staged) {
      if (!write && sum) sum->Add(base, ranges[i].iov_len);
      s = write ? net::RecvAll(fd, base, ranges[i].iov_len, deadline)
                : net::SendAll(fd, base, ranges[i].iov_len, deadline);
      if (s.ok() && write && sum) sum->Add(base, ranges[i].iov_len);
      continue;
    }
    for (uint64_t off = 0; off < ranges[i].iov_len && s.ok(); off += piece) {
      const uint64_t n = std::min<uint64_t>(piece, ranges[i].iov_len - off);
      const Slice copy{reinterpret_cast<uint64_t>(base + off), reinterpret_cast<uint64_t>(buf), n};
      if (write) {
        s = net::RecvAll(fd, buf, n, deadline);
        if (s.ok() && sum) sum->Add(buf, n);
        if (s.ok()) s = StageCopy(false, std::span(&copy, 1), access[i].device, deadline);
      } else {
        s = StageCopy(true, std::span(&copy, 1), access[i].device, deadline);
        if (s.ok() && sum) sum->Add(buf, n);
        if (s.ok()) s = net::SendAll(fd, buf, n, deadline);
      }
    }
  }
  // The checksum, when the batch carries one, and the frame's padding. (A failed copy closes
  // the connection: the initiator's batch then fails with the link, rather than the stream
  // losing its framing.)
  uint64_t theirs = 0;
  const uint64_t ours = sum ? sum->Value() : 0;
  if (s.ok() && f.checksummed) {
    s = write ? net::RecvAll(fd, &theirs, kTrailerBytes, deadline) : net::SendAll(fd, &ours, kTrailerBytes, deadline);
  }
  *intact = !write || !f.checksummed || theirs == ours;
  if (s.ok()) s = write ? net::RecvAll(fd, PadSink(), tail, deadline) : net::SendAll(fd, kZeros, tail, deadline);
  if (!s.ok()) *why = "staged batch: " + s.message();
  return s.ok();
}

void TcpTransport::DropPeer(uint64_t incarnation) {
  std::lock_guard l(services_mu_);
  for (auto& s : services_) {
    if (s->peer_incarnation == incarnation) s->Shutdown();
  }
}

void TcpTransport::Fence() {
  std::list<std::shared_ptr<Service>> all;
  {
    std::lock_guard l(services_mu_);
    all = services_;
  }
  for (auto& s : all) std::lock_guard l(s->exec);
}

Status TcpTransport::Connect(const PeerEndpoint& peer, std::shared_ptr<Link>* link) {
  if (peer.tcp_port == 0 || peer.host.empty()) {
    return {StatusCode::kUnsupported, "tcp: the peer does not offer tcp"};
  }
  // Data connections open on first use: at this point the peer may not know us yet.
  *link = std::make_shared<TcpLink>(peer, hooks_.incarnation, opts_);
  return Status::Ok();
}

}  // namespace xfer::transport
