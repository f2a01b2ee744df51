#include "util/process_check.h"

#include <dirent.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "util/text.h"

namespace xfer::host {
namespace {

using text::Errno;

// One end of a connection as sock_diag's lookup takes it: the family, the address (an IPv4
// address in word 0; IPv4-mapped IPv6 addresses count as IPv4) and the port, in network order.
struct End {
  int family = 0;
  uint32_t addr[4] = {};
  uint16_t port = 0;
};

bool EndOf(const sockaddr_storage& a, End* out) {
  if (a.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(a);
    out->family = AF_INET;
    out->addr[0] = in.sin_addr.s_addr;
    out->port = in.sin_port;
    return true;
  }
  if (a.ss_family != AF_INET6) return false;
  const auto& in6 = reinterpret_cast<const sockaddr_in6&>(a);
  out->port = in6.sin6_port;
  if (IN6_IS_ADDR_V4MAPPED(&in6.sin6_addr)) {
    out->family = AF_INET;
    std::memcpy(&out->addr[0], in6.sin6_addr.s6_addr + 12, 4);
  } else {
    out->family = AF_INET6;
    std::memcpy(out->addr, in6.sin6_addr.s6_addr, 16);
  }
  return true;
}

// The same from an address as sock_diag gives it (family, 4 words, port; network order).
bool EndOf(uint8_t family, const uint32_t addr[4], uint16_t port, End* out) {
  sockaddr_storage ss{};
  if (family == AF_INET) {
    auto& in = reinterpret_cast<sockaddr_in&>(ss);
    in.sin_family = AF_INET;
    in.sin_addr.s_addr = addr[0];
    in.sin_port = port;
  } else {
    auto& in6 = reinterpret_cast<sockaddr_in6&>(ss);
    in6.sin6_family = family;
    std::memcpy(in6.sin6_addr.s6_addr, addr, 16);
    in6.sin6_port = port;
  }
  return EndOf(ss, out);
}

bool operator==(const End& a, const End& b) {
  return a.family == b.family && a.port == b.port &&
         std::memcmp(a.addr, b.addr, a.family == AF_INET ? 4 : 16) == 0;
}

// The inode of the socket whose source is src and destination dst in this network namespace
// (sock_diag: one exact lookup).
Status InodeHere(const End& src, const End& dst, uint32_t* inode, uint32_t* uid) {
  struct {
    nlmsghdr nlh;
    inet_diag_req_v2 req;
  } msg{};
  msg.nlh.nlmsg_len = sizeof msg;
  msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  msg.nlh.nlmsg_flags = NLM_F_REQUEST;  // one socket, not a dump
  msg.req.sdiag_family = static_cast<uint8_t>(src.family);
  msg.req.sdiag_protocol = IPPROTO_TCP;
  msg.req.idiag_states = ~0u;
  msg.req.id.idiag_sport = src.port;
  msg.req.id.idiag_dport = dst.port;
  std::memcpy(msg.req.id.idiag_src, src.addr, sizeof src.addr);
  std::memcpy(msg.req.id.idiag_dst, dst.addr, sizeof dst.addr);
  msg.req.id.idiag_cookie[0] = msg.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;

  net::Fd nl(::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
  if (!nl.valid()) return {StatusCode::kUnsupported, Errno("socket(NETLINK_SOCK_DIAG)")};
  const timeval limit{1, 0};  // the kernel answers at once; never wait long for it
  (void)::setsockopt(nl.get(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(nl.get(), &msg, sizeof msg, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) < 0) {
    return {StatusCode::kUnsupported, Errno("sock_diag request")};
  }
  alignas(nlmsghdr) char buf[8192];
  const ssize_t n = ::recv(nl.get(), buf, sizeof buf, 0);
  if (n < 0) return {StatusCode::kUnsupported, Errno("sock_diag answer")};
  const auto* h = reinterpret_cast<const nlmsghdr*>(buf);
  if (!NLMSG_OK(h, static_cast<unsigned>(n))) return {StatusCode::kUnsupported, "sock_diag: a short answer"};
  if (h->nlmsg_type == NLMSG_ERROR) {
    const auto* e = static_cast<const nlmsgerr*>(NLMSG_DATA(h));
    return {StatusCode::kUnsupported,
            std::string("no socket at the other end of the connection in this network namespace (") +
                std::strerror(-e->error) + ")"};
  }
  if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY || h->nlmsg_len < NLMSG_LENGTH(sizeof(inet_diag_msg))) {
    return {StatusCode::kUnsupported, "sock_diag: an unexpected answer"};
  }
  // The kernel answers a lookup that finds no connected socket with a listening one on the
  // source port, if there is one: only the very connection counts.
  // (A dual-stack socket answers with IPv4-mapped IPv6 addresses: compared as IPv4.)
  const auto* m = static_cast<const inet_diag_msg*>(NLMSG_DATA(h));
  End got_src, got_dst;
  if (m->idiag_state == TCP_LISTEN || !EndOf(m->idiag_family, m->id.idiag_src, m->id.idiag_sport, &got_src) ||
      !EndOf(m->idiag_family, m->id.idiag_dst, m->id.idiag_dport, &got_dst) || !(got_src == src) ||
      !(got_dst == dst)) {
    return {StatusCode::kUnsupported,
            "no connected socket at the other end of the connection in this network namespace"};
  }
  *uid = m->idiag_uid;
  *inode = m->idiag_inode;
  return Status::Ok();
}

// One line of /proc/PID/net/tcp or tcp6 as an End: "ADDR:PORT" in hex, the address as the
// kernel's 32-bit words print (%08X of each), the port in host order.
bool ParseEnd(const char* text, bool v6, End* out) {
  uint32_t w[4] = {};
  unsigned port = 0;
  const int words = v6 ? 4 : 1;
  for (int i = 0; i < words; ++i) {
    if (std::sscanf(text + 8 * i, "%8x", &w[i]) != 1) return false;
  }
  if (text[8 * words] != ':' || std::sscanf(text + 8 * words + 1, "%4x", &port) != 1) return false;
  sockaddr_storage ss{};
  if (v6) {
    auto& in6 = reinterpret_cast<sockaddr_in6&>(ss);
    in6.sin6_family = AF_INET6;
    std::memcpy(in6.sin6_addr.s6_addr, w, 16);
    in6.sin6_port = htons(static_cast<uint16_t>(port));
  } else {
    auto& in = reinterpret_cast<sockaddr_in&>(ss);
    in.sin_family = AF_INET;
    in.sin_addr.s_addr = w[0];
    in.sin_port = htons(static_cast<uint16_t>(port));
  }
  return EndOf(ss, out);
}

// The same, from pid's view of its network namespace (/proc/PID/net/tcp and tcp6): for a peer
// in another namespace of this host, joined without address translation (a veth pair).
Status InodeInNamespaceOf(int32_t pid, const End& src, const End& dst, uint32_t* inode, uint32_t* uid) {
  for (const char* table : {"tcp", "tcp6"}) {
    const std::string path = "/proc/" + std::to_string(pid) + "/net/" + table;
    std::FILE* f = std::fopen(path.c_str(), "re");
    if (f == nullptr) continue;
    char line[512];
    bool found = false;
    while (!found && std::fgets(line, sizeof line, f) != nullptr) {
      char local[64], remote[64];
      unsigned long ino = 0, owner = 0;
      End l, r;
      // "sl: local remote st tx:rx tr:when retrnsmt uid timeout inode ..."
      if (std::sscanf(line, " %*s %63s %63s %*s %*s %*s %*s %lu %*s %lu", local, remote, &owner, &ino) == 4 &&
          ParseEnd(local, table[3] == '6', &l) && ParseEnd(remote, table[3] == '6', &r) && l == src &&
          r == dst && ino != 0) {
        *inode = static_cast<uint32_t>(ino);
        *uid = static_cast<uint32_t>(owner);
        found = true;
      }
    }
    std::fclose(f);
    if (found) return Status::Ok();
  }
  return {StatusCode::kRemoteAccessDenied, "no socket at the other end of the connection in pid " +
                                               std::to_string(pid) + "'s network namespace"};
}

// The inode and owner of the socket at the other end of our connected TCP socket fd: its
// source is our peer's address, its destination ours; in this network namespace, else in pid's.
Status OtherEndInode(int fd, int32_t pid, uint32_t* inode, uint32_t* uid) {
  sockaddr_storage ours{}, theirs{};
  socklen_t ol = sizeof ours, tl = sizeof theirs;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ours), &ol) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&theirs), &tl) != 0) {
    return {StatusCode::kInternal, Errno("getsockname/getpeername")};
  }
  End src, dst;
  if (!EndOf(theirs, &src) || !EndOf(ours, &dst) || src.family != dst.family) {
    return {StatusCode::kUnsupported, "the control connection is not TCP over IPv4 or IPv6"};
  }
  if (InodeHere(src, dst, inode, uid).ok()) return Status::Ok();
  return InodeInNamespaceOf(pid, src, dst, inode, uid);
}

