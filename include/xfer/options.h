// Engine options. Every field has a default that works; docs/options.md has the details.
// The engine's own options come first, then one group per backend (read by that backend
// alone).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "xfer/status.h"

namespace xfer {

// The buffer pool's mode (EngineOptions::staging).
enum class Staging : uint8_t {
  kAuto,    // staging only where it is needed (GPU memory to a peer no backend reaches it on)
  kAlways,  // every transfer is staged, host memory too (it then stands in for GPU memory:
            // for tests and diagnosis); keeps the mapping backends (shm, cuda) out
  kOff,     // pairs that need staging fail with kUnsupported
};

// Whether the ucx backend is offered (EngineOptions::ucx.mode).
enum class UcxMode : uint8_t {
  kAuto,  // when this host has an RDMA device (/sys/class/infiniband): without one UCX would
          // only emulate put/get over TCP, at a fraction of the tcp backend's speed
  kOn,    // offered anyway (e.g. to test over UCX's tcp transport)
  kOff,   // UCX is left alone (no UCX threads or memory maps)
};

// "auto", "always", "off" / "auto", "on", "off"; false for anything else.
bool ParseStaging(std::string_view text, Staging* out);
bool ParseUcxMode(std::string_view text, UcxMode* out);
// A comma-separated list ("eth1,eth2", as the tools take tcp.nics): its non-empty items.
std::vector<std::string> SplitList(std::string_view text);
std::string_view StagingName(Staging s);
std::string_view UcxModeName(UcxMode m);

struct EngineOptions {
  // Control plane. A peer silent for heartbeat_timeout is declared dead: its requests fail
  // with kConnectionLost and its cached state is dropped.
  std::chrono::milliseconds heartbeat_interval{500};
  std::chrono::milliseconds heartbeat_timeout{3000};
  // Connect to a peer on first transfer when no session exists, with this timeout.
  bool auto_connect = false;
  std::chrono::milliseconds auto_connect_timeout{5000};
  // The most regions one peer may advertise (1..16 M): a hello with more is refused, and a
  // peer that registers one more has its session closed (one log line each).
  uint32_t max_peer_regions = 1u << 20;
  // Control frames queued for one peer that does not read them (64 KiB..4 GiB): past this,
  // its session is closed (one log line), whatever it does, and the other peers are served.
  uint64_t max_unsent_bytes = 64ull << 20;
  // Sessions with peers, both ways, counting those being set up (1..1 M): past this, a peer's
  // hello gets a goodbye (one log line a second at most) and Connect kResourceExhausted.
  uint32_t max_sessions = 4096;
  // Sessions peers of one host (the address their control connection comes from) opened to
  // this engine, counting those being set up (1..1 M): past this, that host's next hello gets
  // a goodbye as above, so that one host cannot take every session.
  uint32_t max_sessions_per_host = 1024;

  // Data path. Streams are worker threads that share a request's batches.
  int streams = 2;
  // Large descriptors are cut into slices of this many bytes, so streams can share them, and a
  // batch (one system call for cma, one frame for tcp) carries up to batch_bytes. 0 takes each
  // backend's own default (docs/options.md lists them).
  uint64_t slice_bytes = 0;
  uint64_t batch_bytes = 0;
  // Waiters, idle streams and the control thread in a busy exchange (frames other than
  // heartbeats within four spins of each other) spin this long before they sleep (a wake-up
  // costs tens of us). 0..1 s.
  std::chrono::microseconds spin{50};
  // End-to-end checksums by default (TransferOptions::checksum overrides it per request):
  // once a request's bytes moved, each descriptor's bytes where they landed are checked
  // against a checksum (XXH3-64) of where they came from, on every path; a mismatch fails the
  // request with kDataCorrupted naming the descriptor. GPU memory is summed through page-locked
  // host buffers. Needs a build with libxxhash. docs/notifications.md.
  bool checksum = false;

