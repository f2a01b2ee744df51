// One measured row, its JSON form, and the bytes of a test's rows by path.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "config.h"

namespace xfer::bench {

struct Row {
  std::string test;
  std::string dir;        // "" (one direction), "->" (this side to the peer), "<-", "sum"
  std::string transport;  // as GetPeerInfo reported it
  std::string direction = "H2H";
  std::string path = "direct";
  uint64_t bytes = 0;
  uint64_t requests = 0;
  uint64_t descs = 0;
  double seconds = 0;
  double bw_avg = 0;    // GB/s
  double bw_peak = 0;   // GB/s
  double msg_rate = 0;  // Mops (descriptors)
  LatStats lat;         // per request, us
  double cpu = -1;      // % of one CPU, this process
  double srv_cpu = -1;  // % of one CPU, the target process, where known
  std::string verify;   // "", "ok", "FAILED: ..."
  // Bytes the engine moved to or from the peer in the timed window, by path (GetPeerInfo's
  // shm_bytes, transport_bytes, cuda_bytes and staged_bytes); -1 when unknown.
  int64_t shm_bytes = -1;
  int64_t transport_bytes = -1;
  int64_t cuda_bytes = -1;
  int64_t staged_bytes = -1;
  std::string staged_via;  // the routes that carried the staged bytes ("ucx"; GetPeerInfo's staged_via)
  // tcp over several NICs: the transport's bytes in the timed window by pair of NICs
  // (GetPeerInfo's nic_pairs); empty over one.
  std::vector<std::pair<std::string, int64_t>> nic_bytes;
};

json OptNum(double v);
json RowToJson(const Row& r);
Row RowFromJson(const json& j);
// "eth1 (..) -> .. 52% (N bytes), ...": a test's rows' bytes by pair of NICs; "" when none.
std::string NicText(const std::vector<Row>& rows, const std::string& test, const std::string& dir);
// The sum of the two directions of a bidirectional size.
Row SumRows(const Row& a, const Row& b);

// Bytes moved in the timed windows of a test's rows, by path.
struct PathTotals {
  int64_t shm = 0, link = 0, cuda = 0, staged = 0, moved = 0;
  bool known = true;
  std::string transport;
  std::string staged_via;  // the routes after the pool, as the rows name them
  int64_t total() const { return shm + link + cuda + staged; }
};

// "shm 0% (0 bytes), cma 100% (65536 bytes), cuda 0% (0 bytes), staged 0% (0 bytes)": the
// transport's own share names the transport; staged = through the buffer pool, then the
// route it names ("staged 100% (65536 bytes via ucx)").
std::string PathText(const PathTotals& p);
// The rows of one test and direction ("", "->", "<-"), summed.
PathTotals SumPaths(const std::vector<Row>& rows, const std::string& test, const std::string& dir,
                    uint64_t batch);

}  // namespace xfer::bench
