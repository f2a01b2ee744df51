// xfer_test_peer: a real second process for the multi-process tests. It starts one
// xfer::Engine and is driven by a line protocol on stdin/stdout.
//
//   xfer_test_peer --name 127.0.0.1:0 [--host-id X] [--heartbeat-ms N]
//                  [--heartbeat-timeout-ms N] [--streams N] [--transport T] [--ucx auto|on|off]
//                  [--staging auto|always|off] [--staging-buffers N] [--notify-queue N]
//                  [--notify-ring BYTES]
//                  [--secret-file FILE] [--fd-headroom N] [--metadata URL --cluster-name NAME]
//                  [--metrics-listen HOST:PORT] [--option KEY=VALUE]... (xfer::SetOption)
//
// After Initialize it prints "READY <bound name> <pid>" (or "FAIL <status>" and exits 2).
// Then each stdin line is one command, answered by exactly one line: "OK [...]" or
// "ERR <STATUS_CODE_NAME or BAD_COMMAND> <message>". Numbers are decimal.
//
//   alloc <bytes> [tag] [ro]     map fresh zeroed memory, register it     -> OK <handle> <addr>
//                                (tag "-": none; ro: PeerAccess::kReadOnly, also for shmalloc, reg)
//   dalloc <bytes> [device] [tag] [ro]  GPU memory from Engine::AllocMem(kCuda) on `device` (default
//                                -1: the current one), registered          -> OK <handle> <addr>
//   dreg <bytes> [device] [tag] [ro]  cudaMalloc'd memory (cuda::AllocDevice) registered with
//                                RegisterMem(kCuda); freed at exit         -> OK <handle> <addr>
//   buf <bytes>                  map fresh zeroed memory, do not register -> OK <addr>
//   reg <addr> <len> [tag] [ro]  register a range                         -> OK <handle>
//   dereg <handle> [seed]        deregister (blocks until peers let go); with a seed, pattern-fill
//                                the region the moment DeregisterMem returns -> OK
//   fill <handle> <seed>         pattern-fill a registered region         -> OK
//   fillr <addr> <len> <seed>    pattern-fill any range                   -> OK
//   sum <handle>                 hash a registered region's contents      -> OK <hash>
//   sumr <addr> <len>            hash any range                           -> OK <hash>
//                                (fill/sum of GPU memory go through a host copy: cuda::Copy)
//   connect <name> [timeout_ms]                                           -> OK
//   disconnect <name>                                                     -> OK
//   metric <name> [label=value ...]  the sum of a metric's samples with those labels
//                                (Engine::GetMetrics, MetricsSnapshot::Sum) -> OK <value>
//   info <name>                  -> OK <transport> <incarnation> <pid> <outbound 0|1> <name>
//                                   <shm 0|1> <shm_bytes> <transport_bytes>
//                                   <cuda 0|1> <cuda_bytes> <staged_bytes>
//   regions <name>               -> OK <n> <addr>:<len>:<tag>[:ro] ...
//   xfer <read|write> <remote> <timeout_ms> <local> <remote_addr> <len> [count]
//                                TransferSync with count copies of one descriptor -> OK
//   axfer (same arguments)       TransferAsync                            -> OK <request>
//   (xfer and axfer take a notification message as a last word, after count)
//   wait <request> <timeout_ms>  -> OK <REQUEST_STATE> <STATUS_CODE>
//   notify <remote> <timeout_ms> <message>   SendNotify                  -> OK
//   notifies                     take what is queued -> OK <n> <sender>#<incarnation>:<message> ...
//                                (a request that did not complete: <message>!<OUTCOME>:<landed,...>)
//   watch | unwatch              start / stop checking each notification as it arrives
//                                (NotificationWatcher, notified_stream.h)
//   watched <count> <timeout_ms> wait for count -> OK <seen> <bad_data> <out_of_order>
//                                   <reordered> <other> [first problem]
//   nstream <read|write> <remote> <local> <remote_base> <size,size,...> <count> <depth> [seed]
//                                RunNotifiedStream -> OK <completed> <failed> <bad_reads> [error]
//   unmap <addr> <len>           make a range inaccessible (to fake a region whose memory went away)
//   garble_notify_rings          write a write index no ring can have into every notification
//                                ring mapped here (this engine's, and those peers offered it)
//                                -> OK <rings garbled>
//   garble_notify_records        append a whole record of one byte, 0x09 (a typed ring's kind
//                                that does not exist), to every ring mapped here -> OK <rings>
//   finalize [addr len seed]     engine.Finalize() but keep running (memory stays mapped); with
//                                arguments, pattern-fill that range the moment Finalize returns
//   sleep <ms> | ping | exit
//
// Protocol output goes to a private copy of stdout; fd 1 itself is pointed at stderr so that
// nothing the engine might print can corrupt the protocol.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "notified_stream.h"
#include "pattern.h"
#include "transport/common/cuda/cuda_api.h"
#include "xfer/engine.h"

