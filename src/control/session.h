// One control connection to a peer: frame I/O, heartbeat bookkeeping and acknowledgements.
// The engine decides what messages mean; this class only moves them.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "control/auth.h"
#include "control/wire.h"
#include "util/net.h"

namespace xfer::control {

// What the engine keeps about a session's peer (the core's peer state), opaque to the control
// plane.
class SessionContext {
 public:
  virtual ~SessionContext() = default;
};

class Session {
 public:
  using Clock = std::chrono::steady_clock;

  Session(net::Fd fd, bool outbound, std::string remote_addr);

  bool outbound() const { return outbound_; }
  const std::string& remote_addr() const { return remote_addr_; }  // ip:port of the socket
  int fd() const { return fd_.get(); }

  // Output never blocks: frames queue in order (frames from several threads never
  // interleave), what the socket takes leaves at once, and the control loop writes the rest as
  // the socket drains (Flush, when on_pending asks it to). ok: queued; kConnectionLost when the
  // session is closed, or its peer has stopped reading (too much queued: the session is shut
  // down).
  Status Send(const wire::Message& msg);
  // Frames the peer answers (Sync, RegionRemove, Goodbye, Notify): `make` builds the frame for
  // its number, which is taken under the lock that queues it, so numbers leave in order and
  // the peer, answering in order, acknowledges them in order (Acked). reply, when set, is
  // called once with the peer's answer (Answer), or with kConnectionLost when the session
  // closes first (at once when it is closed already); it must not block.
  using Reply = std::function<void(Status)>;
  Status SendNumbered(const std::function<wire::Message(uint64_t seq)>& make, uint64_t* seq,
                      Reply reply = {});
  // The control thread's answers: queued without a write; its Flush after each read sends
  // them (one write for the answers to a burst of frames).
  void SendSoon(const wire::Message& msg);
  enum class Flushed { kAll, kPending, kFailed };  // kFailed: a socket error, or too much queued
  // Writes what is queued, without blocking.
  Flushed Flush();
  // Writes everything queued, blocking up to deadline: the handshake, before the control loop
  // watches the session.
  Status FlushUntil(Clock::time_point deadline);
  // Called, on the thread that queued them, when bytes are left that the socket did not take
  // (the control loop then writes them as the socket drains).
  void set_on_pending(std::function<void()> f);

  // What a session does with the frames it reads: each whole frame goes to `message`, in order,
  // but a hello of kBigHello bytes or more goes undecoded to `big_hello` (decoding it, and
  // checking and indexing the region table it carries, may take a second: the control loop
  // does that on another thread), and the session then reads and parses nothing more until
  // Resume. When big_hello does not take it (false: not now), the hello stays read, unparsed.
  static constexpr size_t kBigHello = 64 * 1024;
  struct Handlers {
    std::function<void(wire::Message&&)> message;
    std::function<bool(std::span<const uint8_t> payload)> big_hello;
  };
  // Reads what the socket has (non-blocking; up to 64 KiB a call; nothing while held) and hands
  // on each whole frame. False on end of stream, a socket error or a malformed frame (a second
  // hello: refused by its header), with *why set. Nothing is handed on once shut down.
  bool ReadAvailable(const Handlers& on, std::string* why);
  // Held since a big hello was handed on or refused for now, until Resume parses what was read
  // behind it (the refused hello first).
  bool held() const { return held_; }
  bool Resume(const Handlers& on, std::string* why);
  // Bytes held for frames not handed on yet, with their room to grow (FitBuffer; a session's
  // 64 KiB of room for small frames is not counted) (control loop only).
  size_t buffered() const { return rx_.capacity() > kBigHello ? rx_.capacity() : rx_.size(); }
  // Frees what it read of unfinished frames (a session shut down to stay within the loop's
  // budget: it reads nothing more).
  void DropBuffered() { std::vector<uint8_t>().swap(rx_); }
  // Frames longer than this close the session (an unauthenticated one gets few bytes).
  void set_max_payload(uint32_t bytes) { max_payload_.store(bytes); }
  // Bytes queued for a peer that does not read them: past this, the session is shut down
  // (EngineOptions::max_unsent_bytes).
  void set_max_queued(uint64_t bytes) { max_queued_.store(bytes); }
  // Reads exactly one frame, blocking up to deadline (used during the handshake only).
  Status ReadOne(Clock::time_point deadline, wire::Message* msg);

