// request_cost: what a request costs from C++, the baseline bench/python_cost.py holds the
// Python package against (the same requests, to the same peer, in the same run).
//   sync8   a sync 8-byte WRITE, one descriptor: mean us per call over N calls
//   descs   a sync WRITE of D descriptors of B bytes built from three arrays (local, remote,
//           length) into the engine's descriptor vector: mean us per request over M requests
// The local buffer is registered, as the Python side's is. Prints one JSON line:
// {"sync8_us": ..., "descs_us": ...}.
//
//   request_cost PEER REMOTE_ADDR [N=200000] [M=300] [D=10000] [B=64]
// PEER is an engine whose region at REMOTE_ADDR holds at least D*B bytes (python_cost.py
// starts one and passes its address).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "xfer/engine.h"

using namespace std::chrono;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: request_cost PEER REMOTE_ADDR [N] [M] [D] [B]\n");
    return 2;
  }
  const std::string peer = argv[1];
  const uint64_t remote = std::strtoull(argv[2], nullptr, 0);
  const int n = argc > 3 ? std::atoi(argv[3]) : 200000;
  const int m = argc > 4 ? std::atoi(argv[4]) : 300;
  const uint64_t d = argc > 5 ? std::strtoull(argv[5], nullptr, 0) : 10000;
  const uint64_t b = argc > 6 ? std::strtoull(argv[6], nullptr, 0) : 64;
  xfer::Engine e;
  xfer::Status s = e.Initialize("127.0.0.1");
  if (s.ok()) s = e.Connect(peer, seconds(10));
  std::vector<uint8_t> src(d * b, 1);
  xfer::MemHandle h = 0;  // registered: unregistered memory is checked against the process's maps
  if (s.ok()) s = e.RegisterMem(src.data(), src.size(), xfer::MemType::kHost, &h);
  const std::vector<xfer::TransferDesc> one{{reinterpret_cast<uint64_t>(src.data()), remote, 8}};
  for (int i = 0; s.ok() && i < n / 10; ++i) s = e.TransferSync(peer, xfer::Op::kWrite, one, seconds(10));
  const auto t0 = steady_clock::now();
  for (int i = 0; s.ok() && i < n; ++i) s = e.TransferSync(peer, xfer::Op::kWrite, one, seconds(10));
  const double sync8 = duration<double, std::micro>(steady_clock::now() - t0).count() / n;

  std::vector<uint64_t> local(d), remotes(d), lengths(d, b);
  for (uint64_t k = 0; k < d; ++k) {
    local[k] = reinterpret_cast<uint64_t>(src.data()) + k * b;
    remotes[k] = remote + k * b;
  }
  double total = 0;
  for (int i = 0; s.ok() && i < m + m / 10; ++i) {
    const auto r0 = steady_clock::now();
    std::vector<xfer::TransferDesc> descs(d);
    for (uint64_t k = 0; k < d; ++k) descs[k] = {local[k], remotes[k], lengths[k]};
    s = e.TransferSync(peer, xfer::Op::kWrite, descs, seconds(10));
    if (i >= m / 10) total += duration<double, std::micro>(steady_clock::now() - r0).count();
  }
  if (!s.ok()) {
    std::fprintf(stderr, "request_cost: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("{\"sync8_us\": %.4f, \"descs_us\": %.3f}\n", sync8, total / m);
  return 0;
}
