#include "core/datapath/planner.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "core/regions/registry.h"
#include "util/text.h"

namespace xfer {
using text::Hex;
namespace {

// noun: "descriptor", or "pair" (a request over prepared lists).
std::string DescName(size_t i, const TransferDesc& d, const char* noun = "descriptor") {
  return std::string(noun) + " " + std::to_string(i) + " {local " + Hex(d.local_addr) + ", remote " +
         Hex(d.remote_addr) + ", len " + std::to_string(d.len) + "}";
}

}  // namespace

bool LocalMemoryCheck::Allows(uint64_t addr, uint64_t len, bool need_write, MemType* type) {
  if (addr + len < addr) return false;  // wraps past the end of the address space
  MemType known;
  if (Remembered(addr, len, &known)) {
    if (type != nullptr) *type = known;
    return true;
  }
  if (type != nullptr) *type = MemType::kHost;
  if (auto a = registry_.Access(addr, len, false)) {
    last_begin_ = a->begin;
    last_end_ = a->end;
    last_type_ = a->type;
    if (type != nullptr) *type = a->type;
    return true;
  }
  if (!loaded_) {
    loaded_ = true;
    std::ifstream in("/proc/self/maps");
    std::string line;
    while (std::getline(in, line)) {
      Mapping m{};
      char perms[8] = {};
      if (std::sscanf(line.c_str(), "%" SCNx64 "-%" SCNx64 " %7s", &m.begin, &m.end, perms) != 3) {
        continue;
      }
      m.readable = perms[0] == 'r';
      m.writable = perms[1] == 'w';
      maps_.push_back(m);
    }
  }
  // Walk the (sorted) mappings that cover the range; they must be contiguous.
  uint64_t at = addr, end = addr + len;
  auto it = std::upper_bound(maps_.begin(), maps_.end(), at,
                             [](uint64_t a, const Mapping& m) { return a < m.begin; });
  if (it == maps_.begin()) return false;
  for (--it; it != maps_.end() && at < end; ++it) {
    if (it->begin > at || at >= it->end) return false;
    if (!(need_write ? it->writable : it->readable)) return false;
    at = it->end;
  }
  return at >= end;
}

int FirstRouteReaching(const PeerRoutes& peer, MemType local, RemoteRegion& r, uint8_t** mapped) {
  for (size_t i = 0; i < peer.routes.size(); ++i) {
    *mapped = nullptr;
    if (peer.routes[i]->Reach(local, r, mapped)) return static_cast<int>(i);
  }
  return -1;
}

namespace {

// The route a descriptor takes, where its remote region is mapped here (mapping routes) or
// null, and whether it passes through a staging buffer.
struct Choice {
  uint8_t route = 0;
  uint8_t* base = nullptr;
  bool staged = false;
};

std::string PairName(bool local_device, const RemoteRegion& r) {
  return std::string(local_device ? "local GPU memory" : "local host memory") + " to the peer's " +
         (r.info.type == MemType::kCuda ? "GPU memory" : "host memory");
}

Status ChooseRoute(const PeerRoutes& peer, RemoteRegion& r, bool local_device, Choice* out) {
  const auto& routes = peer.routes;
  const MemType local = local_device ? MemType::kCuda : MemType::kHost;
  if (!peer.stage_all) {
    uint8_t* base = nullptr;
    if (const int i = FirstRouteReaching(peer, local, r, &base); i >= 0) {
      *out = {static_cast<uint8_t>(i), base, false};
      return Status::Ok();
    }
  }
  // Through a staging buffer our side is host memory.
  if (local_device || peer.stage_all) {
    for (size_t i = 0; i < routes.size(); ++i) {
      uint8_t* base = nullptr;
      if (!routes[i]->Stageable() || !routes[i]->Reach(MemType::kHost, r, &base)) continue;
      if (!peer.staging) {
        return {StatusCode::kUnsupported,
                PairName(local_device, r) + " needs the buffer pool (staging through " +
                    std::string(routes[i]->backend()) + "), and EngineOptions::staging is off"};
      }
      *out = {static_cast<uint8_t>(i), nullptr, true};
      return Status::Ok();
    }
  }
  std::string why;  // (only now: refusals are rare, and their text costs allocations)
  for (const auto& route : routes) text::Append(&why, route->WhyNot(local, r));
  return {StatusCode::kUnsupported,
          "no route to this peer moves " + PairName(local_device, r) + (why.empty() ? "" : " (" + why + ")")};
}

// The link a batch runs on (null where a route has none: planner tests).
transport::Link* LinkOf(const PeerRoutes& peer, const Plan::Batch& b) {
  const transport::Route& route = *peer.routes[b.route];
  if (b.staged) {
    return b.route < peer.staged_links.size() ? peer.staged_links[b.route][b.device ? 1 : 0].get() : nullptr;
  }
  return (b.streaming ? route.shared_streaming_link() : route.shared_link()).get();
}

PlanLimits LimitsOf(const PeerRoutes& peer, const Choice& c) {
  PlanLimits l = peer.routes[c.route]->limits();
  if (c.staged) {
    l.slice_bytes = std::min(l.slice_bytes, peer.staging_bytes);
    l.batch_bytes = std::min(l.batch_bytes, peer.staging_bytes);
    l.streaming_bytes = UINT64_MAX;
  }
  return l;
}

Status CheckDescriptor(size_t i, const TransferDesc& d) {
  const char* bad = d.len == 0           ? "zero length"
                    : d.local_addr == 0  ? "null local address"
                    : d.remote_addr == 0 ? "null remote address"
                    : d.local_addr + d.len < d.local_addr || d.remote_addr + d.len < d.remote_addr
                        ? "range wraps around"
                        : nullptr;
  if (bad == nullptr) return Status::Ok();
  return {StatusCode::kInvalidArgument, DescName(i, d) + ": " + bad};
}

// A run: descriptors adjacent on both sides, in one region, on one route.
struct Run {
  transport::Slice slice;  // remote: the address mapped here, for a mapping route
  Choice choice;
  bool device;  // the local side is GPU memory
  const RemoteRegion* region;
};

// Cuts runs into slices and packs the slices into batches, each of one route and kind, as
// the runs come (so that no list of runs is written and read back: at 64 B a descriptor that
// costs more than the descriptor's own bytes).
class BatchPacker {
 public:
  BatchPacker(const PeerRoutes& routes, Plan* plan) : routes_(routes), plan_(plan) {}

