// host::VerifyConnectionOwner: a claim to be process P at the other end of a TCP connection
// holds only when P holds that end, over IPv4, IPv6 and IPv4-mapped addresses.
#include "util/process_check.h"

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

namespace xfer::host {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A connected pair on host: *ours is the connecting end, *theirs the accepted one.
void Pair(const std::string& listen_host, const std::string& connect_host, net::Fd* ours, net::Fd* theirs) {
  net::Fd listener;
  net::Address bound;
  ASSERT_TRUE(net::Listen(net::Address{listen_host, 0, true}, &listener, &bound).ok());
  ASSERT_TRUE(net::ConnectTcp(net::Address{connect_host, bound.port, true}, Clock::now() + 5s, ours).ok());
  const int fd = ::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC);
  ASSERT_GE(fd, 0);
  *theirs = net::Fd(fd);
}

TEST(VerifyConnectionOwner, HoldsForTheProcessAtTheOtherEndOnly) {
  for (const auto& [listen, connect] : std::vector<std::pair<std::string, std::string>>{
           {"127.0.0.1", "127.0.0.1"}, {"::1", "::1"}, {"::", "127.0.0.1"}}) {
    SCOPED_TRACE(listen + " <- " + connect);
    net::Fd a, b, pidfd;
    Pair(listen, connect, &a, &b);
    if (HasFatalFailure()) return;
    // Both ends are in this process: each end's other end is ours.
    EXPECT_TRUE(VerifyConnectionOwner(a.get(), getpid(), &pidfd).ok());
    EXPECT_TRUE(pidfd.valid());
    EXPECT_TRUE(VerifyConnectionOwner(b.get(), getpid(), &pidfd).ok());
    // Another live process does not hold it.
    const Status s = VerifyConnectionOwner(a.get(), getppid(), &pidfd);
    EXPECT_EQ(s.code(), StatusCode::kRemoteAccessDenied) << s.ToString();
  }
}

TEST(VerifyConnectionOwner, AChildThatHoldsTheOtherEndIsThatProcess) {
  net::Fd a, b, pidfd;
  Pair("127.0.0.1", "127.0.0.1", &a, &b);
  ASSERT_FALSE(HasFatalFailure());
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  if (child == 0) {  // keeps b; the parent lets go of it
    char c = 1;
    (void)write(ready[1], &c, 1);
    pause();
    _exit(0);
  }
  ASSERT_GT(child, 0);
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  b.Reset();
  EXPECT_TRUE(VerifyConnectionOwner(a.get(), child, &pidfd).ok());
  EXPECT_EQ(VerifyConnectionOwner(a.get(), getpid(), &pidfd).code(), StatusCode::kRemoteAccessDenied);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_FALSE(VerifyConnectionOwner(a.get(), child, &pidfd).ok());  // gone
  EXPECT_FALSE(VerifyConnectionOwner(a.get(), 0, &pidfd).ok());
  close(ready[0]);
  close(ready[1]);
}

}  // namespace
}  // namespace xfer::host