// Whether process pid has the socket of that inode among its descriptors, and runs as the
// user who made the socket (not, say, a set-user-ID program that inherited it).
Status Holds(int32_t pid, uint32_t inode, uint32_t uid) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  struct stat st {};
  if (::stat(("/proc/" + std::to_string(pid)).c_str(), &st) != 0) {
    return {StatusCode::kUnsupported, Errno(("stat /proc/" + std::to_string(pid)).c_str())};
  }
  if (st.st_uid != uid) {
    return {StatusCode::kRemoteAccessDenied,
            "pid " + std::to_string(pid) + " runs as user " + std::to_string(st.st_uid) +
                ", the connection's socket is user " + std::to_string(uid) + "'s"};
  }
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return {StatusCode::kUnsupported, Errno(("opendir " + dir).c_str())};
  const std::string want = "socket:[" + std::to_string(inode) + "]";
  bool found = false;
  char link[64];
  for (dirent* e; !found && (e = ::readdir(d)) != nullptr;) {
    if (e->d_name[0] == '.') continue;
    const ssize_t len = ::readlinkat(::dirfd(d), e->d_name, link, sizeof link);
    found = len == static_cast<ssize_t>(want.size()) && std::memcmp(link, want.data(), want.size()) == 0;
  }
  ::closedir(d);
  if (found) return Status::Ok();
  return {StatusCode::kRemoteAccessDenied, "pid " + std::to_string(pid) + " does not hold the connection"};
}

}  // namespace

int PidfdOpen(int32_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

bool Exited(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) != 0;  // readable (or an error): the process is gone
}

Status VerifyConnectionOwner(int fd, int32_t pid, net::Fd* pidfd) {
  if (pid <= 0) return {StatusCode::kRemoteAccessDenied, "pid " + std::to_string(pid) + " is no process"};
  net::Fd p(PidfdOpen(pid));
  if (!p.valid())
    return {StatusCode::kUnsupported, "pid " + std::to_string(pid) + ": " + Errno("pidfd_open")};
  uint32_t inode = 0, uid = 0;
  Status s = OtherEndInode(fd, pid, &inode, &uid);
  if (s.ok()) s = Holds(pid, inode, uid);
  // Alive after the look: the pid named that process throughout, not a successor.
  if (s.ok() && Exited(p.get())) s = {StatusCode::kConnectionLost, "pid " + std::to_string(pid) + " exited"};
  if (s.ok()) *pidfd = std::move(p);
  return s;
}

}  // namespace xfer::host