  void Add(const Run& run) {
    const transport::Slice& r = run.slice;
    if (!limited_ || route_ != run.choice.route || staged_ != run.choice.staged) {
      SetLimits(run.choice);  // (once per change of route: runs of one route share them)
    }
    const bool streaming = r.len >= lim_.streaming_bytes;
    const bool device = run.choice.staged && run.device;
    const bool mapped = run.choice.base != nullptr;
    if (!kinded_ || current_.route != run.choice.route || current_.staged != run.choice.staged ||
        current_.streaming != streaming || current_.device != device || current_.mapped != mapped) {
      CloseBatch();  // (a run of another kind: a batch of its own)
      current_.route = run.choice.route;
      current_.staged = run.choice.staged;
      current_.streaming = streaming;
      current_.device = device;
      current_.mapped = mapped;
      current_.link = LinkOf(routes_, current_);
      kinded_ = true;
    }
    for (uint64_t off = 0; off < r.len; off += slice_) {
      const uint64_t n = std::min(slice_, r.len - off);
      if (current_.end > current_.begin &&
          (current_.bytes + n > batch_cap_ || current_.end - current_.begin >= max_slices_)) {
        CloseBatch();
      }
      plan_->slices.push_back({r.local + off, r.remote + off, n});
      ++current_.end;
      current_.bytes += n;
    }
  }
  void Finish() { CloseBatch(); }

 private:
  void SetLimits(const Choice& c) {
    lim_ = LimitsOf(routes_, c);
    plan_->batches_in_flight = std::min(plan_->batches_in_flight, lim_.batches_in_flight);
    slice_ = std::max<uint64_t>(lim_.slice_bytes, 1);
    batch_cap_ = std::max<uint64_t>(lim_.batch_bytes, 1);
    max_slices_ = std::max<size_t>(lim_.max_slices_per_batch, 1);
    limited_ = true;
    route_ = c.route;
    staged_ = c.staged;
  }
  void CloseBatch() {
    if (current_.end > current_.begin) plan_->batches.push_back(current_);
    current_.begin = current_.end;
    current_.bytes = 0;
  }

