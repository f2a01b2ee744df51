#include "transport/tcp/serve_pool.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "util/log.h"

namespace xfer::net {

namespace {
constexpr uint32_t kArmed = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT;
// The host of the connection this thread serves (Saturated: a serve asks about its own). One
// per thread for every pool: a worker serves one pool.
thread_local const std::atomic<bool>* serving_crowded = nullptr;
}  // namespace

bool ServePool::Saturated() const {
  return saturated_.load(std::memory_order_relaxed) ||
         (serving_crowded != nullptr && serving_crowded->load(std::memory_order_relaxed));
}

Status ServePool::Start() {
  epoll_ = Fd(::epoll_create1(EPOLL_CLOEXEC));
  wake_ = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!epoll_.valid() || !wake_.valid()) {
    return {StatusCode::kResourceExhausted, std::string("serve pool: ") + std::strerror(errno)};
  }
  epoll_event ev{};
  ev.events = EPOLLIN;  // (level-triggered, never re-armed: every worker sees it)
  ev.data.ptr = nullptr;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &ev) != 0) {
    return {StatusCode::kInternal, std::string("serve pool: epoll_ctl: ") + std::strerror(errno)};
  }
  AddWorkerIfNoneWaits();
  return threads_.load() > 0 ? Status::Ok() : Status{StatusCode::kResourceExhausted, "serve pool: no thread"};
}

Status ServePool::Add(int fd, void* conn, uint64_t group, uint64_t host) {
  auto owned = std::make_unique<Entry>(Entry{fd, conn, group, host});
  Entry* e = owned.get();
  {
    std::lock_guard lock(entries_mu_);
    entries_.emplace(e, std::move(owned));
  }
  epoll_event ev{};
  ev.events = kArmed;
  ev.data.ptr = e;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
    const int err = errno;
    Forget(e);
    return {StatusCode::kResourceExhausted, std::string("serve pool: epoll_ctl: ") + std::strerror(err)};
  }
  return Status::Ok();
}

void ServePool::Forget(Entry* e) {
  std::lock_guard lock(entries_mu_);
  entries_.erase(e);
}

void ServePool::AddWorkerIfNoneWaits() {
  std::lock_guard lock(workers_mu_);
  JoinExited();
  if (stopping_.load() || waiting_ > 0 || workers_.size() >= Cap()) return;
  try {
    ++waiting_;  // (counted before it runs: a burst of ready connections starts one)
    workers_.emplace_back();
    const Worker self = std::prev(workers_.end());
    *self = std::thread([this, self] { Work(self); });
    Recount();
  } catch (const std::system_error& e) {
    --waiting_;
    workers_.pop_back();
    spawnable_ = std::max<size_t>(workers_.size(), 1);  // (the system's limit: saturated at it)
    Recount();
    XLOG(WARN) << "serve pool: cannot start a thread (" << e.what() << "); " << workers_.size()
               << " serve the connections";
  }
}

bool ServePool::ExitIfAnotherWaits(Worker self) {
  std::lock_guard lock(workers_mu_);
  if (stopping_.load() || waiting_ < 2) return false;
  --waiting_;
  exited_.push_back(self);
  Recount();
  return true;
}

void ServePool::JoinExited() {
  for (Worker w : exited_) {
    w->join();
    workers_.erase(w);
  }
  exited_.clear();
}

void ServePool::Recount() {
  const size_t live = workers_.size() - exited_.size();
  threads_.store(live);
  saturated_.store(waiting_ == 0 && live >= Cap(), std::memory_order_relaxed);
}

bool ServePool::MayTakeAnother(const Host& h, const Group& g) const {
  // It takes no thread past its host's share, nor one that would leave less than a share free
  // for the next host to come (hosts that came earlier may hold more than today's share: their
  // serves had started). Within the host, a group none of whose connections is served takes
  // one, and another keeps to its part of the host's share.
  const size_t share = std::max<size_t>(1, Cap() / (hosts_.size() + 1));
  if (h.serving >= share || serving_ + share >= Cap()) return false;
  return g.serving == 0 || g.serving < std::max<size_t>(1, share / h.groups);
}

void ServePool::Take(Host& h, Group& g) {
  ++h.serving;
  ++g.serving;
  ++serving_;
  serving_crowded = &h.crowded;  // (the host lives while one of its serves runs)
}

