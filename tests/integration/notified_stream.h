// A stream of transfers that each carry a notification, and the target's side that checks each
// notification against the memory it names, the moment it arrives. Shared by the tests and
// xfer_test_peer (header-only), so that either side can be this process or another one.
//
// A notification's message: "<w|r> <i> <after> <addr> <len> <x>"
//   w: request i WROTE [addr, +len) of the target's memory: it must hash to x on arrival.
//   r: request i READ [addr, +len): the target overwrites it with pattern x at once; the
//      initiator's copy must still hold what was there before.
//   after: the last request the initiator had seen complete when it started request i (-1:
//      none). Its notification must have arrived before this one (they are ordered).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "pattern.h"
#include "xfer/engine.h"

namespace xfer_test {

// How the target reads and writes its memory (GPU memory needs copies through the host).
struct MemoryAccess {
  std::function<uint64_t(uint64_t addr, uint64_t len)> hash;
  std::function<void(uint64_t addr, uint64_t len, uint64_t seed)> fill;
};

inline MemoryAccess HostMemoryAccess() {
  return {[](uint64_t a, uint64_t l) { return Hash64(reinterpret_cast<const void*>(a), l); },
          [](uint64_t a, uint64_t l, uint64_t seed) { FillPattern(reinterpret_cast<void*>(a), l, seed); }};
}

// The target side: a thread that takes notifications as they come and checks each one.
class NotificationWatcher {
 public:
  struct Stats {
    uint64_t seen = 0;          // notifications of the format above
    uint64_t bad_data = 0;      // w: the memory did not hold the request's data
    uint64_t out_of_order = 0;  // arrived before the one it names as `after`
    uint64_t reordered = 0;     // arrived after a later-started request's (completion order)
    uint64_t other = 0;         // notifications of any other format
    std::string first_problem;
  };