  const PeerRoutes& routes_;
  Plan* const plan_;
  Plan::Batch current_;
  bool kinded_ = false;  // current_'s route, flags and link are set
  PlanLimits lim_;       // of the route of the run packed last (route_, staged_), once limited_
  bool limited_ = false;
  uint8_t route_ = 0;
  bool staged_ = false;
  uint64_t slice_ = 1, batch_cap_ = 1;
  size_t max_slices_ = 1;
};

// Validates and routes descriptors one by one, coalesces them into runs, and hands each run
// to a BatchPacker once the next descriptor does not continue it. Consecutive descriptors in
// one region with the same kind of local memory share one routing decision.
class RunBuilder {
 public:
  // local: null when every descriptor is prepared (AddPrepared only).
  RunBuilder(Op op, const RemoteRegions* remote, LocalMemoryCheck* local, const PeerRoutes& routes,
             Plan* plan, size_t descriptors)
      : op_(op), remote_(remote), local_(local), routes_(routes), plan_(plan), packer_(routes, plan) {
    // (More only where a run is cut into slices; fewer where descriptors coalesce: Finish
    // gives back what coalescing left unused.)
    plan->slices.reserve(descriptors);
  }

  Status Add(size_t i, const TransferDesc& d) {
    if (Status s = CheckDescriptor(i, d); !s.ok()) return s;
    RemoteRegion* region = nullptr;
    if (Status s = Region(i, d, &region); !s.ok()) return s;
    MemType local_type = MemType::kHost;
    if (!local_->Allows(d.local_addr, d.len, op_ == Op::kRead, &local_type)) {
      return {StatusCode::kInvalidArgument, DescName(i, d, noun_) +
                                                ": local range is not registered and not " +
                                                (op_ == Op::kRead ? "writable" : "readable") +
                                                " memory of this process (GPU memory must be registered)"};
    }
    if (Status s = Route(i, d, region, local_type == MemType::kCuda); !s.ok()) return s;
    Append(d);
    return Status::Ok();
  }

  // A descriptor whose ranges were checked when its lists were prepared: its remote range lies
  // in `prepared` (looked up again when the peer has revoked that region since, or for a WRITE
  // when it is read-only), and its local side is GPU memory or not.
  Status AddPrepared(size_t i, const TransferDesc& d, const std::shared_ptr<RemoteRegion>& prepared,
                     bool device) {
    RemoteRegion* region = prepared.get();
    if (region != last_region_) {
      // Looked up afresh: a region revoked since, and for a WRITE a read-only one (the peer
      // may have registered a writable one that holds the range since).
      const bool again = prepared->revoked.load(std::memory_order_acquire) ||
                         (op_ == Op::kWrite && prepared->info.access == PeerAccess::kReadOnly);
      Status s = again ? Region(i, d, &region) : Admit(i, d, prepared);
      if (!s.ok()) return s;
    }
    if (Status s = Route(i, d, region, device); !s.ok()) return s;
    Append(d);
    return Status::Ok();
  }

  // Add's common case at a fraction of its cost (no Status, no lookup): a descriptor of
  // non-zero length whose remote range lies in the previous descriptor's region and whose
  // local range lies in the registered region found last, of the same kind. False: call Add.
  bool AddLikeLast(const TransferDesc& d) {
    const RemoteRegion* r = last_region_;
    MemType type;
    if (r == nullptr || d.len == 0 || !RangeInside(d.remote_addr, d.len, r->info.addr, r->info.len) ||
        !local_->Remembered(d.local_addr, d.len, &type) || (type == MemType::kCuda) != last_device_) {
      return false;
    }
    Append(d);
    return true;
  }
  // Packs the last run and closes the last batch. (After the last descriptor.)
  void Finish() {
    if (open_) packer_.Add(run_);
    open_ = false;
    packer_.Finish();
    auto& slices = plan_->slices;
    if (slices.capacity() > 64 && slices.size() < slices.capacity() / 4) slices.shrink_to_fit();
  }

 private:
  // Adds a checked descriptor of last_region_ on route_, to the last run when it continues it.
  void Append(const TransferDesc& d) {
    RemoteRegion* region = last_region_;
    // In mapped memory the remote address becomes the address of the mapping here.
    const uint64_t remote_addr =
        route_.base ? reinterpret_cast<uint64_t>(route_.base) + (d.remote_addr - region->info.addr)
                    : d.remote_addr;
    plan_->bytes += d.len;
    if (open_) {
      Run& r = run_;
      if (r.slice.local + r.slice.len == d.local_addr && r.slice.remote + r.slice.len == remote_addr &&
          r.region == region && r.choice.route == route_.route && r.choice.staged == route_.staged &&
          r.device == last_device_) {
        r.slice.len += d.len;
        return;
      }
      packer_.Add(run_);
    }
    run_ = {{d.local_addr, remote_addr, d.len}, route_, last_device_, region};
    open_ = true;
  }

