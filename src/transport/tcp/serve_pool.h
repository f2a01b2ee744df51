// ServePool: many connections that are mostly idle, served by a few threads. Each connection
// waits in one epoll set and holds no thread; when it turns readable, a worker takes it and
// calls serve(conn), which serves it as long as it stays busy and then says it is idle (it
// waits in the set again) or done (the caller closed it). Workers wait in epoll_wait
// themselves, so a connection that turns ready costs one wake-up, as a thread of its own did.
// There are as many workers as connections being served, plus one waiting, up to max_threads
// (past that, ready connections wait for a worker to come free, and serves should yield after
// each unit of work: Saturated()); a worker that waited idle_exit for a connection while
// another waits too ends. Connections come in groups (the tcp target's: one per peer engine),
// and groups in hosts (the tcp target's: the address a connection comes from). With H hosts
// having connections being served or waiting, each may hold max_threads / (H + 1) threads (at
// least one), and a host with a connection served takes another only while that leaves a
// share free; within a host, its groups share its threads alike. A ready connection past that
// waits, unwatched, until a serve of its host returns (in arrival order, a host's waiting
// connections take the places its serves give up). A host none of whose connections is
// served always gets a thread. So one host whose many connections each hold their thread for
// long (frames trickling in), however many engines it opens, cannot take every thread from
// the others, and a peer that comes from another host is served at once, while fewer hosts
// than threads hold them.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "util/net.h"
#include "xfer/status.h"

namespace xfer::net {

class ServePool {
 public:
  enum class Next { kIdle, kDone };
  using Serve = std::function<Next(void* conn)>;

  ServePool(Serve serve, size_t max_threads, std::chrono::milliseconds idle_exit)
      : serve_(std::move(serve)), max_threads_(max_threads), idle_exit_(idle_exit) {}
  ~ServePool() { Stop(); }
  ServePool(const ServePool&) = delete;
  ServePool& operator=(const ServePool&) = delete;

  Status Start();  // the epoll set and the first worker
  // Serves conn whenever fd is readable (or hung up), from now until serve returns kDone for
  // it; conn must stay valid until then. A connection of the pool's must not be closed by
  // anyone but its serve (shut it down instead: its serve then sees the end).
  Status Add(int fd, void* conn, uint64_t group = 0, uint64_t host = 0);
  // Ends the workers once each has returned to waiting. The caller ends its connections first
  // (shut down, and wait until each serve said kDone): a connection left behind is forgotten.
  void Stop();
  size_t threads() const { return threads_.load(); }
  // Called by a serve: it should give its connection back after each unit of work (kIdle with
  // data pending: it queues behind the other ready ones), because every worker is serving and
  // no more may start, or because connections of its host wait past the host's share.
  bool Saturated() const;

 private:
  struct Entry {
    int fd;
    void* conn;
    uint64_t group, host;
  };
  using GroupKey = std::pair<uint64_t, uint64_t>;  // (host, group)
  struct Group {
    size_t serving = 0;  // (workers_mu_) its connections being served now
    size_t parked = 0;   // (workers_mu_) and waiting in its host's queue
  };
  struct Host {
    size_t serving = 0;                // (workers_mu_) its connections being served now
    size_t groups = 0;                 // (workers_mu_) its groups in groups_
    std::deque<Entry*> parked;         // (workers_mu_) ready ones past a share, not watched
    std::atomic<bool> crowded{false};  // parked is not empty (read by its serves: Saturated)
  };
  void Forget(Entry* e);  // its serve said kDone
  // (workers_mu_ held) Whether e may be served now (counted as serving), else parked.
  bool Enter(Entry* e);
  // (workers_mu_ held) Whether a connection of group, on host h where some are served, may
  // take one more thread.
  bool MayTakeAnother(const Host& h, const Group& g) const;
  void Take(Host& h, Group& g);  // (workers_mu_ held) counts a serve of theirs begun
  // (workers_mu_ held) A serve of e's returned: the parked connection that takes its place, to
  // be served next by the same worker, if any.
  Entry* Leave(const Entry& e);
  size_t Cap() const { return std::min(max_threads_, spawnable_); }  // (workers_mu_ held) threads at most
  bool Watch(Entry* e);  // watched again (EPOLLONESHOT re-armed); false: it could not be
  using Worker = std::list<std::thread>::iterator;
  void Work(Worker self);
  void AddWorkerIfNoneWaits();
  bool ExitIfAnotherWaits(Worker self);  // (a worker idle for idle_exit)
  void JoinExited();                     // (workers_mu_ held)
  void Recount();                        // (workers_mu_ held) threads_ and saturated_

  const Serve serve_;
  const size_t max_threads_;
  const std::chrono::milliseconds idle_exit_;
  Fd epoll_;
  Fd wake_;  // an eventfd: readable once Stop() was called, for every worker
  std::atomic<bool> stopping_{false};
  std::atomic<size_t> threads_{0};      // workers not ended (Recount)
  std::atomic<bool> saturated_{false};  // (Recount)
  std::mutex workers_mu_;
  size_t waiting_ = 0;              // (workers_mu_) workers in epoll_wait, or about to be
  size_t spawnable_ = SIZE_MAX;     // (workers_mu_) as many as could start when one could not
  std::list<std::thread> workers_;  // (workers_mu_)
  std::vector<Worker> exited_;      // (workers_mu_) ended, not joined yet
  // (workers_mu_) Those with connections served or parked.
  std::unordered_map<uint64_t, Host> hosts_;
  std::map<GroupKey, Group> groups_;
  size_t serving_ = 0;  // (workers_mu_) connections being served, all hosts
  // Every connection's entry, also held here: an idle one is otherwise named by the kernel's
  // epoll set alone (LeakSanitizer, which cannot see it there, would call it a leak).
  std::mutex entries_mu_;
  std::unordered_map<Entry*, std::unique_ptr<Entry>> entries_;  // (entries_mu_)
};

}  // namespace xfer::net
