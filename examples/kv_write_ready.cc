// The prefill side WRITEs a request's KV blocks into a decode server, then tells it "request 7
// ready": the notification arrives only after every byte has landed in the decode server's
// memory, so the decode server may use the blocks the moment it sees the message.
//
// The decode server asks for outcomes (EngineOptions::notify.outcomes): a request the prefill
// side gives up on (here request 8, canceled as its client went away), or whose prefill server
// dies (kInitiatorLost), tells the decode server so at once, with the blocks that landed, and
// it frees the blocks then instead of holding them until a timer runs out. The prefill side
// checks its blocks end to end (TransferOptions::checksum): a block damaged on the way fails
// the request with DATA_CORRUPTED, and the decode server hears kFailed without that block.
//
//   terminal 1:  xfer-example-write-ready decode  127.0.0.1:5556   (exits after two requests)
//   terminal 2:  xfer-example-write-ready prefill 127.0.0.1:5556
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "example_util.h"
#include "xfer/engine.h"

using namespace std::chrono_literals;

namespace {

using example::Fail;

constexpr uint64_t kBlock = 64 * 1024;
constexpr uint64_t kBlocks = 32;
constexpr uint64_t kUsed = 24;  // request 7's blocks: 0..23; request 8's: 24..31

// Request `request` ready: its blocks hold their bytes.
int CheckBlocks(const void* pool, unsigned long long request, unsigned long long blocks) {
  for (uint64_t b = 0; b < blocks; ++b) {
    const char* p = static_cast<const char*>(pool) + b * kBlock;
    if (p[0] != char(request + b) || p[kBlock - 1] != char(request + b)) {
      std::fprintf(stderr, "decode: block %llu is not there\n", static_cast<unsigned long long>(b));
      return 1;
    }
  }
  return 0;
}

int Decode(const std::string& name) {
  xfer::Engine engine;
  void* pool = nullptr;
  xfer::EngineOptions options;
  options.notify.outcomes = true;  // hear of the requests that did not complete, too
  if (auto s = example::ServePool(engine, name, kBlock * kBlocks, &pool, options); !s.ok())
    return Fail("serve", s);
  std::printf("decode: %llu free blocks at %s; waiting for two requests' blocks\n",
              static_cast<unsigned long long>(kBlocks), engine.LocalName().c_str());
  std::fflush(stdout);  // (the address, for whoever starts the other side)
  std::vector<xfer::Notification> got;
  while (got.size() < 2) {
    if (auto s = engine.WaitNotifies(&got, 60s); !s.ok()) return Fail("WaitNotifies", s);
  }
  for (const xfer::Notification& n : got) {
    unsigned long long request = 0, blocks = 0;
    if (std::sscanf(n.message.c_str(), "request %llu ready %llu", &request, &blocks) != 2 ||
        blocks > kBlocks) {
      std::fprintf(stderr, "decode: unexpected notification '%s'\n", n.message.c_str());
      return 1;
    }
    if (n.outcome != xfer::NotifyOutcome::kCompleted) {
      // The prefill side gave up: free the request's blocks now (those listed in n.landed hold
      // their bytes and could be kept for a retry).
      std::printf("decode: request %llu %s, %zu of %llu blocks landed; its blocks are free again\n", request,
                  std::string(xfer::NotifyOutcomeName(n.outcome)).c_str(), n.landed.size(), blocks);
      continue;
    }
    const char* first = static_cast<const char*>(pool) + (request == 7 ? 0 : kUsed) * kBlock;
    if (CheckBlocks(first, request, blocks) != 0) return 1;  // every byte is here
    std::printf("decode: request %llu ready (%llu blocks from %s), decoding\n", request, blocks,
                n.sender.c_str());
  }
  return 0;
}

// WRITEs `blocks` blocks of request `request` at the pool's block `first`, announced.
int Write(xfer::Engine& engine, const std::string& remote, const xfer::RegionInfo& pool, uint64_t request,
          uint64_t first, uint64_t blocks, bool give_up) {
  std::vector<char> kv(blocks * kBlock);
  std::vector<xfer::TransferDesc> descs;
  for (uint64_t b = 0; b < blocks; ++b) {
    std::memset(kv.data() + b * kBlock, int(request + b), kBlock);
    descs.push_back(
        {reinterpret_cast<uint64_t>(kv.data()) + b * kBlock, pool.addr + (first + b) * kBlock, kBlock});
  }
  xfer::TransferOptions options;
  options.notify = "request " + std::to_string(request) + " ready " + std::to_string(blocks);
  options.checksum = true;  // every block checked where it landed
  xfer::RequestHandle req = 0;
  if (auto s = engine.TransferAsync(remote, xfer::Op::kWrite, descs, 10s, options, &req); !s.ok()) {
    return Fail("WRITE", s);
  }
  if (give_up) (void)engine.Cancel(req);  // its client went away
  xfer::RequestStatus st;
  xfer::Status s = engine.Wait(req, 20s, &st);
  if (give_up && st.state != xfer::RequestState::kWaiting) {  // canceled, or done before the cancel
    std::printf("prefill: request %llu given up: %s\n", static_cast<unsigned long long>(request),
                std::string(xfer::RequestStateName(st.state)).c_str());
    return 0;
  }
  if (!s.ok()) {
    std::fprintf(stderr, "WRITE: %s; %zu of %zu blocks landed\n", s.ToString().c_str(), st.landed.size(),
                 descs.size());
    return 1;
  }
  std::printf("prefill: request %llu written and announced\n", static_cast<unsigned long long>(request));
  return 0;
}

int Prefill(const std::string& remote) {
  xfer::Engine engine;
  xfer::RegionInfo pool;
  if (auto s = example::OpenPool(engine, remote, &pool); !s.ok()) return Fail("the peer's pool", s);
  if (int rc = Write(engine, remote, pool, 7, 0, kUsed, false); rc != 0) return rc;
  return Write(engine, remote, pool, 8, kUsed, kBlocks - kUsed, true);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string role = argc > 1 ? argv[1] : "";
  if (argc == 3 && role == "decode") return Decode(argv[2]);
  if (argc == 3 && role == "prefill") return Prefill(argv[2]);
  std::fprintf(stderr, "usage: %s decode HOST:PORT | prefill HOST:PORT\n", argv[0]);
  return 2;
}
