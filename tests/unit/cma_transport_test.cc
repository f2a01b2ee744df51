// The cma link writes into a pid only while the process it verified at connect time lives: a
// pid that now names another process (reused after the peer exited) gets nothing.
#include "transport/cma/cma_transport.h"

#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <thread>

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
  PeerEndpoint e;
  e.pid = getpid();
  e.incarnation = cookie;
  e.cma_cookie = reinterpret_cast<uint64_t>(&cookie);
  e.pidfd = pidfd.get();
  CmaTransport cma;
  std::shared_ptr<Link> link;
  ASSERT_TRUE(cma.Connect(e, &link).ok());
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

}  // namespace
}  // namespace xfer::transport