  // The region holding the descriptor's remote range (the previous descriptor's when it holds
  // this one too), added to the plan's regions (which own it).
  Status Region(size_t i, const TransferDesc& d, RemoteRegion** out) {
    RemoteRegion* last = last_region_;
    if (last != nullptr && RangeInside(d.remote_addr, d.len, last->info.addr, last->info.len)) {
      *out = last;
      return Status::Ok();
    }
    std::shared_ptr<RemoteRegion> found =
        remote_ ? remote_->Find(d.remote_addr, d.len, op_ == Op::kWrite) : nullptr;
    if (!found) {
      return {StatusCode::kRemoteAccessDenied,
              DescName(i, d, noun_) + ": remote range is not inside one registered region of the peer"};
    }
    *out = found.get();
    return Admit(i, d, found);
  }

  // Admits a region the descriptor's remote range lies in (not the previous descriptor's):
  // refuses a WRITE into a read-only one, and adds it to the plan's regions.
  Status Admit(size_t i, const TransferDesc& d, const std::shared_ptr<RemoteRegion>& region) {
    if (op_ == Op::kWrite && region->info.access == PeerAccess::kReadOnly) {
      return {StatusCode::kRemoteAccessDenied, DescName(i, d, noun_) + ": the peer's region '" +
                                                   region->info.tag + "' at " + text::Hex(region->info.addr) +
                                                   " is read-only for peers"};
    }
    auto& regions = plan_->regions;
    if (std::find(regions.begin(), regions.end(), region) == regions.end()) regions.push_back(region);
    last_region_ = nullptr;  // routed by the caller
    return Status::Ok();
  }

  // Chooses the descriptor's route, unless it is the previous descriptor's (same region, same
  // kind of local memory).
  Status Route(size_t i, const TransferDesc& d, RemoteRegion* region, bool device) {
    if (last_region_ == region && last_device_ == device) return Status::Ok();
    if (Status s = ChooseRoute(routes_, *region, device, &route_); !s.ok()) {
      return {s.code(), DescName(i, d, noun_) + ": " + s.message()};
    }
    last_region_ = region;
    last_device_ = device;
    plan_->gpu_memory = plan_->gpu_memory || device || region->info.type == MemType::kCuda;
    return Status::Ok();
  }

