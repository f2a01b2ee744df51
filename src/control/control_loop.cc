#include "control/control_loop.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "util/log.h"
#include "util/spin.h"

namespace xfer::control {
namespace {

using Clock = std::chrono::steady_clock;

// Whether socket fd holds bytes not read yet.
bool InputWaiting(int fd) {
  char b;
  return ::recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
}

}  // namespace

ControlLoop::ControlLoop(net::Fd listener, ControlHandler* handler, LoopOptions opts)
    : listener_(std::move(listener)), handler_(handler), opts_(opts) {}

ControlLoop::~ControlLoop() { Stop(); }

Status ControlLoop::Start() {
  epoll_ = net::Fd(::epoll_create1(EPOLL_CLOEXEC));
  wake_ = net::Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!epoll_.valid() || !wake_.valid()) {
    return {StatusCode::kResourceExhausted, std::string("epoll/eventfd: ") + std::strerror(errno)};
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_.get();
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &ev);
  if (listener_.valid()) {
    ev.data.fd = listener_.get();
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, listener_.get(), &ev);
  }
  thread_ = std::thread([this] { Run(); });
  return Status::Ok();
}

void ControlLoop::Wake() {
  uint64_t one = 1;
  ssize_t ignored = ::write(wake_.get(), &one, sizeof one);
  (void)ignored;
}

void ControlLoop::Add(std::shared_ptr<Session> s) {
  s->set_on_pending([this] { Wake(); });
  {
    std::lock_guard lock(add_mu_);
    to_add_.push_back(std::move(s));
  }
  Wake();
}

void ControlLoop::Stop() {
  if (thread_.joinable()) {
    stop_.store(true);
    Wake();
    thread_.join();
  }
  worker_.Stop();
  waiting_.clear();
  std::lock_guard lock(add_mu_);
  prepared_.clear();  // (their sessions were closed with the others)
}

void ControlLoop::Accept() {
  for (int accepted = 0; accepted < 64; ++accepted) {  // (then the sessions' turn: epoll says again)
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    int fd = ::accept4(listener_.get(), reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      if (accept_pause_.Shortage(errno)) {  // out of fds: stop watching the listener for now
        ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, listener_.get(), nullptr);
        listener_paused_ = true;
      } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
        XLOG(WARN) << "accept failed: " << std::strerror(errno);
      }
      return;
    }
    if (std::vector<std::shared_ptr<Session>> pending = Pending(); pending.size() >= kMaxPendingSessions) {
      // A flood of connections that say nothing: one goes (net::FloodVictim), so that a
      // newcomer that does its handshake at once still gets in.
      std::vector<std::string> from;
      for (const auto& p : pending) from.push_back(p->remote_addr());
      const auto& victim = pending[net::FloodVictim(from)];
      if (Clock::now() - last_pending_log_ > std::chrono::seconds(10)) {
        XLOG(WARN) << "control listener: " << kMaxPendingSessions << " connections have not said "
                   << "hello yet; closing the oldest of them from the host with the most for each new "
                   << "one (now one from " << victim->remote_addr() << ", for one from "
                   << net::AddressText(ss) << ")";
        last_pending_log_ = Clock::now();
      }
      // (Shut down, not closed: its descriptor may not be reused by this very accept while
      // the events in hand may still name it. The loop closes it when it reads the end.)
      victim->Shutdown("closed: one of too many connections that had not said hello");
    }
    net::SetNoDelay(fd);
    auto s = std::make_shared<Session>(net::Fd(fd), false, net::AddressText(ss));
    if (opts_.authenticate) s->set_max_payload(wire::kMaxPayloadBeforeAuth);
    s->set_max_queued(opts_.max_queued);
    s->set_on_pending([this] { Wake(); });
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev);
    sessions_[fd] = std::move(s);
  }
}

std::vector<std::shared_ptr<Session>> ControlLoop::Pending() const {
  std::vector<std::shared_ptr<Session>> pending;
  for (const auto& [fd, s] : sessions_) {
    if (!s->established.load() && s->shutdown_reason().empty()) pending.push_back(s);
  }
  std::sort(pending.begin(), pending.end(),
            [](const auto& a, const auto& b) { return a->created < b->created; });
  return pending;
}