  // Buffer pool: staging buffers of page-locked host memory for memory pairs that no backend
  // reaches directly (GPU memory to or from a peer on another host, say): chunks are copied
  // into a buffer, sent, and copied out, several buffers in flight at once. Allocated on first
  // use.
  Staging staging = Staging::kAuto;
  // N buffers of S bytes stage this engine's outgoing batches; as a tcp target it stages
  // through a pool of its own (docs/gpu.md).
  int staging_buffers = 4;                     // N (1..64)
  uint64_t staging_buffer_bytes = 4ull << 20;  // S (64 KiB..1 GiB)
  // As a target reached over ucx, the peer sessions it lends N slots of S bytes to at once
  // (its memory that the peers' UCX cannot reach goes through them); the next is refused.
  int staging_pools = 8;  // (1..256)

  // Force one backend by name ("local", "shm", "cuda", "cma", "ucx", "tcp"): a peer then gets
  // that route alone. Empty: every descriptor takes the best route both sides offer.
  std::string transport;
  // Overrides the host identity (default: the kernel's boot id). Engines with different host
  // ids never use same-host backends with each other; tests use this to fake two hosts.
  std::string host_id;

  // Peer authentication (docs/security.md). With a secret, every control connection starts
  // with a mutual challenge-response (HMAC-SHA-256 over fresh nonces of both sides, their names
  // and incarnations): an engine tells a connecting peer nothing but a nonce before the peer
  // proved it knows the same secret, and nothing of its regions, ports or process before both
  // sides did; tcp data connections prove the key their control session derived. Both engines of a pair
  // need the same secret. At least 16 bytes, taken as they are; secret_file: a file holding it
  // (its bytes as they are, a final newline included). Give one or neither. Needs a build with
  // libsodium (Initialize says UNSUPPORTED otherwise).
  std::string secret;
  std::string secret_file;
  // Cluster metadata (docs/cluster.md). metadata: empty (peers are named by address), or
  // "etcd://host:port[,host:port...][/prefix]": the engine publishes cluster_name (if set)
  // with its address, incarnation, host id and region tags under a lease that ends
  // heartbeat_timeout after the engine dies, and Connect, transfers and SendNotify take other
  // engines' cluster names. Or "http://host:port/path": an HTTP metadata server speaking
  // Mooncake's protocol (no leases: a dead engine's entry stays; no ListPeers). Initialize
  // fails when the service cannot be reached, unless start_without_metadata: it then
  // publishes once the service answers. Needs a build with libcurl.
  std::string metadata;
  std::string cluster_name;  // 1..128 of A-Z a-z 0-9 . _ - ; unique in the cluster
  bool start_without_metadata = false;

  // Notifications (Engine::SendNotify, TransferOptions::notify). The queue of those received
  // and not yet taken (GetNotifies) is bounded: a notification that would pass either bound is
  // refused (its sender's request ends with kResourceExhausted), never dropped.
  // ring_bytes: to a peer on this host, notifications go into a ring of shared memory this
  // engine offers it (no round trip; docs/notifications.md), of this many bytes (rounded up
  // to a power of two that holds two of the largest messages); when it is full, over the
  // control session, as to other hosts. 0: no ring.
  // outcomes: this engine also receives a notification for each notified request that did not
  // complete (Notification::outcome and landed: failed, timed out, canceled, or its initiator
  // lost); off, only those of completed requests. Peers then announce each notified request
  // when it begins (one more control message, no round trip; on this host, a write into its
  // ring), and its message is held here until it ends, counted against the queue's bounds
  // (begun in a ring: against the peer's share of them only).
  struct Notify {
    uint32_t max_message_bytes = 4096;   // sent and accepted (1..1 MiB)
    uint32_t queue_messages = 65536;     // (1..16 M)
    uint64_t queue_bytes = 64ull << 20;  // messages' bytes (4 KiB..16 GiB)
    uint64_t ring_bytes = 64 << 10;      // 0, or 4 KiB..1 GiB
    bool outcomes = false;
  } notify;

