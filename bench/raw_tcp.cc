// raw_tcp: a raw TCP socket pair on loopback, the floor any TCP transport is judged against.
// Two processes (fork): the parent sends blocks, the child receives them (recv MSG_WAITALL into
// its own buffers); one connection, TCP_NODELAY, default socket buffers. Same block sizes and
// buffer pattern (--reuse, or walking a span larger than the caches) as xfer-bench.
//
//   raw_tcp [-s 16K:8M] [-D 1] [--reuse] [--span 256M] [--print-sizes]
//
// Per size: a short probe sets the block count for about --duration; the sender sends a header
// (block size, count), then the blocks; the receiver answers one byte when it has them all. The
// time runs from the first send to that answer.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.h"

namespace {

using namespace xfer::bench;

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "raw_tcp: %s: %s\n", what, std::strerror(errno));
  std::exit(1);
}

bool SendAll(int fd, const uint8_t* p, uint64_t n) {
  while (n) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= uint64_t(k);
  }
  return true;
}

bool RecvAll(int fd, uint8_t* p, uint64_t n) {
  while (n) {
    ssize_t k = recv(fd, p, n, MSG_WAITALL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= uint64_t(k);
  }
  return true;
}

void Receiver(int fd, uint64_t span_len, bool reuse) {
  Span span;
  if (!span.Allocate(span_len)) _exit(1);
  for (;;) {
    uint64_t hdr[2];
    if (!RecvAll(fd, reinterpret_cast<uint8_t*>(hdr), sizeof hdr)) _exit(0);
    const uint64_t block = hdr[0], count = hdr[1];
    const uint64_t slots = std::max<uint64_t>(1, span.size() / block);
    for (uint64_t i = 0; i < count; ++i) {
      uint8_t* dst = span.data() + (reuse ? 0 : (i % slots) * block);
      if (!RecvAll(fd, dst, block)) _exit(1);
    }
    uint8_t ack = 1;
    if (!SendAll(fd, &ack, 1)) _exit(1);
  }
}

// Sends `count` blocks; returns seconds from the first send to the receiver's answer.
double Round(int fd, const Span& span, uint64_t block, uint64_t count, bool reuse) {
  const uint64_t slots = std::max<uint64_t>(1, span.size() / block);
  uint64_t hdr[2] = {block, count};
  uint64_t t0 = NowNs();
  if (!SendAll(fd, reinterpret_cast<uint8_t*>(hdr), sizeof hdr)) Die("send");
  for (uint64_t i = 0; i < count; ++i)
    if (!SendAll(fd, span.data() + (reuse ? 0 : (i % slots) * block), block)) Die("send");
  uint8_t ack;
  if (!RecvAll(fd, &ack, 1)) Die("recv");
  return double(NowNs() - t0) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  std::string size_arg = "16K:8M";
  double duration = 1.0;
  bool reuse = false, print_sizes = false;
  uint64_t span_len = kDefaultSpan;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "raw_tcp: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "-s" || a == "--size")
      size_arg = val();
    else if (a == "-D" || a == "--duration")
      duration = std::atof(val().c_str());
    else if (a == "--reuse")
      reuse = true;
    else if (a == "--span") {
      if (!ParseSize(val(), &span_len)) {
        std::fprintf(stderr, "raw_tcp: bad --span\n");
        return 2;
      }
    } else if (a == "--print-sizes")
      print_sizes = true;
    else {
      std::fprintf(stderr, "usage: raw_tcp [-s SIZES] [-D SEC] [--reuse] [--span BYTES] [--print-sizes]\n");
      return 2;
    }
  }
  std::vector<uint64_t> sizes;
  std::string err;
  if (!ParseSizeList(size_arg, &sizes, &err)) {
    std::fprintf(stderr, "raw_tcp: --size: %s\n", err.c_str());
    return 2;
  }
  if (duration <= 0) {
    std::fprintf(stderr, "raw_tcp: --duration must be > 0\n");
    return 2;
  }
  if (print_sizes) {
    for (uint64_t b : sizes) std::printf("%llu\n", (unsigned long long)b);
    return 0;
  }
  uint64_t maxb = 0;
  for (uint64_t b : sizes) maxb = std::max(maxb, b);
  span_len = reuse ? maxb : std::max(span_len, maxb);

  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  if (lfd < 0) Die("socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(lfd, (sockaddr*)&a, sizeof a) != 0 || listen(lfd, 1) != 0) Die("bind/listen");
  socklen_t al = sizeof a;
  getsockname(lfd, (sockaddr*)&a, &al);
  pid_t pid = fork();
  if (pid < 0) Die("fork");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fd = accept(lfd, nullptr, nullptr);
    if (fd < 0) _exit(1);
    close(lfd);
    Receiver(fd, span_len, reuse);
    _exit(0);
  }
  close(lfd);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, (sockaddr*)&a, sizeof a) != 0) Die("connect");
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  Span span;
  if (!span.Allocate(span_len)) Die("mmap");

  std::printf(
      "# raw_tcp: one TCP connection on loopback, a sender and a receiver process (recv "
      "MSG_WAITALL per block); %s; %g s per size; GB/s = 1e9 B/s\n",
      reuse ? "--reuse: the same buffer every block"
            : ("walking a " + FormatSize(span_len) + " span per side").c_str(),
      duration);
  std::printf("# command: %s\n", JoinArgv(argc, argv).c_str());
  std::printf("%-10s %10s %14s\n", "#bytes", "#blocks", "tcp[GB/s]");
  for (uint64_t b : sizes) {
    // Probe: about 32 MiB or 16 blocks, which also warms up.
    uint64_t n0 = std::max<uint64_t>(16, (32ull << 20) / b);
    double t = Round(fd, span, b, n0, reuse);
    double rate = double(n0) / std::max(t, 1e-6);
    uint64_t n = std::max<uint64_t>(16, uint64_t(rate * duration));
    t = Round(fd, span, b, n, reuse);
    std::printf("%-10llu %10llu %14.2f\n", (unsigned long long)b, (unsigned long long)n,
                double(n * b) / t / 1e9);
    std::fflush(stdout);
  }
  close(fd);
  int st;
  waitpid(pid, &st, 0);
  return 0;
}
