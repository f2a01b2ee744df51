// The cma link writes into a pid only while the process it verified at connect time lives: a
// pid that now names another process (reused after the peer exited) gets nothing.
#include "transport/cma/cma_transport.h"

#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "util/net.h"

namespace xfer::transport {
namespace {

TEST(CmaLink, APidNamingAnotherProcessThanTheVerifiedOneGetsNoWrite) {
  std::string why;
  if (!CmaTransport::Available(&why)) GTEST_SKIP() << "cma unavailable here: " << why;
  // The verified peer: a child that then exits. The pid the link writes to: this process,
  // standing in for a successor that took the peer's pid.
  const pid_t child = fork();
  if (child == 0) {
    pause();
    _exit(0);
  }
  ASSERT_GT(child, 0);
  net::Fd pidfd(static_cast<int>(syscall(SYS_pidfd_open, child, 0)));
  ASSERT_TRUE(pidfd.valid());
  static uint64_t cookie = 77;  // what this process shows as the peer's incarnation
  const CmaPeer e{getpid(), cookie, reinterpret_cast<uint64_t>(&cookie), pidfd.get()};
  std::shared_ptr<Link> link;
  ASSERT_TRUE(CmaTransport::Connect(e, &link).ok());
  uint64_t src = 1, dst = 0;
  const Slice one{reinterpret_cast<uint64_t>(&src), reinterpret_cast<uint64_t>(&dst), sizeof src};
  ASSERT_TRUE(link->Execute(Op::kWrite, {&one, 1}, Clock::now() + std::chrono::seconds(1)).ok());
  EXPECT_EQ(dst, 1u) << "while the verified process lives, the link writes";

  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));  // past the link's recheck interval
  src = 2;
  const Status s = link->Execute(Op::kWrite, {&one, 1}, Clock::now() + std::chrono::seconds(1));
  EXPECT_EQ(s.code(), StatusCode::kConnectionLost) << s.ToString();
  EXPECT_EQ(dst, 1u) << "a write went to the pid after its verified process exited";
}

// A link to this process itself (cma's syscalls move memory within one process as well).
std::shared_ptr<Link> SelfLink() {
  static uint64_t cookie = 78;
  std::shared_ptr<Link> link;
  EXPECT_TRUE(
      CmaTransport::Connect(CmaPeer{getpid(), cookie, reinterpret_cast<uint64_t>(&cookie)}, &link).ok());
  return link;
}

// Slices whose remote blocks touch in pairs swapped (remote order 1,0,3,2,...), local blocks
// with a gap after each, in an order of their own: the link sorts them by remote address and
// merges the remote ranges, and every byte must still go where its slice says, no gap written.
void CheckScattered(size_t blocks, uint64_t block) {
  std::vector<uint8_t> local(blocks * block * 2), remote(blocks * block + 64, 0xEE);
  std::iota(local.begin(), local.end(), 0);
  std::vector<Slice> batch;
  for (size_t k = 0; k < blocks; ++k) {
    const size_t r = (k ^ 1) < blocks ? k ^ 1 : k;
    batch.push_back({reinterpret_cast<uint64_t>(&local[k * block * 2]),
                     reinterpret_cast<uint64_t>(&remote[r * block]), block});
  }
  auto link = SelfLink();
  ASSERT_TRUE(link);
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  ASSERT_TRUE(link->Execute(Op::kWrite, batch, deadline).ok());
  for (size_t k = 0; k < blocks; ++k) {
    const size_t r = (k ^ 1) < blocks ? k ^ 1 : k;
    ASSERT_EQ(0, std::memcmp(&remote[r * block], &local[k * block * 2], block)) << "block " << k;
  }
  EXPECT_EQ(remote[blocks * block], 0xEE) << "written past the last block";
  // READ back into the gaps' neighbours: each local block gets its remote block again, the
  // gaps stay as they were.
  std::vector<uint8_t> before = local;
  for (size_t k = 0; k < blocks; ++k) std::memset(&local[k * block * 2], 0, block);
  ASSERT_TRUE(link->Execute(Op::kRead, batch, deadline).ok());
  EXPECT_EQ(local, before);
}

TEST(CmaLink, SlicesInAnyOrderLandWhereTheySayWhenRemoteRangesAreMerged) {
  std::string why;
  if (!CmaTransport::Available(&why)) GTEST_SKIP() << "cma unavailable here: " << why;
  CheckScattered(1000, 64);  // one call, its remote ranges one iovec
  CheckScattered(1500, 64);  // more slices than one call takes (not sorted: in two calls)
  CheckScattered(7, 4096);
}

}  // namespace
}  // namespace xfer::transport