  // Metrics (Engine::GetMetrics; docs/metrics.md). The engine counts bytes, requests and
  // their durations by op, backend and peer, sessions and notifications, cheaply enough to
  // leave on; metrics = false stops the counting on the data path (to measure its cost).
  // metrics_listen: "host:port" (port 0: a free one, Engine::MetricsAddress) to serve them at
  // http://host:port/metrics in Prometheus' text format; empty: not served. Peers past
  // metrics_max_peers (1..4096) are counted under peer="other".
  bool metrics = true;
  std::string metrics_listen;
  uint32_t metrics_max_peers = 64;

  // --- one group per backend
  struct Tcp {
    // Data connections per peer (1..64); a request's batches spread over them (round-robin,
    // or the least busy connection first).
    int links = 2;
    bool least_loaded = false;
    // Every batch this engine sends or reads over tcp (staged ones too) carries a 64-bit
    // checksum (XXH3) of its addresses, lengths and payload, checked by the side that receives
    // it: a mismatch fails the batch, which is tried once more, then fails with
    // kDataCorrupted. Guards against corruption that TCP's own 16-bit checksum lets through
    // (faulty NICs, switches, memory).
    bool checksum = false;
    // The network interfaces this engine's tcp data connections use: each an interface name
    // ("eth1") or one of this host's IPv4 addresses. Empty (the default): one route, the one
    // the kernel picks for the peer's address. As a target, the engine also serves data
    // connections on each of these NICs and tells its peers their addresses; as an initiator,
    // it opens its connections from them, at least one per usable pair of its NICs and the
    // peer's (docs/transports.md, "Several NICs").
    std::vector<std::string> nics{};
  } tcp;
  struct Ucx {
    // RDMA through UCX (builds with libucx-dev), preferred over tcp for peers on other hosts
    // that offer it too. Forcing transport "ucx" turns it on.
    UcxMode mode = UcxMode::kAuto;
    int endpoints = 2;  // per peer (1..64), each on a worker of its own: a rail each
  } ucx;
  struct Shm {
    // Copies into or out of a same-host peer's AllocMem memory use non-temporal stores, which
    // bypass the caches, for descriptors at least this long; plain memcpy below. 0: the size
    // of the last-level cache (such a copy cannot stay in cache anyway). Set it lower when
    // transfers stream through far more memory than the caches hold (e.g. KV-cache blocks).
    uint64_t streaming_copy_bytes = 0;
  } shm;
  struct Cuda {
    // With a GPU present, host memory registered with the engine (RegisterMem, AllocMem) is
    // page-locked (cudaHostRegister), so copies between it and GPU memory run at the PCIe
    // link's speed; so is a same-host peer's AllocMem memory where this engine maps it for such
    // copies. Off: left pageable.
    bool pin_host_memory = true;
  } cuda;
};

// Options by name: "streams", "tcp.links", "notify.queue_bytes" (the field's path in
// EngineOptions), for command lines, configuration files and bindings. Each option is declared
// once, with its kind, range and a line of doc; docs/options.md has the whole text.
enum class OptionKind : uint8_t {
  kBool,      // true or false (also on/off, yes/no, 1/0)
  kCount,     // a whole number
  kBytes,     // a size: 4096, 64K, 4 MiB, 1G (K, M, G: binary)
  kDuration,  // a time: 500ms, 3 s, 50us (us, ms, s); a bare number is the field's own unit
  kText,
  kSecret,  // text (any bytes), never shown
  kList,    // comma-separated texts
  kChoice,  // one of a few names
};
struct OptionInfo {
  std::string key;
  OptionKind kind = OptionKind::kText;
  std::string value;  // as set in the options described (a secret: "(set)" or "")
  std::string range;  // what Initialize accepts: "1..256", "64 KiB..1 GiB", "auto, on, off"; "" any
  std::string doc;    // one line
};
// Every option of this build, the engine's own first, then each backend's, with its value in
// `options` (by default: the defaults).
std::vector<OptionInfo> DescribeOptions(const EngineOptions& options = {});
// Sets one option from text. kInvalidArgument naming it when the key is unknown or the text
// is not of its kind; a value out of range is Initialize's to refuse.
Status SetOption(EngineOptions* options, std::string_view key, std::string_view value);

}  // namespace xfer