  // Asks the control loop to close this session (it notices the shutdown socket). The first
  // reason given is the one logged.
  void Shutdown(const std::string& reason);
  std::string shutdown_reason() const;
  // Called by the control loop only: closes the descriptor and wakes every waiter.
  void Close();
  bool closed() const { return closed_.load(); }

  // Acknowledged round trips (SendNumbered). The peer answers in order, so one counter covers
  // them all. False (and nothing acknowledged) for a number not sent yet.
  bool Acked(uint64_t seq);
  // False when the deadline passed or the session closed first.
  bool WaitAcked(uint64_t seq, Clock::time_point deadline);

  // The peer answered frame seq with a status (NotifyAck); false when nothing expected it.
  bool Answer(uint64_t seq, Status status);

  // Set by the engine once the hello exchange is done, with what it keeps about the peer.
  std::atomic<bool> established{false};
  std::shared_ptr<SessionContext> context;
  // While a big hello is handed to the engine (control thread): what ControlHandler::Prepare
  // made of it on the loop's worker.
  std::shared_ptr<SessionContext> prepared;
  std::string peer_key;  // key in the engine's peer table
  // An accepted session's authentication (engine with a secret; control thread only): the
  // handshake under way, and whether the peer has proved it knows the secret.
  std::shared_ptr<Handshake> auth;
  bool authenticated = false;
  // Once authenticated (either side): the key both derived (Handshake::SessionKey).
  std::string auth_key;
  const Clock::time_point created = Clock::now();
  std::atomic<Clock::time_point> last_rx{Clock::now()};
  bool late = false;  // control thread: silent for half the heartbeat timeout (ControlLoop)
  Clock::time_point last_tx = Clock::now();  // control loop only
  bool watching_writable = false;            // control loop only: EPOLLOUT is asked for

 private:
  bool ParseFrames(const Handlers& on, std::string* why);
  // Whether the frame is past max_payload_ (set below it before the peer authenticated; *why).
  bool TooLong(const wire::Header& h, std::string* why) const;
  void FitBuffer();    // rx_'s room: the frame under way's
  bool held_ = false;  // control loop only
  // A hello was read (ReadOne, before the control loop has the session) or handed on (the
  // control loop only, then): another closes the session.
  bool hello_seen_ = false;
  std::atomic<bool> shut_{false};  // Shutdown was called
  std::atomic<uint32_t> max_payload_{wire::kMaxPayload};
  std::atomic<uint64_t> max_queued_{64ull << 20};

  net::Fd fd_;
  const bool outbound_;
  const std::string remote_addr_;
  // After a frame was queued (lock: send_mu_, released here): writes what the socket takes
  // when write_now, shuts the session down when that fails or too much is queued, and calls
  // on_pending when bytes are left.
  Status AfterQueued(std::unique_lock<std::mutex>& lock, bool write_now);
  Flushed WriteQueued();  // send_mu_ held

  std::mutex send_mu_;
  std::vector<uint8_t> out_;          // send_mu_: bytes queued; out_[out_off_..] not yet written
  size_t out_off_ = 0;                // send_mu_
  std::function<void()> on_pending_;  // send_mu_
  bool loop_owes_ = false;            // send_mu_: on_pending was called, and bytes are still left
  std::vector<uint8_t> rx_;           // control loop only
  std::atomic<bool> closed_{false};
  std::atomic<uint64_t> next_seq_{0};  // taken under send_mu_, read anywhere (Acked)
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t acked_ = 0;                  // mu_
  std::map<uint64_t, Reply> expected_;  // mu_
  std::string shutdown_why_;            // mu_
};

}  // namespace xfer::control
