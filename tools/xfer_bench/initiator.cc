#include "initiator.h"

namespace xfer::bench {
namespace {

// The bytes each path (GetPeerInfo's nic_pairs, staged_via) moved between two snapshots.
std::vector<std::pair<std::string, int64_t>> InWindow(const std::vector<PeerInfo::Moved>& before,
                                                      const std::vector<PeerInfo::Moved>& after) {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const auto& m : after) {
    uint64_t was = 0;
    for (const auto& b : before) was = b.path == m.path ? b.bytes : was;
    out.emplace_back(m.path, int64_t(m.bytes - was));
  }
  return out;
}

}  // namespace

bool Initiator::RunSize(const std::string& test, uint64_t block, const Hooks& hooks, Progress* progress,
                        Row* row, std::string* err) {
  const Op op = TestOp(test);
  const uint64_t depth = IsLat(test) ? 1 : c_.depth;
  const int nthreads = c_.threads;
  const uint64_t req_bytes = block * c_.batch;
  const auto timeout = TimeoutFor(req_bytes);
  const uint64_t dur_ns = uint64_t(c_.duration * 1e9);
  constexpr uint64_t kMaxSamples = 20000000;  // latencies kept per thread (160 MB)

  std::mutex mu;
  std::condition_variable cv;
  bool go = false;
  std::atomic<bool> stop{false};
  std::atomic<int> ready{0}, finished{0};
  // Each thread counts its own (one writer, no locked instruction a request); the monitor sums.
  struct alignas(64) Counts {
    std::atomic<uint64_t> bytes{0}, reqs{0};
  };
  std::vector<Counts> counts(static_cast<size_t>(nthreads));
  auto total = [&](std::atomic<uint64_t> Counts::*field) {
    uint64_t n = 0;
    for (const auto& c : counts) n += (c.*field).load(std::memory_order_relaxed);
    return n;
  };
  std::string first_err;
  uint64_t start = 0;
  std::vector<std::vector<uint64_t>> samples(static_cast<size_t>(nthreads));
  std::vector<uint64_t> ends(size_t(nthreads), 0), dones(size_t(nthreads), 0);

  auto set_err = [&](const std::string& e) {
    std::lock_guard<std::mutex> g(mu);
    if (first_err.empty()) first_err = e;
    stop = true;
    go = true;
    cv.notify_all();
  };
  auto worker = [&](int t) {
    Part part = PartFor(t, block);
    std::vector<TransferDesc> descs;
    uint64_t req = 0;
    const uint64_t quota =
        c_.iters ? c_.iters / uint64_t(nthreads) + (uint64_t(t) < c_.iters % uint64_t(nthreads) ? 1 : 0) : 0;
    auto fail = [&](const Status& st) {
      set_err(test + " " + std::to_string(block) + " B: " + st.ToString());
    };
    PreparedPart prepared;
    if (c_.prepared) {
      if (Status st = Prepare(part, &prepared); !st.ok()) fail(st);
    }
    auto sync = [&](uint64_t r) {
      if (c_.prepared) return engine_->TransferSync(op, SelectPairs(part, r, &prepared), timeout, transfer_);
      BuildDescs(part, r, &descs);
      return engine_->TransferSync(peer_, op, descs, timeout, transfer_);
    };
    auto async = [&](uint64_t r, RequestHandle* h) {
      if (c_.prepared)
        return engine_->TransferAsync(op, SelectPairs(part, r, &prepared), timeout, transfer_, h);
      BuildDescs(part, r, &descs);
      return engine_->TransferAsync(peer_, op, descs, timeout, transfer_, h);
    };
    // Warm-up: by default a pass over the span and at least 10 ms, at most 1 s. Its pace (one
    // request at a time; the timed loop may keep `depth` in flight) sizes the latency samples'
    // storage, which is allocated and touched here, not in the timed loop.
    uint64_t warm_ns = 0, warm_reqs = 0;
    {
      const bool by_default = c_.warmup < 0;
      const uint64_t n = by_default ? std::max<uint64_t>(8, part.lay.RequestsPerPass()) : uint64_t(c_.warmup);
      const uint64_t t0 = LoopClock::Now();
      for (; !stop; ++warm_reqs) {
        warm_ns = LoopClock::Now() - t0;
        if (by_default ? warm_ns > 1000000000ull || (warm_reqs >= n && warm_ns >= 10000000ull)
                       : warm_reqs >= n)
          break;
        Status st = sync(req++);
        if (!st.ok()) {
          fail(st);
          break;
        }
      }
    }
    auto& smp = samples[size_t(t)];
    {
      uint64_t expected = 4096;  // (without a pace to go by)
      if (c_.iters) {
        expected = quota;
      } else if (warm_reqs > 0 && warm_ns > 0) {
        expected = uint64_t(double(dur_ns) / double(warm_ns) * double(warm_reqs) * double(2 * depth));
      }
      constexpr uint64_t kMaxPrepared = 4 << 20;  // (32 MB: more grows as it comes)
      smp.resize(std::clamp<uint64_t>(expected, 4096, kMaxPrepared));
      smp.clear();  // (the capacity stays, its pages touched)
    }
    {
      std::unique_lock<std::mutex> l(mu);
      ++ready;
      cv.notify_all();
      cv.wait(l, [&] { return go; });
    }
    uint64_t done = 0, submitted = 0, end = start;
    auto more = [&](uint64_t now) {
      if (stop) return false;
      return c_.iters ? submitted < quota : now - start < dur_ns;
    };
    auto complete = [&](uint64_t t0, uint64_t now) {
      if (smp.size() < kMaxSamples) smp.push_back(now - t0);
      ++done;
      end = now;
      Counts& mine = counts[size_t(t)];
      mine.bytes.store(mine.bytes.load(std::memory_order_relaxed) + req_bytes, std::memory_order_relaxed);
      mine.reqs.store(mine.reqs.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    };
    if (depth == 1) {
      // Latency tests time the call alone. Bandwidth tests read the clock once per request
      // (LoopClock: a few percent of a 16 KiB copy): a request's time then runs from the end
      // of the one before, and includes this loop's own work.
      const bool time_call = IsLat(test);
      uint64_t now = LoopClock::Now();
      while (more(now)) {
        const uint64_t t0 = time_call ? LoopClock::Now() : now;
        Status st = sync(req++);
        now = LoopClock::Now();
        ++submitted;
        if (!st.ok()) {
          fail(st);
          break;
        }
        complete(t0, now);
      }
    } else {
      struct Slot {
        xfer::RequestHandle h = 0;
        uint64_t t0 = 0;
      };
      std::vector<Slot> ring(depth);
      size_t head = 0, inflight = 0;
      // A request's time runs from its submission (now: the clock read just before, as the
      // one-at-a-time loop does: one clock read per request) to the read after its Wait.
      auto submit = [&](Slot& s, uint64_t now) {
        s.t0 = now;
        ++submitted;
        return async(req++, &s.h);
      };
      bool failed = false;
      for (uint64_t now = LoopClock::Now(); inflight < depth && more(now); now = LoopClock::Now()) {
        Status st = submit(ring[inflight], now);
        if (!st.ok()) {
          fail(st);
          failed = true;
          break;
        }
        ++inflight;
      }
      while (inflight > 0) {
        Slot& s = ring[head];
        Status st = engine_->Wait(s.h, timeout);
        uint64_t now = LoopClock::Now();
        --inflight;
        head = head + 1 == depth ? 0 : head + 1;  // (no division a request)
        if (!st.ok()) {
          if (!failed) fail(st);
          failed = true;
          continue;  // wait for the others to end
        }
        complete(s.t0, now);
        if (!failed && more(now)) {
          const size_t tail = head + inflight;
          Slot& n = ring[tail >= depth ? tail - depth : tail];
          st = submit(n, now);
          if (!st.ok()) {
            fail(st);
            failed = true;
          } else {
            ++inflight;
          }
        }
      }
    }
    if (c_.prepared) Release(prepared);
    ends[size_t(t)] = end;
    dones[size_t(t)] = done;
    finished.fetch_add(1);
  };

  std::vector<std::thread> th;
  for (int t = 0; t < nthreads; ++t) th.emplace_back(worker, t);
  {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return ready.load() == nthreads || stop.load(); });
  }
  std::string hook_err;
  if (!stop && hooks.before_start) hook_err = hooks.before_start();
  if (!hook_err.empty()) set_err(hook_err);
  // Bytes by path before and after the timed window (nothing is in flight at either point).
  xfer::PeerInfo pi0, pi1;
  const bool have_pi0 = engine_->GetPeerInfo(peer_, &pi0).ok();
  const uint64_t cpu0 = ProcessCpuNs();
  {
    std::lock_guard<std::mutex> g(mu);
    start = LoopClock::Now();
    go = true;
    cv.notify_all();
  }
  // Monitor: peak bandwidth over 10 ms windows, the progress line every 200 ms.
  uint64_t win_t = start, win_b = 0, last_show = start;
  double peak = 0;
  while (finished.load() < nthreads) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    uint64_t now = LoopClock::Now(), b = total(&Counts::bytes);
    if (now - win_t >= 10000000ull && total(&Counts::reqs) > 0) {
      peak = std::max(peak, double(b - win_b) / double(now - win_t));
      win_t = now;
      win_b = b;
    }
    if (progress && now - last_show >= 200000000ull) {
      last_show = now;
      if (c_.iters)
        progress->Show(test, block, double(total(&Counts::reqs)), double(c_.iters), true);
      else
        progress->Show(test, block, double(now - start) / 1e9, c_.duration, false);
    }
  }
  for (auto& x : th) x.join();
  if (progress) progress->Clear();
  const uint64_t cpu1 = ProcessCpuNs();
  const bool have_pi = have_pi0 && engine_->GetPeerInfo(peer_, &pi1).ok();
  if (first_err.empty() && hooks.after_end) {
    std::string e = hooks.after_end();
    if (!e.empty()) first_err = e;
  }
  if (!first_err.empty()) {
    *err = first_err;
    return false;
  }
  uint64_t end = start, done = 0;
  std::vector<uint64_t> all;
  for (int t = 0; t < nthreads; ++t) {
    end = std::max(end, ends[size_t(t)]);
    done += dones[size_t(t)];
    all.insert(all.end(), samples[size_t(t)].begin(), samples[size_t(t)].end());
  }
  const double secs = double(end - start) / 1e9;
  row->test = test;
  row->bytes = block;
  row->requests = done;
  row->descs = done * c_.batch;
  row->seconds = secs;
  row->bw_avg = secs > 0 ? double(done * req_bytes) / secs / 1e9 : 0;
  // A window shorter than the run can exceed the average; a run shorter than a window cannot.
  row->bw_peak = std::max(peak, row->bw_avg);
  row->msg_rate = secs > 0 ? double(row->descs) / secs / 1e6 : 0;
  row->lat = ComputeLatStats(all);
  row->cpu = secs > 0 ? double(cpu1 - cpu0) / 1e9 / secs * 100 : -1;
  if (have_pi) {
    auto moved = [&](std::string_view path) { return int64_t(pi1.BytesVia(path) - pi0.BytesVia(path)); };
    row->shm_bytes = moved("shm");
    row->cuda_bytes = moved("cuda");
    row->staged_bytes = moved("staged");
    for (const auto& [path, bytes] : InWindow(pi0.staged_via, pi1.staged_via)) {
      if (bytes > 0) row->staged_via += (row->staged_via.empty() ? "" : "+") + path;
    }
    // The transport's column: every other route (the transport, and e.g. tcp beside cma for
    // the peer's GPU memory).
    row->transport_bytes = 0;
    for (const auto& m : pi1.moved) {
      if (m.path != "shm" && m.path != "cuda" && m.path != "staged") row->transport_bytes += moved(m.path);
    }
    row->nic_bytes = InWindow(pi0.nic_pairs, pi1.nic_pairs);
  }
  if (c_.verify) row->verify = Verify(block);
  return true;
}

