// The prefill side WRITEs a request's KV blocks into a decode server, then tells it "request 7
// ready": the notification arrives only after every byte has landed in the decode server's
// memory, so the decode server may use the blocks the moment it sees the message.
//
//   terminal 1:  xfer-example-write-ready decode  127.0.0.1:5556   (exits after one request)
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

int Decode(const std::string& name) {
  xfer::Engine engine;
  void* pool = nullptr;
  if (auto s = example::ServePool(engine, name, kBlock * kBlocks, &pool); !s.ok()) return Fail("serve", s);
  std::printf("decode: %llu free blocks at %s; waiting for a request's blocks\n",
              static_cast<unsigned long long>(kBlocks), engine.LocalName().c_str());
  std::fflush(stdout);  // (the address, for whoever starts the other side)
  std::vector<xfer::Notification> got;
  if (auto s = engine.WaitNotifies(&got, 60s); !s.ok()) return Fail("WaitNotifies", s);
  unsigned long long request = 0, blocks = 0;
  if (std::sscanf(got[0].message.c_str(), "request %llu ready %llu", &request, &blocks) != 2 ||
      blocks > kBlocks) {
    std::fprintf(stderr, "decode: unexpected notification '%s'\n", got[0].message.c_str());
    return 1;
  }
  // Every byte is here: check the blocks.
  for (uint64_t b = 0; b < blocks; ++b) {
    const char* p = static_cast<const char*>(pool) + b * kBlock;
    if (p[0] != char(request + b) || p[kBlock - 1] != char(request + b)) {
      std::fprintf(stderr, "decode: block %llu is not there\n", static_cast<unsigned long long>(b));
      return 1;
    }
  }
  std::printf("decode: request %llu ready (%llu blocks from %s), decoding\n", request, blocks,
              got[0].sender.c_str());
  return 0;
}

int Prefill(const std::string& remote) {
  xfer::Engine engine;
  xfer::RegionInfo found;
  if (auto s = example::OpenPool(engine, remote, &found); !s.ok()) return Fail("the peer's pool", s);
  const xfer::RegionInfo* pool = &found;

  constexpr uint64_t kRequest = 7, kUsed = 24;
  std::vector<char> kv(kUsed * kBlock);
  std::vector<xfer::TransferDesc> descs;
  for (uint64_t b = 0; b < kUsed; ++b) {
    std::memset(kv.data() + b * kBlock, int(kRequest + b), kBlock);
    descs.push_back({reinterpret_cast<uint64_t>(kv.data()) + b * kBlock, pool->addr + b * kBlock, kBlock});
  }
  xfer::TransferOptions options;
  options.notify = "request " + std::to_string(kRequest) + " ready " + std::to_string(kUsed);
  xfer::RequestHandle req = 0;
  if (auto s = engine.TransferAsync(remote, xfer::Op::kWrite, descs, 10s, options, &req); !s.ok()) {
    return Fail("WRITE", s);
  }
  xfer::RequestStatus st;
  if (auto s = engine.Wait(req, 20s, &st); !s.ok()) {
    std::fprintf(stderr, "WRITE: %s; %zu of %zu blocks landed\n", s.ToString().c_str(), st.landed.size(),
                 descs.size());
    return 1;
  }
  std::printf("prefill: request %llu written and announced\n", static_cast<unsigned long long>(kRequest));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string role = argc > 1 ? argv[1] : "";
  if (argc == 3 && role == "decode") return Decode(argv[2]);
  if (argc == 3 && role == "prefill") return Prefill(argv[2]);
  std::fprintf(stderr, "usage: %s decode HOST:PORT | prefill HOST:PORT\n", argv[0]);
  return 2;
}