void ControlLoop::CloseSession(const std::shared_ptr<Session>& s, const std::string& reason) {
  if (s->fd() >= 0) {
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, s->fd(), nullptr);
    if (sessions_.erase(s->fd()) > 0) buffered_ -= s->buffered();
    s->DropBuffered();  // (it may wait in waiting_ a while yet)
  }
  std::string why = s->shutdown_reason();
  s->Close();
  handler_->OnClosed(s, why.empty() ? reason : why);
}

void ControlLoop::Tick() {
  const auto now = Clock::now();
  if (listener_paused_ && accept_pause_.Over()) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = listener_.get();
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, listener_.get(), &ev);
    listener_paused_ = false;
  }
  std::vector<std::pair<std::shared_ptr<Session>, std::string>> dead;
  uint64_t declared_dead = 0;  // of `dead`, the peers silent past the heartbeat timeout
  for (auto& [fd, s] : sessions_) {
    if (!s->established.load()) {
      // (A held session has said its hello: the time it waits for the worker is ours.)
      if (!s->held() && now - s->created > opts_.heartbeat_timeout) {
        dead.emplace_back(s, "no hello within " + std::to_string(opts_.heartbeat_timeout.count()) + " ms");
      }
      continue;
    }
    auto silent = now - s->last_rx.load();
    // Late: silent for half the timeout (the peer's own heartbeat interval is not known here,
    // its timeout is ours); counted once per silence.
    const bool late = silent > opts_.heartbeat_timeout / 2;
    if (late && !s->late) ++counters_.peers_late;
    s->late = late;
    // (Not while its socket holds input this loop has not read yet: this process was stopped,
    // say, and its epoll_wait then returns EINTR before anything is read. Its frames, a
    // request's beginning among them, are read first; then its end, if it is gone.)
    if (silent > opts_.heartbeat_timeout && !InputWaiting(fd)) {
      dead.emplace_back(
          s, "no heartbeat for " +
                 std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(silent).count()) +
                 " ms (peer dead or hung)");
      ++declared_dead;
      continue;
    }
    if (now - s->last_tx >= opts_.heartbeat_interval) {
      s->last_tx = now;
      Status st = s->Send(wire::Heartbeat{});
      if (!st.ok()) dead.emplace_back(s, "heartbeat send failed: " + st.ToString());
    }
  }
  for (auto& [s, why] : dead) CloseSession(s, why);
  // (Counted once their sessions are closed: a reader that sees the count sees them gone.)
  counters_.peers_declared_dead += declared_dead;
  handler_->OnTick();
}

void ControlLoop::Run() {
  const int tick_ms = static_cast<int>(
      std::max<int64_t>(10, std::min(opts_.heartbeat_interval.count(), opts_.heartbeat_timeout.count() / 4)));
  auto next_tick = Clock::now();
  // In a busy exchange, while frames other than heartbeats (or wake-ups: a session added, a
  // hello prepared, bytes a socket did not take) come within kBusyGap spins of each other, it
  // polls for opts_.spin after each such turn before it sleeps: the next frame (an answer, the
  // next notification) is read without a sleeping thread's wake-up, which costs tens of
  // microseconds (bench/RESULTS.md). Frames further apart (a checksum's ask per large request,
  // say) and heartbeats, however many sessions send them, never make it spin: the polls would
  // take a core from the work.
  constexpr int kBusyGap = 4;
  Clock::time_point spin_until{}, last_active{};
  Backoff backoff(0);  // (each step is a system call already: yield at once)
  while (!stop_.load()) {
    const auto now = Clock::now();
    const bool spinning = now < spin_until;
    // (Rounded up: rounded down, the last millisecond before each tick would be polled busily.)
    const int wait_ms = spinning
                            ? 0
                            : static_cast<int>(std::max<int64_t>(
                                  0, std::chrono::ceil<std::chrono::milliseconds>(next_tick - now).count()));
    epoll_event events[64];
    int n = ::epoll_wait(epoll_.get(), events, 64, wait_ms);
    counters_.turns.fetch_add(1, std::memory_order_relaxed);
    if (n == 0 && spinning) backoff.Pause();
    active_ = false;
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_.get()) {
        active_ = true;
        AddQueued();
        TakePrepared();
        FlushAll();  // (a thread left bytes its socket did not take)
      } else if (fd == listener_.get()) {
        Accept();
      } else {
        Serve(fd, events[i].events);
      }
    }
    if (active_) {
      const auto now = Clock::now();
      if (now - last_active <= kBusyGap * opts_.spin) spin_until = now + opts_.spin;
      last_active = now;
    }
    if (Clock::now() >= next_tick) {
      Tick();
      next_tick = Clock::now() + std::chrono::milliseconds(tick_ms);
    }
  }
  // Stopping: close every session so the engine drops their state.
  auto all = sessions_;
  for (auto& [fd, s] : all) CloseSession(s, "engine finalized");
  {
    std::lock_guard lock(add_mu_);
    for (auto& s : to_add_) {
      s->Close();
      handler_->OnClosed(s, "engine finalized");
    }
    to_add_.clear();
  }
}

