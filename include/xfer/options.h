// Engine options. Every field has a default that works; see README "Options".
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace xfer {

struct EngineOptions {
  // Control plane. A peer silent for heartbeat_timeout is declared dead: its requests fail
  // with kConnectionLost and its cached state is dropped.
  std::chrono::milliseconds heartbeat_interval{500};
  std::chrono::milliseconds heartbeat_timeout{3000};
  // Connect to a peer on first transfer when no session exists, with this timeout.
  bool auto_connect = false;
  std::chrono::milliseconds auto_connect_timeout{5000};

  // Data path. Streams are worker threads that share a request's batches.
  int streams = 2;
  // Large descriptors are cut into slices of this many bytes, so streams can share them, and a
  // batch (one system call for cma, one frame for tcp) carries up to batch_bytes. 0 takes each
  // transport's own measured default: 256 KiB for local and cma (amortizes a ~1.5 us call yet
  // lets a 512 KiB request use two cores), 512 KiB for tcp (fewer round trips per byte).
  uint64_t slice_bytes = 0;
  uint64_t batch_bytes = 0;
  // Copies into or out of a same-host peer's AllocMem memory (shm) use non-temporal stores,
  // which bypass the caches, for descriptors at least this long; plain memcpy below. Streaming
  // ran at 1.7x memcpy out of cache here but loses in cache, so the default, 0, means the size
  // of the last-level cache: such a copy cannot stay in cache anyway. Set it lower when your
  // transfers stream through far more memory than the caches hold (e.g. KV-cache blocks).
  uint64_t streaming_copy_bytes = 0;
  // Waiters and idle streams spin this long before they sleep (a wake-up costs ~20 us here).
  std::chrono::microseconds spin{50};

  // tcp: data connections per peer; a request's batches spread over them (round-robin, or
  // the least busy connection first).
  int links = 2;
  bool least_loaded_links = false;

  // Buffer pool: staging buffers of page-locked host memory for memory pairs that no
  // transport reaches directly (GPU memory to or from a peer on another host, say): chunks are
  // copied into a buffer, sent, and copied out, several buffers in flight at once. Allocated
  // on first use. "auto": staging only where it is needed. "always": every transfer is staged,
  // host memory too (host memory then stands in for GPU memory: for tests and diagnosis).
  // "off": pairs that need staging fail with kUnsupported.
  std::string staging = "auto";
  // N buffers of S bytes stage this engine's outgoing batches; as a tcp target it stages
  // through one buffer of S bytes per data connection.
  int staging_buffers = 4;                    // N (1..64)
  uint64_t staging_buffer_bytes = 4ull << 20;  // S (64 KiB..1 GiB)
  // With a GPU present, host memory registered with the engine (RegisterMem, AllocMem) is
  // page-locked (cudaHostRegister), so copies between it and GPU memory run at the PCIe
  // link's speed (about 3.5x faster than pageable memory on an H200). Off: left pageable.
  bool pin_host_memory = true;

  // Force one transport ("local", "shm", "cma", "ucx", "tcp"); empty picks the best both
  // sides offer.
  std::string transport;
  // The ucx transport (RDMA through UCX; builds with libucx-dev), preferred over tcp for peers
  // on other hosts that offer it too. "auto": offered when this host has an RDMA device
  // (/sys/class/infiniband); without one UCX would only emulate put/get over TCP, at a
  // fraction of the tcp transport's speed. "on": offered anyway (e.g. to test over UCX's tcp).
  // "off": UCX is left alone (no UCX threads or memory maps). Forcing transport "ucx" turns it on.
  std::string ucx = "auto";
  // Overrides the host identity (default: the kernel's boot id). Engines with different host
  // ids never use same-host transports with each other; tests use this to fake two hosts.
  std::string host_id;
};

}  // namespace xfer
