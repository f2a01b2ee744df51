// A runnable example: a "decode" process exposes a KV-cache pool; a "prefill" process writes
// blocks into it with one batched request and reads them back. Copy from here.
//
//   terminal 1:  xfer-example-kv serve 127.0.0.1:5555
//   terminal 2:  xfer-example-kv push  127.0.0.1:5555
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "xfer/engine.h"

using namespace std::chrono_literals;

namespace {

constexpr uint64_t kBlock = 64 * 1024;
constexpr uint64_t kBlocks = 256;

int Fail(const char* what, const xfer::Status& s) {
  std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
  return 1;
}

int Serve(const std::string& name) {
  xfer::Engine engine;
  if (auto s = engine.Initialize(name); !s.ok()) return Fail("Initialize", s);
  // The pool comes from the engine: peers on this host then copy into it directly (shm).
  void* pool = nullptr;
  xfer::MemHandle h;
  if (auto s = engine.AllocMem(kBlock * kBlocks, xfer::MemType::kHost, &pool, &h, "kv-pool"); !s.ok()) {
    return Fail("AllocMem", s);
  }
  std::printf("serving %llu KiB at %s; the peer writes, this process does nothing. Ctrl-C ends.\n",
              static_cast<unsigned long long>((kBlock * kBlocks) >> 10), engine.LocalName().c_str());
  for (;;) std::this_thread::sleep_for(1s);
}

int Push(const std::string& remote) {
  xfer::Engine engine;
  if (auto s = engine.Initialize("127.0.0.1"); !s.ok()) return Fail("Initialize", s);  // client only
  if (auto s = engine.Connect(remote, 5s); !s.ok()) return Fail("Connect", s);

  // Find the peer's pool by its tag: no side channel needed for addresses.
  std::vector<xfer::RegionInfo> regions;
  if (auto s = engine.GetRemoteRegions(remote, &regions); !s.ok()) return Fail("GetRemoteRegions", s);
  const xfer::RegionInfo* pool = nullptr;
  for (const auto& r : regions)
    if (r.tag == "kv-pool") pool = &r;
  if (pool == nullptr) return Fail("lookup", {xfer::StatusCode::kInvalidArgument, "no kv-pool region"});

  std::vector<char> blocks(kBlock * kBlocks);
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<char>(i * 131 + 7);
  xfer::MemHandle h;
  (void)engine.RegisterMem(blocks.data(), blocks.size(), xfer::MemType::kHost, &h);

  // Write the blocks in reverse order: 256 descriptors, one request.
  std::vector<xfer::TransferDesc> descs;
  for (uint64_t i = 0; i < kBlocks; ++i) {
    descs.push_back({reinterpret_cast<uint64_t>(blocks.data() + i * kBlock),
                     pool->addr + (kBlocks - 1 - i) * kBlock, kBlock});
  }
  auto t0 = std::chrono::steady_clock::now();
  if (auto s = engine.TransferSync(remote, xfer::Op::kWrite, descs, 5s); !s.ok()) return Fail("WRITE", s);
  double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();

  // Read them back asynchronously and compare.
  std::vector<char> back(blocks.size());
  for (uint64_t i = 0; i < kBlocks; ++i)
    descs[i].local_addr = reinterpret_cast<uint64_t>(back.data() + i * kBlock);
  xfer::RequestHandle req;
  if (auto s = engine.TransferAsync(remote, xfer::Op::kRead, descs, 5s, &req); !s.ok())
    return Fail("READ", s);
  if (auto s = engine.Wait(req, 5s); !s.ok()) return Fail("Wait", s);

  xfer::PeerInfo info;
  (void)engine.GetPeerInfo(remote, &info);
  bool same = std::memcmp(blocks.data(), back.data(), blocks.size()) == 0;
  std::printf("wrote %llu blocks of %llu KiB over %s in %.0f us (%.2f GB/s); read back: %s\n",
              static_cast<unsigned long long>(kBlocks), static_cast<unsigned long long>(kBlock >> 10),
              info.BytesVia("shm") ? "shm" : info.transport.c_str(), us, blocks.size() / us / 1e3,
              same ? "identical" : "DIFFERENT");
  return same ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "serve") return Serve(argv[2]);
  if (argc == 3 && std::string(argv[1]) == "push") return Push(argv[2]);
  std::fprintf(stderr, "usage: %s serve HOST:PORT | push HOST:PORT\n", argv[0]);
  return 2;
}
