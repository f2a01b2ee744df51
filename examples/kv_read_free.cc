// The decode side READs a prefill server's KV blocks, then tells it "free 17-42": the prefill
// server learns from the notification alone that the blocks are copied and may be reused.
// A notification is delivered only after every byte of its request has been read, so the
// prefill server can overwrite the blocks the moment it sees the message.
//
//   terminal 1:  xfer-example-read-free prefill 127.0.0.1:5555   (exits after one request)
//   terminal 2:  xfer-example-read-free decode  127.0.0.1:5555
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
constexpr uint64_t kBlocks = 64;
constexpr uint64_t kFirst = 17, kLast = 42;  // the request's blocks

int Prefill(const std::string& name) {
  xfer::Engine engine;
  void* pool = nullptr;
  if (auto s = example::ServePool(engine, name, kBlock * kBlocks, &pool); !s.ok()) return Fail("serve", s);
  for (uint64_t b = 0; b < kBlocks; ++b) std::memset(static_cast<char*>(pool) + b * kBlock, int(b), kBlock);
  std::printf("prefill: %llu blocks at %s; waiting for the decode side to free some\n",
              static_cast<unsigned long long>(kBlocks), engine.LocalName().c_str());
  std::fflush(stdout);  // (the address, for whoever starts the other side)
  std::vector<xfer::Notification> got;
  if (auto s = engine.WaitNotifies(&got, 60s); !s.ok()) return Fail("WaitNotifies", s);
  unsigned long long first = 0, last = 0;
  if (std::sscanf(got[0].message.c_str(), "free %llu-%llu", &first, &last) != 2 || last >= kBlocks) {
    std::fprintf(stderr, "prefill: unexpected notification '%s'\n", got[0].message.c_str());
    return 1;
  }
  // The READ is over: reuse the blocks at once.
  std::memset(static_cast<char*>(pool) + first * kBlock, 0xff, (last - first + 1) * kBlock);
  std::printf("prefill: %s says '%s': blocks reused\n", got[0].sender.c_str(), got[0].message.c_str());
  return 0;
}

int Decode(const std::string& remote) {
  xfer::Engine engine;
  xfer::RegionInfo found;
  if (auto s = example::OpenPool(engine, remote, &found); !s.ok()) return Fail("the peer's pool", s);
  const xfer::RegionInfo* pool = &found;

  std::vector<char> cache((kLast - kFirst + 1) * kBlock);
  std::vector<xfer::TransferDesc> descs;
  for (uint64_t b = kFirst; b <= kLast; ++b) {
    descs.push_back(
        {reinterpret_cast<uint64_t>(cache.data()) + (b - kFirst) * kBlock, pool->addr + b * kBlock, kBlock});
  }
  xfer::TransferOptions options;
  options.notify = "free " + std::to_string(kFirst) + "-" + std::to_string(kLast);
  // Completed = every block is here and the prefill side has queued "free 17-42".
  if (auto s = engine.TransferSync(remote, xfer::Op::kRead, descs, 10s, options); !s.ok()) {
    return Fail("READ", s);
  }
  for (uint64_t b = kFirst; b <= kLast; ++b) {
    if (cache[(b - kFirst) * kBlock] != char(b))
      return Fail("check", {xfer::StatusCode::kInternal, "wrong data"});
  }
  std::printf("decode: read blocks %llu-%llu and told the prefill side to free them\n",
              static_cast<unsigned long long>(kFirst), static_cast<unsigned long long>(kLast));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string role = argc > 1 ? argv[1] : "";
  if (argc == 3 && role == "prefill") return Prefill(argv[2]);
  if (argc == 3 && role == "decode") return Decode(argv[2]);
  std::fprintf(stderr, "usage: %s prefill HOST:PORT | decode HOST:PORT\n", argv[0]);
  return 2;
}