  NotificationWatcher(xfer::Engine& engine, MemoryAccess memory)
      : engine_(engine), memory_(std::move(memory)), thread_([this] { Run(); }) {}
  ~NotificationWatcher() {
    stop_ = true;
    thread_.join();
  }
  Stats stats() {
    std::lock_guard lock(mu_);
    return stats_;
  }
  // Waits until `count` notifications were seen (or timeout); returns the stats then.
  Stats WaitFor(uint64_t count, std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (stats().seen + stats().other < count && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return stats();
  }

 private:
  void Run() {
    while (!stop_.load()) {
      std::vector<xfer::Notification> got;
      const xfer::Status s = engine_.WaitNotifies(&got, std::chrono::milliseconds(50));
      if (s.code() == xfer::StatusCode::kCanceled) {  // finalized: nothing more will come
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      for (const auto& n : got) Check(n);
    }
  }
  void Check(const xfer::Notification& n) {
    char kind = 0;
    long long i = 0, after = 0;
    unsigned long long addr = 0, len = 0, x = 0;
    const bool ours = std::sscanf(n.message.c_str(), "%c %lld %lld %llu %llu %llu", &kind, &i, &after, &addr,
                                  &len, &x) == 6;
    std::string problem;
    if (ours && kind == 'w' && memory_.hash(addr, len) != x) problem = "data missing: " + n.message;
    if (ours && kind == 'r') memory_.fill(addr, len, x);
    std::lock_guard lock(mu_);
    if (!ours) {
      ++stats_.other;
      return;
    }
    ++stats_.seen;
    if (!problem.empty()) ++stats_.bad_data;
    if (after >= 0 && arrived_.count(after) == 0) {
      ++stats_.out_of_order;
      if (problem.empty()) problem = "arrived before request " + std::to_string(after) + ": " + n.message;
    }
    if (i < max_index_) ++stats_.reordered;
    max_index_ = std::max<long long>(max_index_, i);
    arrived_.insert(i);
    if (!problem.empty() && stats_.first_problem.empty()) stats_.first_problem = problem;
  }

  xfer::Engine& engine_;
  const MemoryAccess memory_;
  std::mutex mu_;
  Stats stats_;                            // mu_
  std::unordered_set<long long> arrived_;  // mu_
  long long max_index_ = -1;               // mu_
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The initiator side: `count` requests, request i moving one block of sizes[i % n] bytes
// (blocks laid end to end from local and remote_base), at most `depth` in flight, each with a
// notification. WRITE: local block i holds pattern i+1. READ: the target's region holds
// pattern `seed` over its whole length (from remote_base); local block i must get its part.
struct StreamResult {
  uint64_t completed = 0, failed = 0, bad_reads = 0;
  std::string first_error;
};

inline StreamResult RunNotifiedStream(xfer::Engine& engine, const std::string& remote, xfer::Op op,
                                      uint64_t local, uint64_t remote_base,
                                      const std::vector<uint64_t>& sizes, uint64_t count, size_t depth,
                                      uint64_t seed = 7,
                                      std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  StreamResult res;
  std::vector<uint64_t> offset(count + 1, 0);
  for (uint64_t i = 0; i < count; ++i) offset[i + 1] = offset[i] + sizes[i % sizes.size()];
  auto* base = reinterpret_cast<unsigned char*>(local);
  std::vector<unsigned char> expected;  // READ: the target's pattern, to compare with
  if (op == xfer::Op::kWrite) {
    for (uint64_t i = 0; i < count; ++i) FillPattern(base + offset[i], offset[i + 1] - offset[i], i + 1);
  } else {
    expected.resize(offset[count]);
    FillPattern(expected.data(), expected.size(), seed);
  }
  struct InFlight {
    uint64_t i;
    xfer::RequestHandle h;
  };
  std::deque<InFlight> flight;  // oldest first
  long long last_done = -1;
  auto finish_oldest = [&] {
    const InFlight f = flight.front();
    flight.pop_front();
    xfer::RequestStatus st;
    (void)engine.Wait(f.h, timeout + std::chrono::seconds(10), &st);
    if (st.state != xfer::RequestState::kCompleted) {
      ++res.failed;
      if (res.first_error.empty()) res.first_error = std::to_string(f.i) + ": " + st.status.ToString();
      return;
    }
    ++res.completed;
    last_done = static_cast<long long>(f.i);
    const uint64_t len = offset[f.i + 1] - offset[f.i];
    if (op == xfer::Op::kRead &&
        Hash64(base + offset[f.i], len) != Hash64(expected.data() + offset[f.i], len)) {
      ++res.bad_reads;
    }
  };
  for (uint64_t i = 0; i < count; ++i) {
    if (flight.size() >= depth) finish_oldest();
    const uint64_t len = offset[i + 1] - offset[i];
    const uint64_t raddr = remote_base + offset[i];
    const uint64_t x = op == xfer::Op::kWrite ? Hash64(base + offset[i], len) : seed + 1 + i;
    xfer::TransferOptions o;
    o.notify = std::string(op == xfer::Op::kWrite ? "w " : "r ") + std::to_string(i) + " " +
               std::to_string(last_done) + " " + std::to_string(raddr) + " " + std::to_string(len) + " " +
               std::to_string(x);
    xfer::RequestHandle h = 0;
    xfer::Status s = engine.TransferAsync(remote, op, {{local + offset[i], raddr, len}}, timeout, o, &h);
    if (!s.ok()) {
      ++res.failed;
      if (res.first_error.empty()) res.first_error = std::to_string(i) + ": " + s.ToString();
      continue;
    }
    flight.push_back({i, h});
  }
  while (!flight.empty()) finish_oldest();
  return res;
}

inline uint64_t StreamBytes(const std::vector<uint64_t>& sizes, uint64_t count) {
  uint64_t total = 0;
  for (uint64_t i = 0; i < count; ++i) total += sizes[i % sizes.size()];
  return total;
}

}  // namespace xfer_test