// Round trip on thread 0's first and last request's blocks: fill with a pattern, WRITE, clear,
// READ back, compare. Uses the benchmark's own descriptors, so a misplaced block shows. GPU
// buffers are filled, cleared and read back through cuda::Copy (BenchMem::Put/Set/Get).
std::string Initiator::Verify(uint64_t block) {
  Part part = PartFor(0, block);
  std::vector<TransferDesc> d;
  uint64_t last = part.lay.reuse ? 0 : part.lay.RequestsPerPass() - 1;
  const auto timeout = TimeoutFor(block * c_.batch);
  std::vector<uint8_t> want(block), got(block);
  for (uint64_t req : {uint64_t(0), last}) {
    BuildDescs(part, req, &d);
    for (uint64_t j = 0; j < d.size(); ++j) {
      FillPattern(want.data(), d[j].len, req * c_.batch + j + block);
      std::string e = local_->Put(d[j].local_addr, want.data(), d[j].len);
      if (!e.empty()) return "FAILED: filling the local buffer: " + e;
    }
    Status st = engine_->TransferSync(peer_, Op::kWrite, d, timeout);
    if (!st.ok()) return "WRITE: " + st.ToString();
    for (auto& x : d) {
      std::string e = local_->Set(x.local_addr, 0, x.len);
      if (!e.empty()) return "FAILED: clearing the local buffer: " + e;
    }
    st = engine_->TransferSync(peer_, Op::kRead, d, timeout);
    if (!st.ok()) return "READ: " + st.ToString();
    for (uint64_t j = 0; j < d.size(); ++j) {
      FillPattern(want.data(), block, req * c_.batch + j + block);
      std::string e = local_->Get(got.data(), d[j].local_addr, block);
      if (!e.empty()) return "FAILED: reading the local buffer: " + e;
      if (std::memcmp(want.data(), got.data(), block) != 0)
        return "FAILED: request " + std::to_string(req) + " descriptor " + std::to_string(j) +
               " read back different data";
    }
  }
  return "ok";
}