namespace {

struct Mapping {
  void* base;
  size_t len;
};

struct Range {
  uint64_t addr;
  uint64_t len;
};

// The last words of alloc, shmalloc and reg: a tag ("-" for none), then flags in any order:
// "ro" (PeerAccess::kReadOnly) and, for shmalloc, "huge".
struct TagAndFlags {
  std::string tag;
  xfer::PeerAccess access = xfer::PeerAccess::kReadWrite;
  bool huge = false;
};
TagAndFlags ReadTagAndFlags(std::istream& in) {
  TagAndFlags t;
  in >> t.tag;
  if (t.tag == "-") t.tag.clear();
  for (std::string w; in >> w;) {
    if (w == "ro") t.access = xfer::PeerAccess::kReadOnly;
    if (w == "huge") t.huge = true;
  }
  return t;
}

class Peer {
 public:
  explicit Peer(xfer::Engine& engine) : engine_(engine) {}
  ~Peer() {
    for (const Mapping& m : maps_) munmap(m.base, m.len);
    for (void* p : device_) xfer::transport::cuda::FreeDevice(p);
  }

  // Handles one command line; sets *quit for "exit".
  std::string Handle(const std::string& line, bool* quit) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd.empty()) return Bad("empty command");
    if (cmd == "ping") return "OK";
    if (cmd == "exit") {
      *quit = true;
      return "OK";
    }
    if (cmd == "sleep") {
      uint64_t ms = 0;
      if (!(in >> ms)) return Bad("usage: sleep <ms>");
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      return "OK";
    }
    if (cmd == "alloc" || cmd == "buf") {
      uint64_t bytes = 0;
      if (!(in >> bytes) || bytes == 0) return Bad("usage: alloc <bytes> [tag] [ro]");
      const auto [tag, access, huge] = ReadTagAndFlags(in);
      void* p = Map(bytes);
      if (p == nullptr) return "ERR RESOURCE_EXHAUSTED mmap failed";
      const uint64_t addr = reinterpret_cast<uintptr_t>(p);
      if (cmd == "buf") return "OK " + std::to_string(addr);
      xfer::MemHandle h = 0;
      xfer::Status s = engine_.RegisterMem(p, bytes, xfer::MemType::kHost, &h, tag, access);
      if (!s.ok()) return Err(s);
      handles_[h] = {addr, bytes};
      return "OK " + std::to_string(h) + " " + std::to_string(addr);
    }
    if (cmd == "shmalloc") {  // shmalloc <bytes> [tag] [ro] [huge]: Engine::AllocMem
      uint64_t bytes = 0;
      if (!(in >> bytes)) return Bad("usage: shmalloc <bytes> [tag] [ro] [huge]");
      const TagAndFlags t = ReadTagAndFlags(in);
      void* p = nullptr;
      xfer::MemHandle h = 0;
      xfer::AllocOptions ao;
      ao.huge_pages = t.huge;
      ao.access = t.access;
      const std::string& tag = t.tag;
      xfer::Status s = engine_.AllocMem(bytes, xfer::MemType::kHost, &p, &h, tag, ao);
      if (!s.ok()) return Err(s);
      const uint64_t addr = reinterpret_cast<uintptr_t>(p);
      handles_[h] = {addr, bytes};
      return "OK " + std::to_string(h) + " " + std::to_string(addr);
    }
    if (cmd == "dalloc" || cmd == "dreg") {
      // dalloc: Engine::AllocMem(kCuda); dreg: cudaMalloc + RegisterMem(kCuda).
      uint64_t bytes = 0;
      int32_t device = -1;
      if (!(in >> bytes) || bytes == 0) return Bad("usage: " + cmd + " <bytes> [device] [tag] [ro]");
      in >> device;
      const auto [tag, access, huge] = ReadTagAndFlags(in);
      void* p = nullptr;
      xfer::MemHandle h = 0;
      if (cmd == "dalloc") {
        xfer::AllocOptions ao;
        ao.device = device;
        ao.access = access;
        xfer::Status s = engine_.AllocMem(bytes, xfer::MemType::kCuda, &p, &h, tag, ao);
        if (!s.ok()) return Err(s);
      } else {
        xfer::Status s = xfer::transport::cuda::AllocDevice(bytes, device, &p);
        if (!s.ok()) return Err(s);
        device_.push_back(p);
        s = engine_.RegisterMem(p, bytes, xfer::MemType::kCuda, &h, tag, access);
        if (!s.ok()) return Err(s);
      }
      const uint64_t addr = reinterpret_cast<uintptr_t>(p);
      handles_[h] = {addr, bytes};
      return "OK " + std::to_string(h) + " " + std::to_string(addr);
    }
    if (cmd == "free") {  // free <handle>: Engine::FreeMem (the memory is gone afterwards)
      xfer::MemHandle h = 0;
      if (!(in >> h)) return Bad("usage: free <handle>");
      xfer::Status s = engine_.FreeMem(h);
      if (!s.ok()) return Err(s);
      handles_.erase(h);
      return "OK";
    }
    if (cmd == "reg") {
      uint64_t addr = 0, len = 0;
      if (!(in >> addr >> len)) return Bad("usage: reg <addr> <len> [tag] [ro]");
      const auto [tag, access, huge] = ReadTagAndFlags(in);
      xfer::MemHandle h = 0;
      xfer::Status s =
          engine_.RegisterMem(reinterpret_cast<void*>(addr), len, xfer::MemType::kHost, &h, tag, access);
      if (!s.ok()) return Err(s);
      handles_[h] = {addr, len};
      return "OK " + std::to_string(h);
    }
    if (cmd == "dereg") {
      xfer::MemHandle h = 0;
      if (!(in >> h)) return Bad("usage: dereg <handle>");
      uint64_t seed = 0;
      const bool fill = static_cast<bool>(in >> seed);
      auto it = handles_.find(h);
      // GPU memory is filled from a host copy of the pattern, made before DeregisterMem so
      // that the fill follows its return as closely as a host region's does.
      std::vector<unsigned char> pattern;
      const bool device = fill && it != handles_.end() && IsDevice(it->second.addr);
      if (device) {
        pattern.resize(it->second.len);
        xfer_test::FillPattern(pattern.data(), pattern.size(), seed);
      }
      xfer::Status s = engine_.DeregisterMem(h);
      if (!s.ok()) return Err(s);
      // The memory stays mapped (and in handles_) for sum/fill.
      if (device) return CopyToDevice(pattern, it->second.addr);
      if (fill && it != handles_.end()) {
        xfer_test::FillPattern(reinterpret_cast<void*>(it->second.addr), it->second.len, seed);
      }
      return "OK";
    }
    if (cmd == "fill" || cmd == "sum") {
      xfer::MemHandle h = 0;
      if (!(in >> h)) return Bad("usage: " + cmd + " <handle> ...");
      auto it = handles_.find(h);
      if (it == handles_.end()) return Bad("unknown handle " + std::to_string(h));
      return FillOrSum(cmd == "fill", it->second, in);
    }
    if (cmd == "fillr" || cmd == "sumr") {
      Range r{};
      if (!(in >> r.addr >> r.len)) return Bad("usage: " + cmd + " <addr> <len> ...");
      return FillOrSum(cmd == "fillr", r, in);
    }
    if (cmd == "finalize") {
      Range r{};
      uint64_t seed = 0;
      const bool fill = static_cast<bool>(in >> r.addr >> r.len >> seed);
      engine_.Finalize();
      if (fill) xfer_test::FillPattern(reinterpret_cast<void*>(r.addr), r.len, seed);
      return "OK";
    }
    if (cmd == "garble_notify_records") {
      // As above; a record is an 8-byte length, then its bytes padded to 8, at the writer's
      // index (byte 64) modulo the capacity (byte 8), after the 192-byte header.
      std::ifstream maps("/proc/self/maps");
      int garbled = 0;
      for (std::string line; std::getline(maps, line);) {
        if (line.find("/memfd:xfer-notify.") == std::string::npos) continue;
        auto* base = reinterpret_cast<uint8_t*>(std::stoull(line.substr(0, line.find('-')), nullptr, 16));
        uint64_t capacity = 0, head = 0;
        std::memcpy(&capacity, base + 8, 8);
        head = __atomic_load_n(reinterpret_cast<uint64_t*>(base + 64), __ATOMIC_ACQUIRE);
        if (capacity - head % capacity < 16) continue;  // (no room before the end: left alone)
        const uint64_t len = 1;
        std::memcpy(base + 192 + head % capacity, &len, 8);
        base[192 + head % capacity + 8] = 0x09;
        __atomic_store_n(reinterpret_cast<uint64_t*>(base + 64), head + 16, __ATOMIC_RELEASE);
        ++garbled;
      }
      return "OK " + std::to_string(garbled);
    }
    if (cmd == "garble_notify_rings") {
      // This process's mappings of its own rings, by their memfd names (core/notify/notify_rings.h);
      // the writer's index is the word at byte 64 (core/notify_ring.cc).
      std::ifstream maps("/proc/self/maps");
      std::string line;
      int garbled = 0;
      while (std::getline(maps, line)) {
        if (line.find("/memfd:xfer-notify.") == std::string::npos) continue;
        const uint64_t base = std::stoull(line.substr(0, line.find('-')), nullptr, 16);
        const uint64_t wild = ~uint64_t{0} - 7;
        std::memcpy(reinterpret_cast<void*>(base + 64), &wild, sizeof wild);
        ++garbled;
      }
      return "OK " + std::to_string(garbled);
    }
    if (cmd == "unmap") {
      uint64_t addr = 0, len = 0;
      if (!(in >> addr >> len)) return Bad("usage: unmap <addr> <len>");
      // In place, in one step: a hole left by munmap could be filled by another thread's mmap.
      if (mmap(reinterpret_cast<void*>(addr), len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
               0) == MAP_FAILED) {
        return "ERR INTERNAL mmap PROT_NONE failed";
      }
      return "OK";
    }
    if (cmd == "connect") {
      std::string name;
      uint64_t ms = 5000;
      if (!(in >> name)) return Bad("usage: connect <name> [timeout_ms]");
      in >> ms;
      xfer::Status s = engine_.Connect(name, std::chrono::milliseconds(ms));
      return s.ok() ? "OK" : Err(s);
    }
    if (cmd == "disconnect") {
      std::string name;
      if (!(in >> name)) return Bad("usage: disconnect <name>");
      xfer::Status s = engine_.Disconnect(name);
      return s.ok() ? "OK" : Err(s);
    }
    if (cmd == "metric") {
      std::string metric, label;
      if (!(in >> metric)) return Bad("usage: metric <name> [label=value ...]");
      xfer::MetricsSnapshot snapshot;
      xfer::Status s = engine_.GetMetrics(&snapshot);
      if (!s.ok()) return Err(s);
      std::vector<std::pair<std::string, std::string>> want;
      while (in >> label) {
        const size_t eq = label.find('=');
        if (eq == std::string::npos) return Bad("labels are label=value");
        want.emplace_back(label.substr(0, eq), label.substr(eq + 1));
      }
      const xfer::Metric* m = snapshot.Find(metric);
      double sum = 0;
      for (const auto& sample : m ? m->samples : std::vector<xfer::MetricSample>{}) {
        bool match = true;
        for (const auto& [k, v] : want) match = match && sample.Label(k) == v;
        if (match) sum += sample.value;
      }
      return "OK " + std::to_string(static_cast<uint64_t>(sum));
    }
    if (cmd == "info") {
      std::string name;
      if (!(in >> name)) return Bad("usage: info <name>");
      xfer::PeerInfo info;
      xfer::Status s = engine_.GetPeerInfo(name, &info);
      if (!s.ok()) return Err(s);
      return "OK " + (info.transport.empty() ? std::string("-") : info.transport) + " " +
             std::to_string(info.incarnation) + " " + std::to_string(info.pid) + " " +
             (info.outbound ? "1" : "0") + " " + info.name + " " + (info.Reaches("shm") ? "1" : "0") + " " +
             std::to_string(info.BytesVia("shm")) + " " + std::to_string(info.BytesVia(info.transport)) +
             " " + (info.Reaches("cuda") ? "1" : "0") + " " + std::to_string(info.BytesVia("cuda")) + " " +
             std::to_string(info.BytesVia("staged"));
    }
    if (cmd == "nic_pairs") {  // GetPeerInfo's nic_pairs: "OK <count> <bytes>..." in its order
      std::string name;
      if (!(in >> name)) return Bad("usage: nic_pairs <name>");
      xfer::PeerInfo info;
      xfer::Status s = engine_.GetPeerInfo(name, &info);
      if (!s.ok()) return Err(s);
      std::string out = "OK " + std::to_string(info.nic_pairs.size());
      for (const auto& p : info.nic_pairs) out += " " + std::to_string(p.bytes);
      return out;
    }
    if (cmd == "regions") {
      std::string name;
      if (!(in >> name)) return Bad("usage: regions <name>");
      std::vector<xfer::RegionInfo> regions;
      xfer::Status s = engine_.GetRemoteRegions(name, &regions);
      if (!s.ok()) return Err(s);
      std::string out = "OK " + std::to_string(regions.size());
      for (const auto& r : regions) {
        out += " " + std::to_string(r.addr) + ":" + std::to_string(r.len) + ":" + r.tag +
               (r.access == xfer::PeerAccess::kReadOnly ? ":ro" : "");
      }
      return out;
    }
    if (cmd == "xfer" || cmd == "axfer") {
      std::string op_name, remote;
      uint64_t ms = 0, local = 0, raddr = 0, len = 0, count = 1;
      if (!(in >> op_name >> remote >> ms >> local >> raddr >> len) ||
          (op_name != "read" && op_name != "write")) {
        return Bad("usage: " + cmd +
                   " <read|write> <remote> <timeout_ms> <local> <remote_addr> <len> [count]");
      }
      in >> count;
      xfer::TransferOptions options;
      if (std::string message; in >> message) options.notify = message;
      const xfer::Op op = op_name == "read" ? xfer::Op::kRead : xfer::Op::kWrite;
      std::vector<xfer::TransferDesc> descs(count, xfer::TransferDesc{local, raddr, len});
      if (cmd == "xfer") {
        xfer::Status s = engine_.TransferSync(remote, op, descs, std::chrono::milliseconds(ms), options);
        return s.ok() ? "OK" : Err(s);
      }
      xfer::RequestHandle req = 0;
      xfer::Status s = engine_.TransferAsync(remote, op, descs, std::chrono::milliseconds(ms), options, &req);
      return s.ok() ? "OK " + std::to_string(req) : Err(s);
    }
    if (cmd == "wait") {
      xfer::RequestHandle req = 0;
      uint64_t ms = 0;
      if (!(in >> req >> ms)) return Bad("usage: wait <request> <timeout_ms>");
      xfer::RequestStatus st;
      xfer::Status s = engine_.Wait(req, std::chrono::milliseconds(ms), &st);
      return "OK " + std::string(xfer::RequestStateName(st.state)) + " " +
             std::string(xfer::StatusCodeName(s.code()));
    }
    if (cmd == "notify" || cmd == "notifies" || cmd == "watch" || cmd == "unwatch" || cmd == "watched" ||
        cmd == "nstream") {
      return HandleNotify(cmd, in);
    }
    return Bad("unknown command '" + cmd + "'");
  }

 private:
  static std::string Bad(const std::string& why) { return "ERR BAD_COMMAND " + why; }
  static std::string Err(const xfer::Status& s) {
    return "ERR " + std::string(xfer::StatusCodeName(s.code())) + " " + s.message();
  }

  static bool IsDevice(uint64_t addr) {
    xfer::MemType type = xfer::MemType::kHost;
    int32_t device = -1;
    xfer::transport::cuda::Classify(reinterpret_cast<void*>(addr), &type, &device);
    return type == xfer::MemType::kCuda;
  }

  static std::string FillOrSum(bool fill, Range r, std::istringstream& in) {
    void* p = reinterpret_cast<void*>(r.addr);
    uint64_t seed = 0;
    if (fill && !(in >> seed)) return Bad("missing seed");
    if (IsDevice(r.addr)) return DeviceFillOrSum(fill, r, seed);
    if (!fill) return "OK " + std::to_string(xfer_test::Hash64(p, r.len));
    xfer_test::FillPattern(p, r.len, seed);
    return "OK";
  }

  // GPU memory: the same pattern and hash, through a host copy of the whole range.
  static std::string DeviceFillOrSum(bool fill, Range r, uint64_t seed) {
    std::vector<unsigned char> host(r.len);
    if (fill) {
      xfer_test::FillPattern(host.data(), r.len, seed);
      return CopyToDevice(host, r.addr);
    }
    const xfer::transport::Slice slice{reinterpret_cast<uintptr_t>(host.data()), r.addr, r.len};
    xfer::Status s = xfer::transport::cuda::Copy(xfer::Op::kRead, {&slice, 1},
                                                 std::chrono::steady_clock::now() + std::chrono::seconds(60));
    if (!s.ok()) return Err(s);
    return "OK " + std::to_string(xfer_test::Hash64(host.data(), r.len));
  }

  static std::string CopyToDevice(const std::vector<unsigned char>& host, uint64_t addr) {
    const xfer::transport::Slice slice{reinterpret_cast<uintptr_t>(host.data()), addr, host.size()};
    xfer::Status s = xfer::transport::cuda::Copy(xfer::Op::kWrite, {&slice, 1},
                                                 std::chrono::steady_clock::now() + std::chrono::seconds(60));
    return s.ok() ? "OK" : Err(s);
  }

  std::string HandleNotify(const std::string& cmd, std::istringstream& in) {
    if (cmd == "notify") {
      std::string remote, message;
      uint64_t ms = 0;
      if (!(in >> remote >> ms >> message)) return Bad("usage: notify <remote> <timeout_ms> <message>");
      xfer::Status s = engine_.SendNotify(remote, message, std::chrono::milliseconds(ms));
      return s.ok() ? "OK" : Err(s);
    }
    if (cmd == "notifies") {
      std::vector<xfer::Notification> got;
      xfer::Status s = engine_.GetNotifies(&got);
      if (!s.ok()) return Err(s);
      std::string out = "OK " + std::to_string(got.size());
      for (const auto& n : got) {
        out += " " + n.sender + "#" + std::to_string(n.sender_incarnation) + ":" + n.message;
        if (n.outcome == xfer::NotifyOutcome::kCompleted) continue;
        out += "!" + std::string(xfer::NotifyOutcomeName(n.outcome)) + ":";
        for (size_t k = 0; k < n.landed.size(); ++k) out += (k ? "," : "") + std::to_string(n.landed[k]);
      }
      return out;
    }
    if (cmd == "watch") {
      watcher_ = std::make_unique<xfer_test::NotificationWatcher>(engine_, DeviceAwareAccess());
      return "OK";
    }
    if (cmd == "unwatch") {
      watcher_.reset();
      return "OK";
    }
    if (cmd == "watched") {
      uint64_t count = 0, ms = 0;
      if (!(in >> count >> ms)) return Bad("usage: watched <count> <timeout_ms>");
      if (!watcher_) return Bad("not watching");
      const auto st = watcher_->WaitFor(count, std::chrono::milliseconds(ms));
      return "OK " + std::to_string(st.seen) + " " + std::to_string(st.bad_data) + " " +
             std::to_string(st.out_of_order) + " " + std::to_string(st.reordered) + " " +
             std::to_string(st.other) + " " + st.first_problem;
    }
    // nstream
    std::string op_name, remote, size_list;
    uint64_t local = 0, base = 0, count = 0, depth = 0, seed = 7;
    if (!(in >> op_name >> remote >> local >> base >> size_list >> count >> depth)) {
      return Bad("usage: nstream <read|write> <remote> <local> <remote_base> <sizes> <count> <depth> [seed]");
    }
    in >> seed;
    std::vector<uint64_t> sizes;
    std::istringstream list(size_list);
    for (std::string item; std::getline(list, item, ',');) sizes.push_back(std::stoull(item));
    const auto r =
        xfer_test::RunNotifiedStream(engine_, remote, op_name == "read" ? xfer::Op::kRead : xfer::Op::kWrite,
                                     local, base, sizes, count, depth, seed);
    return "OK " + std::to_string(r.completed) + " " + std::to_string(r.failed) + " " +
           std::to_string(r.bad_reads) + " " + r.first_error;
  }

  // Host memory directly; GPU memory through host copies (as fill and sum do).
  static xfer_test::MemoryAccess DeviceAwareAccess() {
    return {[](uint64_t a, uint64_t l) {
              std::istringstream none;
              const std::string r = FillOrSum(false, Range{a, l}, none);
              return r.rfind("OK ", 0) == 0 ? std::stoull(r.substr(3)) : 0;
            },
            [](uint64_t a, uint64_t l, uint64_t seed) {
              std::istringstream in(std::to_string(seed));
              (void)FillOrSum(true, Range{a, l}, in);
            }};
  }

  void* Map(uint64_t bytes) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t len = (bytes + page - 1) / page * page;
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    maps_.push_back({p, len});
    return p;
  }

  xfer::Engine& engine_;
  std::vector<Mapping> maps_;
  std::map<xfer::MemHandle, Range> handles_;
  std::vector<void*> device_;  // dreg: cudaMalloc'd memory, freed after the engine finalized
  std::unique_ptr<xfer_test::NotificationWatcher> watcher_;
};