bool ServePool::Enter(Entry* e) {
  Host& h = hosts_[e->host];
  auto [at, fresh] = groups_.try_emplace(GroupKey{e->host, e->group});
  if (fresh) ++h.groups;
  Group& g = at->second;
  // A host none of whose connections is served always enters: its connections make progress,
  // and a host that comes is served at once.
  if (h.serving > 0 && !MayTakeAnother(h, g)) {
    h.parked.push_back(e);
    ++g.parked;
    h.crowded.store(true, std::memory_order_relaxed);
    return false;
  }
  Take(h, g);
  return true;
}

ServePool::Entry* ServePool::Leave(const Entry& e) {
  const auto hit = hosts_.find(e.host);
  const auto git = groups_.find(GroupKey{e.host, e.group});
  Host& h = hit->second;
  --h.serving;
  --git->second.serving;
  --serving_;
  serving_crowded = nullptr;
  // Its place passes to the first of its host's parked connections that may take it.
  Entry* next = nullptr;
  const size_t share = std::max<size_t>(1, Cap() / (hosts_.size() + 1));
  const bool host_full = h.serving > 0 && (h.serving >= share || serving_ + share >= Cap());
  for (auto it = h.parked.begin(); !host_full && it != h.parked.end(); ++it) {
    Group& theirs = groups_.find(GroupKey{e.host, (*it)->group})->second;
    if (h.serving == 0 || MayTakeAnother(h, theirs)) {
      next = *it;
      h.parked.erase(it);
      --theirs.parked;
      Take(h, theirs);
      break;
    }
  }
  h.crowded.store(!h.parked.empty(), std::memory_order_relaxed);
  if (git->second.serving == 0 && git->second.parked == 0) {
    groups_.erase(git);
    --h.groups;
  }
  if (h.serving == 0 && h.parked.empty()) hosts_.erase(hit);
  return next;
}

bool ServePool::Watch(Entry* e) {
  epoll_event again{};
  again.events = kArmed;
  again.data.ptr = e;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, e->fd, &again) == 0) return true;
  XLOG(ERROR) << "serve pool: cannot watch a connection again (" << std::strerror(errno) << "); closing it";
  return false;
}

void ServePool::Work(Worker self) {
  const int idle_ms = static_cast<int>(idle_exit_.count());
  Entry* e = nullptr;  // the next connection to serve
  for (;;) {
    if (e == nullptr) {
      epoll_event ev{};
      const int n = ::epoll_wait(epoll_.get(), &ev, 1, idle_ms);
      if (n < 0 && errno == EINTR) continue;
      if (n == 0) {
        if (ExitIfAnotherWaits(self)) return;
        continue;
      }
      e = n > 0 ? static_cast<Entry*>(ev.data.ptr) : nullptr;
      std::lock_guard lock(workers_mu_);
      if (e == nullptr) {  // Stop(), or epoll_wait failed
        --waiting_;
        if (n < 0) {
          XLOG(ERROR) << "serve pool: epoll_wait: " << std::strerror(errno);
          if (!stopping_.load()) exited_.push_back(self);
        }
        Recount();
        return;
      }
      if (!Enter(e)) {  // (past its group's share: parked, this worker waits again)
        e = nullptr;
        continue;
      }
      --waiting_;
      Recount();
    }
    AddWorkerIfNoneWaits();   // (the others may turn ready while this one is busy)
    const Entry served = *e;  // (e itself goes with Forget)
    Next next = serve_(e->conn);
    if (next == Next::kIdle && !Watch(e)) {
      ::shutdown(e->fd, SHUT_RDWR);  // (never to be served again: end it here, its serve sees the end)
      while (next == Next::kIdle) next = serve_(e->conn);
    }
    if (next == Next::kDone) Forget(e);
    std::lock_guard lock(workers_mu_);
    e = Leave(served);  // (a parked one of its host, still ready: this worker serves it next)
    if (e == nullptr) {
      ++waiting_;
      Recount();
    }
  }
}

void ServePool::Stop() {
  {
    std::lock_guard lock(workers_mu_);
    if (stopping_.exchange(true)) return;
  }
  if (wake_.valid()) {
    const uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof one);
  }
  std::list<std::thread> workers;
  {
    std::lock_guard lock(workers_mu_);
    workers.swap(workers_);
    exited_.clear();  // (their threads are in `workers`: joined below)
  }
  for (auto& t : workers) t.join();
  threads_.store(0);
}

}  // namespace xfer::net