void ControlLoop::AddQueued() {
  uint64_t v;
  while (::read(wake_.get(), &v, sizeof v) > 0) {
  }
  std::vector<std::shared_ptr<Session>> add;
  {
    std::lock_guard lock(add_mu_);
    add.swap(to_add_);
  }
  for (auto& s : add) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = s->fd();
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, s->fd(), &ev);
    sessions_[s->fd()] = s;
  }
}

void ControlLoop::FlushAll() {
  std::vector<std::pair<std::shared_ptr<Session>, std::string>> broken;
  for (auto& [fd, s] : sessions_) {
    if (std::string why; !FlushAnswers(*s, &why)) broken.emplace_back(s, why);
  }
  for (auto& [s, why] : broken) CloseSession(s, why);
}

bool ControlLoop::FlushAnswers(Session& s, std::string* why) {
  const Session::Flushed f = s.Flush();
  if (f == Session::Flushed::kFailed) {
    *why = "cannot send to the peer (it reads nothing of its control connection, or it broke)";
    return false;
  }
  const bool want = f == Session::Flushed::kPending;  // the rest leaves once the socket drains
  if (want != s.watching_writable) {
    s.watching_writable = want;
    Watch(s);
  }
  return true;
}

void ControlLoop::Watch(Session& s) {
  epoll_event ev{};
  // (Held, it asks for no input at all: a peer's end, level-triggered, would spin the loop.
  // Hang-ups and errors are reported anyway.)
  ev.events = (s.held() ? 0u : EPOLLIN | EPOLLRDHUP) | (s.watching_writable ? EPOLLOUT : 0u);
  ev.data.fd = s.fd();
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, s.fd(), &ev);
}

Session::Handlers ControlLoop::HandlersFor(const std::shared_ptr<Session>& s) {
  // (s by reference: the handlers live only for the call they are made for, and two pointers
  // fit std::function's own storage, so a read allocates nothing for them.)
  return {[this, &s](wire::Message&& m) {
            if (std::holds_alternative<wire::Heartbeat>(m)) return;
            active_ = true;
            handler_->OnMessage(s, std::move(m));
          },
          [this, &s](std::span<const uint8_t> payload) { return Prepare(s, payload); }};
}

bool ControlLoop::Prepare(const std::shared_ptr<Session>& s, std::span<const uint8_t> payload) {
  Watch(*s);  // (held: no input until it is taken)
  // (Behind those already waiting, in order: a big hello is not passed over for good.)
  if (preparing_ > 0 && (!waiting_.empty() || preparing_ + payload.size() > kMaxPreparingBytes)) {
    waiting_.push_back(s);
    return false;
  }
  preparing_ += payload.size();
  // Its place at the worker: when it came, plus 100 ms a MB (a small hello goes ahead of big
  // ones that came just before it, not of those that have waited longer than their size).
  const uint64_t place = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count() +
      payload.size() / 10000);
  worker_.Post(
      [this, s, payload = std::vector<uint8_t>(payload.begin(), payload.end())] {
        PreparedHello done{s, {}, nullptr, "", payload.size()};
        if (wire::DecodePayload(wire::MsgType::kHello, payload, &done.hello, &done.error)) {
          done.prepared = handler_->Prepare(done.hello);
        }
        {
          std::lock_guard lock(add_mu_);
          prepared_.push_back(std::move(done));
        }
        Wake();
      },
      place);
  return true;
}

