#include "transport/tcp/tcp_transport.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <vector>

#include "transport/tcp/tcp_paths.h"
#include "transport/tcp/tcp_wire.h"
#include "util/checksum.h"
#include "util/crypto.h"
#include "util/log.h"

namespace xfer::transport {
using namespace tcp_wire;
namespace {

// A checksummed batch's checksum covers its header and descriptors as sent, then its payload:
// damage to an address is caught as well as damage to the data.
// (payload: the batch's local memory)
uint64_t ChecksumOf(std::span<const uint8_t> head, std::span<const Slice> payload) {
  checksum::Running sum;
  sum.Add(head.data(), head.size());
  for (const Slice& s : payload) sum.Add(reinterpret_cast<const void*>(s.local), s.len);
  return sum.Value();
}

// Reads a reply up to its payload; *verdict is the target's. When a payload of payload_bytes
// follows (a READ the target accepted), *tail is the padding after it, else everything is read.
Status RecvReply(int fd, uint64_t payload_bytes, Clock::time_point deadline, std::chrono::microseconds spin,
                 Status* verdict, uint64_t* tail) {
  uint8_t h[kReplyHeaderBytes];
  Status s = net::RecvAll(fd, h, sizeof h, deadline, spin);
  if (!s.ok()) return s;
  const uint32_t code = Get<uint32_t>(h);
  const uint16_t len = Get<uint16_t>(h + 4), lead = Get<uint16_t>(h + 6);
  if (code > static_cast<uint32_t>(kLastStatusCode) || len > kMaxMessage || lead >= kAlign ||
      (code != 0 && lead != 0)) {
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
  std::string why;  // set with broken

  // Frames may be half sent or half read: nobody may use the stream again. Wakes everyone
  // blocked on it. False when another batch had broken it already (then its reason stands).
  bool Break(const std::string& reason) {
    std::lock_guard l(mu);
    if (broken) return false;
    why = reason;
    broken = true;
    Abort(fd.get());
    turn.notify_all();
    return true;
  }
  // Resets the connection and drops what it has not sent yet: a frame queued behind a stall
  // belongs to a batch that fails, or goes again on another connection, and must never land
  // after it (shutdown or close would still send it once the path comes back). Connecting a
  // TCP socket to AF_UNSPEC does that, and the descriptor stays valid for the threads using it.
  static void Abort(int fd) {
    sockaddr unspec{};
    unspec.sa_family = AF_UNSPEC;
    ::connect(fd, &unspec, sizeof unspec);
    ::shutdown(fd, SHUT_RDWR);
  }
  bool IsBroken() {
    std::lock_guard l(mu);
    return broken;
  }
};

class TcpLink final : public Link {
 public:
  TcpLink(TcpPeer peer, uint64_t my_incarnation, TcpOptions opts)
      : peer_(std::move(peer)), me_(my_incarnation), opts_(opts), paths_(PathsTo(peer_, opts_.nics)) {
    // tcp.links connections, at least one per path, and as many on each path.
    const size_t links = static_cast<size_t>(std::max(opts.links, 1));
    const size_t n = (links + paths_.size() - 1) / paths_.size() * paths_.size();
    for (size_t i = 0; i < n; ++i) {
      conns_.push_back(std::make_unique<Conn>());
      conns_.back()->path = paths_[i % paths_.size()].get();
    }
  }

  Status Execute(Op op, std::span<const Slice> batch, Clock::time_point deadline) override {
    return Run(op, batch, deadline, nullptr);
  }
  // A staged batch's payload moves piece by piece, the hook told in between (a checksummed
  // WRITE's checksum covers the whole payload: it is told all of it first). Ready waits for
  // copies while this connection's send lock is held: they take a fraction of the send.
  Status ExecutePieces(Op op, std::span<const Slice> batch, Clock::time_point deadline,
                       PieceHook& hook) override {
    return Run(op, batch, deadline, &hook);
  }

  // Over several paths, a batch that lost its connection goes again on another path while
  // its deadline allows (batches are idempotent); the lost path is avoided for its back-off.
  Status Run(Op op, std::span<const Slice> batch, Clock::time_point deadline, PieceHook* hook) {
    uint64_t bytes = 0;
    for (const Slice& s : batch) bytes += s.len;
    Conn* c = &Pick();
    for (;;) {
      bool interrupted = false;
      Status s = ExecuteOnConn(*c, op, batch, bytes, deadline, hook, &interrupted);
      if (s.ok()) {
        if (paths_.size() > 1 && c->path->Worked(bytes)) {
          XLOG(INFO) << "tcp: the path " << c->path->Name() << " works again";
        }
        return s;
      }
      if (shut_.load()) return Gone();
      if (s.code() != StatusCode::kConnectionLost || interrupted || paths_.size() < 2 ||
          Clock::now() >= deadline) {
        return s;
      }
      if (const auto avoided = c->path->Lost(); avoided.count() > 0) {
        XLOG(WARN) << "tcp: a connection on the path " << c->path->Name() << " failed (" << s.message()
                   << "); batches go over the other paths, and this one is tried again in " << avoided.count()
                   << " ms";
      }
      c = LeastQueued(true);
      if (c == nullptr) return s;  // every path is avoided now
    }
  }

  std::vector<std::pair<std::string, uint64_t>> PathBytes() const override {
    std::vector<std::pair<std::string, uint64_t>> out;
    if (paths_.size() < 2) return out;
    for (const auto& p : paths_) out.emplace_back(p->Name(), p->bytes());
    return out;
  }

  void Shutdown() override {
    shut_.store(true);
    for (auto& c : conns_) {
      std::lock_guard l(c->stream_mu);
      if (c->stream) c->stream->Break("the session ended");
    }
  }

  void Interrupt(Clock::time_point since, bool /*control_thread*/) override {
    // The peer stalls when a connection busy since before `since` (or broken by an earlier
    // interrupt) has had no reply since. Then every busy connection of the link without a
    // reply since is broken, whenever its batch began: the peer stalls those too.
    auto idle_since = [&](const Conn& c) { return c.busy.load() > 0 && c.moved.load() < since; };
    bool stalls = false;
    for (const auto& c : conns_) {
      stalls |= idle_since(*c) && (c->busy_from.load() < since || c->interrupted.load() > c->moved.load());
    }
    if (!stalls) return;
    for (auto& c : conns_) {
      if (!idle_since(*c)) continue;
      const bool again = c->interrupted.load() > c->moved.load();  // (logged once until it moves)
      c->interrupted.store(Clock::now());
      c->interrupts.fetch_add(1);  // (before the break: its batches see it when they fail)
      std::lock_guard l(c->stream_mu);
      if (c->stream && c->stream->Break(kInterrupted) && !again) {
        XLOG(WARN) << "tcp: the target at " << peer_.host << " answered nothing while a fence "
                   << "waited; the batches on its connection are interrupted";
      }
    }
  }

 private:
  struct Conn {
    Path* path = nullptr;                        // where its streams go (one of paths_)
    std::atomic<uint64_t> queued_bytes{0};       // of the batches on it now
    std::mutex send_mu;                          // one frame on the wire at a time
    std::mutex stream_mu;                        // guards replacing stream against Shutdown()
    std::shared_ptr<Stream> stream;              // the current connection; replaced once broken
    std::atomic<int> busy{0};                    // batches on this connection now
    std::atomic<Clock::time_point> busy_from{};  // when busy last rose from 0
    // When a reply last came in: the target's progress (a frame sent whole may only have gone
    // into the socket's buffer; a fresh stream is none either).
    std::atomic<Clock::time_point> moved{};
    std::atomic<uint64_t> interrupts{0};           // Interrupt()s: a batch that saw one is not retried
    std::atomic<Clock::time_point> interrupted{};  // when the last Interrupt broke it
  };
  static constexpr const char* kInterrupted = "interrupted: the target answered nothing while a fence waited";
  Status Interrupted() const {
    return {StatusCode::kConnectionLost, std::string("tcp: ") + kInterrupted + " (" + peer_.host + ")"};
  }

  Status Gone() const {
    return {StatusCode::kConnectionLost, "tcp: the session with " + peer_.host + " ended"};
  }

  // One batch on connection c: *interrupted when a fence's Interrupt ended it (not a path's
  // fault: it is not tried elsewhere).
  Status ExecuteOnConn(Conn& c, Op op, std::span<const Slice> batch, uint64_t bytes,
                       Clock::time_point deadline, PieceHook* hook, bool* interrupted) {
    // (Stamped before the count rises: Interrupt never sees it busy with an older stamp.)
    if (c.busy.load() == 0) c.busy_from.store(Clock::now());
    c.busy.fetch_add(1);
    c.queued_bytes.fetch_add(bytes);
    const uint64_t epoch = c.interrupts.load();
    Status s = Attempt(c, epoch, op, batch, deadline, hook);
    // Damaged on the way (a checksum did not match): batches are idempotent, so once more.
    if (s.code() == StatusCode::kDataCorrupted && !shut_.load() && Clock::now() < deadline) {
      XLOG(WARN) << s.message() << " (peer " << peer_.host << "); trying the batch once more";
      s = Attempt(c, epoch, op, batch, deadline, hook);
    }
    *interrupted = c.interrupts.load() != epoch;
    c.queued_bytes.fetch_sub(bytes);
    c.busy.fetch_sub(1);
    return s;
  }

  // Over several paths: the connection with the fewest bytes queued (so that each path gets
  // batches as fast as it moves them: a slower NIC drains its queue slower, and so gets fewer),
  // of a path not avoided when skip_avoided. Null when every path is avoided.
  Conn* LeastQueued(bool skip_avoided) {
    const auto now = Clock::now();
    const size_t first = rr_.fetch_add(1) % conns_.size();  // (ties: in turn)
    Conn* best = nullptr;
    for (size_t i = 0; i < conns_.size(); ++i) {
      Conn* c = conns_[(first + i) % conns_.size()].get();
      if (skip_avoided && c->path->Avoided(now)) continue;
      if (best == nullptr || c->queued_bytes.load() < best->queued_bytes.load()) best = c;
    }
    return best;
  }

  Conn& Pick() {
    if (paths_.size() > 1) {
      // (Every path avoided: the least loaded all the same; its batch finds out.)
      Conn* c = LeastQueued(true);
      return c != nullptr ? *c : *LeastQueued(false);
    }
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
  // (epoch: c.interrupts when the batch began.)
  Status Attempt(Conn& c, uint64_t epoch, Op op, std::span<const Slice> batch, Clock::time_point deadline,
                 PieceHook* hook) {
    bool bystander = false;
    Status s = ExecuteOn(c, epoch, op, batch, deadline, hook, &bystander);
    while (bystander && !shut_.load() && c.interrupts.load() == epoch && Clock::now() < deadline) {
      s = ExecuteOn(c, epoch, op, batch, deadline, hook, &bystander);
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
  Status ExecuteOn(Conn& c, uint64_t epoch, Op op, std::span<const Slice> batch, Clock::time_point deadline,
                   PieceHook* hook, bool* bystander) {
    *bystander = false;
    // The frame up to its payload, and a WRITE's checksum: built before the send lock, so that
    // another batch's frame may go out meanwhile.
    FrameHead head(op, batch, opts_.checksum);
    if (hook != nullptr && head.write && head.checksummed) {
      if (Status s = hook->Ready(head.total); !s.ok()) return s;
    }
    // (A READ's covers its request: header and descriptors.)
    const uint64_t sum =
        opts_.checksum ? ChecksumOf(head.Checked(), op == Op::kWrite ? batch : std::span<const Slice>()) : 0;
    std::shared_ptr<Stream> st;
    uint64_t ticket = 0;
    {
      std::unique_lock sl(c.send_mu);
      if (shut_.load()) return Gone();
      if (c.interrupts.load() != epoch) return Interrupted();  // (it waited for the frame that stalled)
      {
        std::lock_guard l(c.stream_mu);
        st = c.stream;
      }
      if (!st || st->IsBroken()) {
        Status s = Open(c, epoch, StepDeadline(deadline), &st);
        if (!s.ok()) return Stalled(s, deadline, "answer the data connection's handshake");
      }
      ticket = st->sent++;
      // (The frame may wait for the target to finish the one before it first: two steps.)
      Status s = SendFrame(st->fd.get(), head, batch, sum, hook, StepDeadline(deadline, 2));
      if (!s.ok())
        return Broken(*st, "a frame could not be sent: ", Stalled(s, deadline, "take a frame", 2), bystander);
    }
    {
      std::unique_lock l(st->mu);
      const bool my_turn =
          st->turn.wait_until(l, deadline, [&] { return st->received == ticket || st->broken; });
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
    Status s = ReadReply(st->fd.get(), head, batch, hook, StepDeadline(deadline), &framed);
    if (!framed) return Broken(*st, "a reply could not be read: ", Stalled(s, deadline, "reply"), bystander);
    std::lock_guard l(st->mu);
    ++st->received;
    c.moved.store(Clock::now());
    st->turn.notify_all();
    return s;
  }

  // Each step of a batch (opening a connection, sending the frame, reading the reply once its
  // turn came) must end within io_timeout as well as the batch's deadline: the target bounds
  // its own steps so, and one that stalls (while its control session stays alive) must not
  // hold a batch, and with it a fence of ours, until a long deadline passes.
  Clock::time_point StepDeadline(Clock::time_point deadline, int steps = 1) const {
    return std::min(deadline, Clock::now() + steps * opts_.io_timeout);
  }
  // A step's timeout before the batch's deadline: the target stalled, the link is lost.
  // (step: what the target did not do in time.)
  Status Stalled(const Status& s, Clock::time_point deadline, const char* step, int steps = 1) const {
    if (s.code() != StatusCode::kTimeout || Clock::now() >= deadline) return s;
    return {StatusCode::kConnectionLost, "tcp: the target at " + peer_.host + " did not " + step +
                                             " within " + std::to_string(steps * opts_.io_timeout.count()) +
                                             " ms"};
  }

  // A batch whose deadline ends the connect or handshake timed out; anything else lost the
  // link.
  static Status OpenFailed(const std::string& what, const Status& s) {
    return {s.code() == StatusCode::kTimeout ? StatusCode::kTimeout : StatusCode::kConnectionLost,
            "tcp: " + what + s.message()};
  }

  // Opens c's next stream (c.send_mu held). It is c's stream from the connect on, before the
  // handshake, so that Shutdown breaks a handshake that a hung peer never answers.
  Status Open(Conn& c, uint64_t epoch, Clock::time_point deadline, std::shared_ptr<Stream>* out) {
    auto st = std::make_shared<Stream>();
    const Path& path = *c.path;  // (its from and to never change)
    Status s = net::ConnectTcp(path.to, deadline, &st->fd, nullptr,
                               path.from.address.empty() ? nullptr : &path.from);
    if (!s.ok()) return OpenFailed(path.from.address.empty() ? "" : "from " + path.from.device + ": ", s);
    {
      std::lock_guard l(c.stream_mu);
      if (shut_.load()) return Gone();
      if (c.interrupts.load() != epoch) return Interrupted();  // (interrupted while it connected)
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
    const auto hello = DataHello(peer_.incarnation, me_);
    Status s = net::SendAll(fd, hello.data(), hello.size(), deadline);
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
      return {StatusCode::kResourceExhausted,
              "tcp: the target refused the data connection: this engine holds as many as it allows"};
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

  // Sends or receives the iovecs as one stream, stopping where the payload (from byte `lead`
  // on, `payload` bytes) reaches a multiple of hook.piece() to tell the hook: Ready before a
  // send, Landed after a receive (*landed: its answer; the stream goes on all the same).
  static Status MovePieces(int fd, bool send, std::span<const iovec> iov, uint64_t lead, uint64_t payload,
                           PieceHook& hook, Clock::time_point deadline, Status* landed = nullptr) {
    std::vector<iovec> part;
    size_t i = 0;
    uint64_t into = 0;  // the stream's next byte: iov[i], into bytes in
    const auto move = [&](uint64_t n) {
      part.clear();
      while (n > 0 && i < iov.size()) {
        const uint64_t m = std::min<uint64_t>(n, iov[i].iov_len - into);
        if (m > 0) part.push_back({static_cast<uint8_t*>(iov[i].iov_base) + into, m});
        n -= m;
        into += m;
        if (into == iov[i].iov_len) {
          ++i;
          into = 0;
        }
      }
      if (part.empty()) return Status::Ok();
      return send ? net::SendVWaitAll(fd, part.data(), part.size(), deadline)
                  : net::RecvVWaitAll(fd, part.data(), part.size(), deadline);
    };
    const uint64_t piece = std::max<uint64_t>(hook.piece(), 1);
    uint64_t done = 0, before = lead;
    while (done < payload) {
      const uint64_t n = std::min(piece, payload - done);
      if (send) {
        if (Status s = hook.Ready(done + n); !s.ok()) return s;
      }
      if (Status s = move(before + n); !s.ok()) return s;
      before = 0;
      done += n;
      if (!send && landed->ok()) *landed = hook.Landed(done);
    }
    return move(UINT64_MAX);  // (what follows the payload)
  }

  // The frame: its head, for WRITE the payload straight from the source memory, and when
  // checksummed the checksum sum (a WRITE's of head and payload, a READ's of its head).
  static Status SendFrame(int fd, const FrameHead& head, std::span<const Slice> batch, uint64_t sum,
                          PieceHook* hook, Clock::time_point deadline) {
    const uint64_t tail = PadFor(head.bytes.size() + (head.write ? head.total : 0) + head.trailer(), 0);
    std::vector<iovec> iov;
    iov.reserve(batch.size() + 3);
    iov.push_back({const_cast<uint8_t*>(head.bytes.data()), head.bytes.size()});
    if (head.write) {
      for (const Slice& s : batch) iov.push_back({reinterpret_cast<void*>(s.local), s.len});
    }
    if (head.checksummed) iov.push_back({&sum, kTrailerBytes});
    iov.push_back({const_cast<uint8_t*>(kZeros), tail});
    if (hook != nullptr && head.write && !head.checksummed) {
      return MovePieces(fd, true, iov, head.bytes.size(), head.total, *hook, deadline);
    }
    return net::SendVWaitAll(fd, iov.data(), iov.size(), deadline);
  }

  // The target's verdict and, for an accepted READ, the payload into the local memory (and its
  // checksum checked). *framed: the reply was read whole (the stream can carry the next one).
  Status ReadReply(int fd, const FrameHead& head, std::span<const Slice> batch, PieceHook* hook,
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
      if (theirs != ours.Value()) return Mismatch("READ", "here");
      return hook != nullptr ? hook->Landed(head.total) : Status::Ok();
    }
    std::vector<iovec> iov;
    iov.reserve(batch.size() + 1);
    for (const Slice& sl : batch) iov.push_back({reinterpret_cast<void*>(sl.local), sl.len});
    iov.push_back({PadSink(), tail});
    if (hook != nullptr) {
      // (Landed fails only when a copy out of the buffer did: the stream is whole all the same.)
      Status landed;
      s = MovePieces(fd, false, iov, 0, head.total, *hook, deadline, &landed);
      *framed = s.ok();
      // (A copy that failed, with the stream whole, is not the connection's fault; with the
      // stream broken, the hook's failure sticks for the batch's next try.)
      return s.ok() ? landed : s;
    }
    s = net::RecvVWaitAll(fd, iov.data(), iov.size(), deadline);
    *framed = s.ok();
    return s;
  }

  const TcpPeer peer_;
  const uint64_t me_;
  const TcpOptions opts_;
  const std::vector<std::unique_ptr<Path>> paths_;  // (conns point to them)
  std::vector<std::unique_ptr<Conn>> conns_;
  std::atomic<uint32_t> rr_{0};
  std::atomic<bool> shut_{false};
};

}  // namespace

Status TcpTransport::Connect(const TcpPeer& peer, std::shared_ptr<Link>* link) {
  if (peer.port == 0 || peer.host.empty()) {
    return {StatusCode::kUnsupported, "tcp: the peer does not offer tcp"};
  }
  // Data connections open on first use: at this point the peer may not know us yet.
  *link = std::make_shared<TcpLink>(peer, hooks_.incarnation, opts_);
  return Status::Ok();
}

}  // namespace xfer::transport