  const Op op_;
  const RemoteRegions* const remote_;
  LocalMemoryCheck* const local_;
  const char* const noun_ = local_ != nullptr ? "descriptor" : "pair";  // (in refusals; after local_)
  const PeerRoutes& routes_;
  Plan* const plan_;
  BatchPacker packer_;
  Run run_{};                            // the run the last descriptor went into, not packed yet
  bool open_ = false;                    // ...once there is one
  RemoteRegion* last_region_ = nullptr;  // region of the previous descriptor
  bool last_device_ = false;             // ...whether its local side was GPU memory
  Choice route_;                         // ...and its route
};

}  // namespace

Status MakePlan(Op op, std::span<const TransferDesc> descs, const RemoteRegions& remote,
                LocalMemoryCheck& local, const PeerRoutes& routes, Plan* plan) {
  if (descs.empty()) return {StatusCode::kInvalidArgument, "no descriptors"};
  *plan = Plan{};
  RunBuilder runs(op, &remote, &local, routes, plan, descs.size());
  const bool many = descs.size() > 1;
  if (many) plan->desc_ends.reserve(descs.size());
  for (size_t i = 0; i < descs.size(); ++i) {
    if (!runs.AddLikeLast(descs[i])) {
      if (Status s = runs.Add(i, descs[i]); !s.ok()) return s;
    }
    if (many) plan->desc_ends.push_back(plan->bytes);
  }
  runs.Finish();
  return Status::Ok();
}

namespace {
std::string PairName(size_t k) { return "pair " + std::to_string(k); }
}  // namespace

Status MakePreparedPlan(Op op, const PreparedPairs& pairs, const PeerRoutes& routes, Plan* plan) {
  const size_t n = pairs.local_index.size();
  if (n == 0) return {StatusCode::kInvalidArgument, "no descriptors"};
  *plan = Plan{};
  RunBuilder runs(op, pairs.current, nullptr, routes, plan, n);
  const bool many = n > 1;
  if (many) plan->desc_ends.reserve(n);
  for (size_t k = 0; k < n; ++k) {
    const uint32_t li = pairs.local_index[k], ri = pairs.remote_index[k];
    if (li >= pairs.local.size() || ri >= pairs.remote.size()) {
      const bool local = li >= pairs.local.size();
      return {StatusCode::kInvalidArgument,
              PairName(k) + ": " + (local ? "local index " : "remote index ") +
                  std::to_string(local ? li : ri) + " is past the end of the list (" +
                  std::to_string(local ? pairs.local.size() : pairs.remote.size()) + " entries)"};
    }
    const LocalEntry& l = pairs.local[li];
    const RemoteEntry& r = pairs.remote[ri];
    if (l.len != r.len) {
      return {StatusCode::kInvalidArgument, PairName(k) + ": local entry " + std::to_string(li) + " has " +
                                                std::to_string(l.len) + " bytes, remote entry " +
                                                std::to_string(ri) + " " + std::to_string(r.len)};
    }
    if (!l.usable || (op == Op::kRead && !l.writable)) {
      return {StatusCode::kInvalidArgument,
              PairName(k) + ": local entry " + std::to_string(li) + " {" + Hex(l.addr) + ", len " +
                  std::to_string(l.len) + "} is " +
                  (l.usable ? "not writable memory of this process"
                            : "no longer registered nor readable memory of this process")};
    }
    const TransferDesc d{l.addr, r.addr, l.len};
    if (Status s = runs.AddPrepared(k, d, pairs.regions[r.region], l.type == MemType::kCuda); !s.ok()) {
      return s;
    }
    if (many) plan->desc_ends.push_back(plan->bytes);
  }
  runs.Finish();
  return Status::Ok();
}

std::vector<PlannedDescriptor> PlannedDescriptors(const Plan& plan) {
  const size_t descriptors = plan.desc_ends.empty() ? 1 : plan.desc_ends.size();
  std::vector<PlannedDescriptor> out;
  out.reserve(descriptors);
  size_t slice = 0, batch = 0;
  uint64_t slice_begin = 0;  // the request's bytes before slices[slice]
  uint64_t begin = 0;
  for (size_t k = 0; k < descriptors; ++k) {
    const uint64_t end = plan.desc_ends.empty() ? plan.bytes : plan.desc_ends[k];
    while (slice_begin + plan.slices[slice].len <= begin) slice_begin += plan.slices[slice++].len;
    while (slice >= plan.batches[batch].end) ++batch;
    const transport::Slice& s = plan.slices[slice];
    out.push_back({s.local + (begin - slice_begin), s.remote + (begin - slice_begin), end - begin,
                   plan.batches[batch].mapped});
    begin = end;
  }
  return out;
}

size_t DescriptorAt(const Plan& plan, uint64_t offset) {
  const auto& e = plan.desc_ends;
  return e.empty() ? 0 : static_cast<size_t>(std::upper_bound(e.begin(), e.end(), offset) - e.begin());
}

std::vector<uint64_t> LandedDescriptors(const Plan& plan, const std::vector<uint32_t>& unmoved) {
  const size_t descriptors = plan.desc_ends.empty() ? 1 : plan.desc_ends.size();
  std::vector<bool> moved(plan.batches.size(), true);
  for (uint32_t b : unmoved) moved[b] = false;
  // The byte ranges of the batches that did not move, in request order.
  std::vector<std::pair<uint64_t, uint64_t>> holes;
  uint64_t at = 0;
  for (size_t b = 0; b < plan.batches.size(); ++b) {
    if (!moved[b]) holes.emplace_back(at, at + plan.batches[b].bytes);
    at += plan.batches[b].bytes;
  }
  // A descriptor landed when no hole overlaps its bytes.
  std::vector<uint64_t> landed;
  size_t h = 0;
  uint64_t begin = 0;
  for (size_t k = 0; k < descriptors; ++k) {
    const uint64_t end = plan.desc_ends.empty() ? plan.bytes : plan.desc_ends[k];
    while (h < holes.size() && holes[h].second <= begin) ++h;
    if (h == holes.size() || holes[h].first >= end) landed.push_back(k);
    begin = end;
  }
  return landed;
}

}  // namespace xfer