std::string OneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::string name = "127.0.0.1:0";
  xfer::EngineOptions options;
  int fd_headroom = -1;  // >= 0: after Initialize, allow only that many more open descriptors
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "xfer_test_peer: %s needs a value\n", arg.c_str());
      return 2;
    }
    const std::string value = argv[++i];
    if (arg == "--name") {
      name = value;
    } else if (arg == "--host-id") {
      options.host_id = value;
    } else if (arg == "--heartbeat-ms") {
      options.heartbeat_interval = std::chrono::milliseconds(std::stoll(value));
    } else if (arg == "--heartbeat-timeout-ms") {
      options.heartbeat_timeout = std::chrono::milliseconds(std::stoll(value));
    } else if (arg == "--streams") {
      options.streams = std::stoi(value);
    } else if (arg == "--transport") {
      options.transport = value;
    } else if (arg == "--ucx" && xfer::ParseUcxMode(value, &options.ucx.mode)) {
    } else if (arg == "--staging" && xfer::ParseStaging(value, &options.staging)) {
    } else if (arg == "--staging-buffers") {
      options.staging_buffers = std::stoi(value);
    } else if (arg == "--notify-queue") {
      options.notify.queue_messages = static_cast<uint32_t>(std::stoul(value));
    } else if (arg == "--option") {
      const size_t eq = value.find('=');
      if (xfer::Status s = xfer::SetOption(&options, value.substr(0, eq),
                                           eq == std::string::npos ? "" : value.substr(eq + 1));
          !s.ok()) {
        std::fprintf(stderr, "xfer_test_peer: --option %s: %s\n", value.c_str(), s.ToString().c_str());
        return 2;
      }
    } else if (arg == "--notify-ring") {
      options.notify.ring_bytes = std::stoull(value);
    } else if (arg == "--secret-file") {
      options.secret_file = value;
    } else if (arg == "--metadata") {
      options.metadata = value;
    } else if (arg == "--cluster-name") {
      options.cluster_name = value;
    } else if (arg == "--metrics-listen") {
      options.metrics_listen = value;
    } else if (arg == "--fd-headroom") {
      fd_headroom = std::stoi(value);
    } else if (arg == "--tcp-nics") {
      options.tcp.nics = xfer::SplitList(value);
    } else {
      std::fprintf(stderr, "xfer_test_peer: unknown argument %s\n", arg.c_str());
      return 2;
    }
  }

  // Keep the protocol on a private descriptor; anything else written to stdout goes to stderr.
  const int proto_fd = dup(STDOUT_FILENO);
  if (proto_fd < 0 || dup2(STDERR_FILENO, STDOUT_FILENO) < 0) return 2;
  FILE* out = fdopen(proto_fd, "w");
  if (out == nullptr) return 2;
  auto reply = [out](const std::string& s) {
    std::fprintf(out, "%s\n", OneLine(s).c_str());
    std::fflush(out);
  };

  xfer::Engine engine;
  xfer::Status s = engine.Initialize(name, options);
  if (!s.ok()) {
    reply("FAIL " + s.ToString());
    return 2;
  }
  if (fd_headroom >= 0) {
    int open_fds = 0;
    for (int fd = 0; fd < 65536; ++fd) open_fds += fcntl(fd, F_GETFD) >= 0 ? 1 : 0;
    const rlimit r{static_cast<rlim_t>(open_fds + fd_headroom), static_cast<rlim_t>(open_fds + fd_headroom)};
    if (setrlimit(RLIMIT_NOFILE, &r) != 0) {
      reply("FAIL setrlimit");
      return 2;
    }
  }
  reply("READY " + engine.LocalName() + " " + std::to_string(getpid()));

  {
    Peer peer(engine);
    std::string line;
    bool quit = false;
    while (!quit && std::getline(std::cin, line)) reply(peer.Handle(line, &quit));
    // Finalize before the memory is unmapped so no peer can still be using it.
    engine.Finalize();
  }
  std::fclose(out);
  return 0;
}
