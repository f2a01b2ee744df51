// The initiator: runs one test at one size toward a peer, from --threads threads, each with
// --depth requests in flight. Used by the client, and by the target for -b/--bidirectional.
// Also: finding the peer's region and connecting to it.
#pragma once

#include <atomic>
#include <thread>

#include "bench_mem.h"
#include "row.h"
#include "system.h"

namespace xfer::bench {

struct Hooks {
  // Called on the calling thread after every worker finished its warm-up, just before the timed
  // window opens, and right after it closes. A non-empty return aborts the size.
  std::function<std::string()> before_start;
  std::function<std::string()> after_end;
};

class Initiator {
 public:
  Initiator(const Config& c, Engine* engine, std::string peer, const BenchMem* local, uint64_t remote_addr,
            uint64_t remote_len)
      : c_(c),
        engine_(engine),
        peer_(std::move(peer)),
        local_(local),
        remote_addr_(remote_addr),
        remote_len_(remote_len) {}

  // Empty when the remote region can hold what the run needs, else why not.
  std::string CheckRemote() const {
    uint64_t need = 0;
    for (uint64_t b : c_.sizes) need = std::max(need, b * c_.batch * uint64_t(c_.threads));
    if (remote_len_ < need)
      return "the peer's region (" + FormatSize(remote_len_) +
             ") is smaller than one request per "
             "thread (" +
             FormatSize(need) + "): give the server a larger span";
    return "";
  }

  bool RunSize(const std::string& test, uint64_t block, const Hooks& hooks, Progress* progress, Row* row,
               std::string* err);
  std::string Verify(uint64_t block);

  static std::chrono::milliseconds TimeoutFor(uint64_t bytes) {
    return std::chrono::milliseconds(10000 + bytes / 100000);  // 10 s + 100 MB/s worth
  }

 private:
  struct Part {  // one thread's share of both spans
    Layout lay;
    uint64_t lbase = 0, rbase = 0;
  };
  Part PartFor(int t, uint64_t block) const {
    Part p;
    const uint64_t n = uint64_t(c_.threads);
    const uint64_t lpart = local_->size() / n, rpart = remote_len_ / n;
    p.lay.block = block;
    p.lay.batch = c_.batch;
    p.lay.reuse = c_.reuse;
    p.lay.local_slots = lpart / block;
    p.lay.remote_slots = std::max<uint64_t>(1, rpart / block);
    p.lbase = uint64_t(t) * lpart;
    p.rbase = uint64_t(t) * rpart;
    return p;
  }
  void BuildDescs(const Part& p, uint64_t req, std::vector<TransferDesc>* d) const {
    d->resize(p.lay.batch);
    for (uint64_t j = 0; j < p.lay.batch; ++j) {
      (*d)[j].local_addr = local_->addr() + p.lbase + p.lay.LocalOff(req, j);
      (*d)[j].remote_addr = remote_addr_ + p.rbase + p.lay.RemoteOff(req, j);
      (*d)[j].len = p.lay.block;
    }
  }

  // --prepared: one thread's every local and remote block as two prepared lists; a request
  // names its blocks by slot.
  struct PreparedPart {
    ListHandle local = 0, remote = 0;
    std::vector<uint32_t> local_index, remote_index;  // the request's, reused
  };
  Status Prepare(const Part& p, PreparedPart* out) const;
  void Release(const PreparedPart& pp) const;
  // The request's pairs (PreparedPart::*_index) as BuildDescs would give its descriptors.
  PreparedDescs SelectPairs(const Part& p, uint64_t req, PreparedPart* pp) const {
    pp->local_index.resize(p.lay.batch);
    pp->remote_index.resize(p.lay.batch);
    for (uint64_t j = 0; j < p.lay.batch; ++j) {
      pp->local_index[j] = uint32_t(p.lay.LocalSlot(req, j));
      pp->remote_index[j] = uint32_t(p.lay.RemoteSlot(req, j));
    }
    return {pp->local, pp->local_index, pp->remote, pp->remote_index};
  }

  const Config& c_;
  static TransferOptions OptionsOf(const Config& c) {
    TransferOptions o;
    if (c.notify) o.notify = "xfer-bench done";
    return o;
  }
  const TransferOptions transfer_ = OptionsOf(c_);
  Engine* engine_;
  std::string peer_;
  const BenchMem* local_;
  uint64_t remote_addr_, remote_len_;
};

// Finds the peer's region tagged `tag` of the memory kind `mem` (host, or GPU memory), the
// largest such.
Status FindRegion(Engine& e, const std::string& peer, const char* tag, const MemSpec& mem, uint64_t* addr,
                  uint64_t* len, bool* shared = nullptr);
// Takes every notification the engine receives, on a thread of its own, so that a peer's
// --notify requests never find the queue full.
class NotifyDrain {
 public:
  explicit NotifyDrain(Engine& e)
      : thread_([&e, this] {
          std::vector<Notification> got;
          while (!stop_.load()) {
            (void)e.WaitNotifies(&got, std::chrono::milliseconds(100));
            got.clear();
          }
        }) {}
  ~NotifyDrain() {
    stop_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Connect, retrying until the deadline.
Status ConnectEngine(Engine& e, const std::string& peer, double timeout_s);

}  // namespace xfer::bench