Status Initiator::Prepare(const Part& p, PreparedPart* out) const {
  // Every block of the thread's part of each span, in slot order (a slot's index is its number).
  constexpr uint64_t kMaxEntries = 1 << 22;
  if (p.lay.local_slots > kMaxEntries || p.lay.remote_slots > kMaxEntries) {
    return {xfer::StatusCode::kInvalidArgument,
            "--prepared: more than " + std::to_string(kMaxEntries) +
                " blocks per thread to prepare; use --reuse or a smaller --span"};
  }
  std::vector<MemRange> local(p.lay.local_slots), remote(p.lay.remote_slots);
  for (uint64_t s = 0; s < local.size(); ++s)
    local[s] = {local_->addr() + p.lbase + s * p.lay.block, p.lay.block};
  for (uint64_t s = 0; s < remote.size(); ++s)
    remote[s] = {remote_addr_ + p.rbase + s * p.lay.block, p.lay.block};
  Status st = engine_->PrepareLocalList(local, &out->local);
  if (st.ok()) st = engine_->PrepareRemoteList(peer_, remote, &out->remote);
  return st;
}

void Initiator::Release(const PreparedPart& pp) const {
  for (ListHandle h : {pp.local, pp.remote}) {
    if (h != 0) (void)engine_->ReleaseList(h);
  }
}

