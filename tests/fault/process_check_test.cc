// host::VerifyConnectionOwner against a connection from another network namespace whose
// source port is a port that a process of this namespace listens on: for a connection it does
// not find here, the kernel's socket lookup answers with that listener. The claim to be the
// listener's process must not hold. Needs root (a network namespace); skips otherwise. Nothing
// leaves the namespace pair this test creates (and removes). The test's process moves into a
// namespace of its own first, so that the host's namespace never holds its veth: UCX in a test
// running beside it would see the interface and could pick it, and lose it when it goes.
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "test_common.h"
#include "util/net.h"
#include "util/process_check.h"

namespace xfer_test {
namespace {

using namespace std::chrono_literals;
namespace net = xfer::net;

bool Sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; }

TEST(FaultProcessCheck, AListenerOnTheSourcePortIsNotTheConnection) {
  if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  struct OwnNamespace {  // this thread's, until the test ends
    net::Fd host{open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC)};
    bool entered = host.valid() && unshare(CLONE_NEWNET) == 0;
    ~OwnNamespace() {  // (the tests after this one in the process need the host's loopback)
      if (entered && setns(host.get(), CLONE_NEWNET) != 0) {
        std::fprintf(stderr, "cannot return to the host's network namespace: %s\n", std::strerror(errno));
        std::abort();
      }
    }
  } own;
  if (!own.entered) GTEST_SKIP() << "cannot make a network namespace: " << std::strerror(errno);
  const std::string id = std::to_string(getpid()), ns = "xfer-pc-" + id, here = "xpa" + id,
                    there = "xpb" + id;
  const std::string net = "10.232." + std::to_string(getpid() % 250) + ".", ip_here = net + "1",
                    ip_there = net + "2";
  const std::string setup[] = {
      "ip netns add " + ns,
      "ip link add " + here + " type veth peer name " + there,
      "ip link set " + there + " netns " + ns,
      "ip addr add " + ip_here + "/30 dev " + here,
      "ip -n " + ns + " addr add " + ip_there + "/30 dev " + there,
      "ip link set " + here + " up",
      "ip -n " + ns + " link set " + there + " up",
  };
  struct Cleanup {
    std::string ns, here;
    ~Cleanup() {
      Sh("ip link del " + here);
      Sh("ip netns del " + ns);
    }
  } cleanup{ns, here};
  for (const auto& c : setup) {
    if (!Sh(c)) GTEST_SKIP() << "cannot build the namespace pair ('" << c << "' failed)";
  }
  // This process: a listener on every address (its port is the connection's source port) and
  // the listener the connection arrives at.
  net::Fd wildcard, arrival;
  net::Address w, a;
  ASSERT_TRUE(net::Listen(net::Address{"0.0.0.0", 0, true}, &wildcard, &w).ok());
  ASSERT_TRUE(net::Listen(net::Address{ip_here, 0, true}, &arrival, &a).ok());
  const pid_t child = fork();
  if (child == 0) {  // in the other namespace: from <ip_there>:<w.port> to <ip_here>:<a.port>
    const int nsfd = open(("/var/run/netns/" + ns).c_str(), O_RDONLY);
    if (nsfd < 0 || setns(nsfd, CLONE_NEWNET) != 0) _exit(1);
    const int s = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in from{}, to{};
    from.sin_family = to.sin_family = AF_INET;
    from.sin_port = htons(w.port);
    to.sin_port = htons(a.port);
    inet_pton(AF_INET, ip_there.c_str(), &from.sin_addr);
    inet_pton(AF_INET, ip_here.c_str(), &to.sin_addr);
    if (bind(s, reinterpret_cast<sockaddr*>(&from), sizeof from) != 0 ||
        connect(s, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
      _exit(2);
    }
    pause();
    _exit(0);
  }
  ASSERT_GT(child, 0);
  pollfd p{arrival.get(), POLLIN, 0};
  const bool came = poll(&p, 1, 10000) == 1;
  net::Fd conn(came ? accept4(arrival.get(), nullptr, nullptr, SOCK_CLOEXEC) : -1);
  net::Fd pidfd;
  const xfer::Status ours =
      conn.valid() ? xfer::host::VerifyConnectionOwner(conn.get(), getpid(), &pidfd) : xfer::Status::Ok();
  const xfer::Status theirs =
      conn.valid() ? xfer::host::VerifyConnectionOwner(conn.get(), child, &pidfd) : xfer::Status::Ok();
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(conn.valid()) << "the connection from the other namespace never came (child status " << status
                            << ")";
  EXPECT_FALSE(ours.ok()) << "this process was taken for the other end because it listens on the source port";
  // The child, in a namespace of this host without address translation, is found there.
  EXPECT_TRUE(theirs.ok()) << theirs.ToString();
}

}  // namespace
}  // namespace xfer_test