void ControlLoop::TakePrepared() {
  std::vector<PreparedHello> ready;
  {
    std::lock_guard lock(add_mu_);
    ready.swap(prepared_);
  }
  for (auto& p : ready) {
    preparing_ -= p.bytes;
    const std::shared_ptr<Session> s = p.session;
    if (s->closed()) {  // (closed meanwhile: what was made of its hello is freed off this thread)
      Offload([gone = std::move(p)] {});
      continue;
    }
    if (!p.error.empty()) {
      AfterFrames(s, false, "bad frame: " + p.error, 0);
      continue;
    }
    s->last_rx.store(Clock::now());  // (its frames waited for the worker, not for the peer)
    s->prepared = std::move(p.prepared);
    handler_->OnMessage(s, std::move(p.hello));
    // (The decoded hello, and what a refused one left: a million regions take a while to free.)
    Offload([hello = std::move(p.hello), prepared = std::move(s->prepared)] {});
    Resume(s);
  }
  if (ready.empty()) return;
  std::vector<std::shared_ptr<Session>> waiting;
  waiting.swap(waiting_);
  for (auto& s : waiting) {  // (in order; those still refused wait again)
    if (!s->closed()) Resume(s);
  }
}

void ControlLoop::Resume(const std::shared_ptr<Session>& s) {
  std::string why;
  const size_t before = s->buffered();
  const bool alive = s->Resume(HandlersFor(s), &why);
  Account(*s, before);
  if (alive && !s->held()) Watch(*s);
  AfterFrames(s, alive, why, 0);
}

void ControlLoop::Serve(int fd, uint32_t events) {
  auto it = sessions_.find(fd);
  if (it == sessions_.end()) return;
  std::shared_ptr<Session> s = it->second;
  std::string why;
  const size_t before = s->buffered();
  const bool alive = s->ReadAvailable(HandlersFor(s), &why);
  Account(*s, before);
  AfterFrames(s, alive, why, events);
}

void ControlLoop::Account(const Session& s, size_t before) {
  buffered_ = buffered_ - before + s.buffered();
  while (buffered_ > kMaxBufferedBytes) {
    Session* most = nullptr;
    for (const auto& [fd, other] : sessions_) {
      if (!most || other->buffered() > most->buffered()) most = other.get();
    }
    if (most == nullptr || most->buffered() == 0) break;  // (cannot be: the total is theirs)
    const size_t held = most->buffered();
    if (uint64_t more = 0; shed_log_.Due(&more)) {
      XLOG(WARN) << "control frames not yet whole hold " << buffered_ << " bytes, more than "
                 << kMaxBufferedBytes << "; closing the session holding the most ("
                 << (most->peer_key.empty() ? most->remote_addr() : most->peer_key) << ", " << held
                 << " bytes)" << log::Limit::More(more);
    }
    // (Its bytes go now; its end comes as the loop reads it.)
    most->Shutdown("its unfinished control frames held the most of the engine's budget");
    most->DropBuffered();
    buffered_ -= held;
  }
}

void ControlLoop::AfterFrames(const std::shared_ptr<Session>& s, bool alive, std::string why,
                              uint32_t events) {
  if (alive && s->shutdown_reason().empty()) alive = FlushAnswers(*s, &why);
  if (!alive) {
    // (Anyone can open connections that end so, and without a secret say hello first: one
    // line a second.)
    uint64_t more = 0;
    if (why.rfind("connection closed", 0) != 0 && s->shutdown_reason().empty() && broken_log_.Due(&more)) {
      XLOG(WARN) << "control connection from " << s->remote_addr() << ": " << why << "; closing it"
                 << log::Limit::More(more);
    }
    CloseSession(s, why);
  } else if (events & (EPOLLHUP | EPOLLERR)) {
    CloseSession(s, "connection error");
  }
}

}  // namespace xfer::control