Status FindRegion(Engine& e, const std::string& peer, const char* tag, const MemSpec& mem, uint64_t* addr,
                  uint64_t* len, bool* shared) {
  std::vector<xfer::RegionInfo> regions;
  Status st = e.GetRemoteRegions(peer, &regions);
  if (!st.ok()) return st;
  const xfer::MemType want = mem.device ? xfer::MemType::kCuda : xfer::MemType::kHost;
  const xfer::RegionInfo* best = nullptr;
  for (const auto& r : regions)
    if (r.type == want && r.tag == tag && (!best || r.len > best->len)) best = &r;
  if (!best)
    return {xfer::StatusCode::kInvalidArgument, "the peer " + peer + " advertises no " +
                                                    (mem.device ? "GPU" : "host") + " region tagged '" + tag +
                                                    "' (is it xfer-bench?)"};
  *addr = best->addr;
  *len = best->len;
  if (shared) *shared = best->shared;
  return Status::Ok();
}

Status ConnectEngine(Engine& e, const std::string& peer, double timeout_s) {
  uint64_t deadline = NowNs() + uint64_t(timeout_s * 1e9);
  for (;;) {
    Status st = e.Connect(peer, std::chrono::milliseconds(2000));
    if (st.ok() || st.code() == xfer::StatusCode::kAlreadyConnected) return Status::Ok();
    if (st.code() == xfer::StatusCode::kInvalidArgument || st.code() == xfer::StatusCode::kUnsupported ||
        NowNs() >= deadline)
      return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace xfer::bench
