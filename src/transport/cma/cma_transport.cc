#include "transport/cma/cma_transport.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <vector>

#include "util/log.h"
#include "util/net.h"
#include "util/process_check.h"
#include "util/text.h"

namespace xfer::transport {
namespace {

constexpr size_t kIovMax = IOV_MAX;  // 1024 on Linux: the kernel's limit per call

bool ByRemote(const Slice& a, const Slice& b) { return a.remote < b.remote; }

Status ErrnoStatus(int err, int32_t pid, Op op) {
  std::string what = std::string("process_vm_") + (op == Op::kWrite ? "writev" : "readv") + " to pid " +
                     std::to_string(pid) + ": " + std::strerror(err);
  switch (err) {
    case ESRCH:
      return {StatusCode::kConnectionLost, what + " (the peer process is gone)"};
    case EPERM:
      return {StatusCode::kRemoteAccessDenied, what + " (ptrace not permitted)"};
    case EFAULT:
      return {StatusCode::kRemoteAccessDenied,
              what + " (an address is not mapped on one side; was the memory freed?)"};
    case ENOMEM:
      return {StatusCode::kResourceExhausted, what};
    default:
      return {StatusCode::kInternal, what};
  }
}

class CmaLink final : public Link {
 public:
  // process: a pidfd of the peer (or invalid): the link stops using pid once it exited.
  CmaLink(int32_t pid, net::Fd process) : pid_(pid), process_(std::move(process)) {}

  Status Execute(Op op, std::span<const Slice> batch, Clock::time_point) override {
    if (!Alive()) {
      return {StatusCode::kConnectionLost,
              "cma: peer process " + std::to_string(pid_) + " exited (its pid is not used again)"};
    }
    // The kernel pins the remote pages of each remote iovec on its own, which is most of what
    // a small block costs: in remote-address order, remote ranges that touch go as one remote
    // iovec, whatever their local sides.
    // (Stable: slices with one remote start keep their order.)
    thread_local std::vector<Slice> sorted;
    if (batch.size() > 1 && batch.size() <= kIovMax &&
        !std::is_sorted(batch.begin(), batch.end(), ByRemote)) {
      sorted.assign(batch.begin(), batch.end());
      std::stable_sort(sorted.begin(), sorted.end(), ByRemote);
      batch = sorted;
    }
    // The kernel may move fewer bytes than asked (it stops at the first fault or signal):
    // resume from the first byte not moved, rebuilding the iovecs from there.
    iovec local[kIovMax];
    iovec remote[kIovMax];
    size_t first = 0;
    uint64_t skip = 0;  // bytes of batch[first] already moved
    while (first < batch.size()) {
      size_t nl = 0, nr = 0;
      uint64_t want = 0;
      for (size_t i = first; i < batch.size() && nl < kIovMax; ++i) {
        const uint64_t off = i == first ? skip : 0, len = batch[i].len - off;
        auto* at = reinterpret_cast<uint8_t*>(batch[i].remote + off);
        if (nr > 0 && static_cast<uint8_t*>(remote[nr - 1].iov_base) + remote[nr - 1].iov_len == at) {
          remote[nr - 1].iov_len += len;
        } else if (nr < kIovMax) {
          remote[nr++] = {at, len};
        } else {
          break;
        }
        local[nl++] = {reinterpret_cast<void*>(batch[i].local + off), len};
        want += len;
      }
      ssize_t got = op == Op::kWrite ? ::process_vm_writev(pid_, local, nl, remote, nr, 0)
                                     : ::process_vm_readv(pid_, local, nl, remote, nr, 0);
      if (got < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus(errno, pid_, op);
      }
      if (got == 0 && want > 0) return ErrnoStatus(EFAULT, pid_, op);
      uint64_t moved = static_cast<uint64_t>(got);
      while (first < batch.size() && moved >= batch[first].len - skip) {
        moved -= batch[first].len - skip;
        skip = 0;
        ++first;
      }
      skip += moved;
    }
    return Status::Ok();
  }

 private:
  // Whether the peer process lives, as its pidfd said at most kRecheck ago: a pid is reused
  // only after its process was reaped and the kernel went through every other pid, so a
  // check this recent keeps writes from going to a successor, at no cost per small batch.
  bool Alive() {
    if (!process_.valid()) return true;
    if (dead_.load(std::memory_order_relaxed)) return false;
    const int64_t now = Clock::now().time_since_epoch().count();
    if (now - checked_.load(std::memory_order_relaxed) < kRecheck.count()) return true;
    if (host::Exited(process_.get())) {
      dead_.store(true);
      return false;
    }
    checked_.store(now, std::memory_order_relaxed);
    return true;
  }
  static constexpr std::chrono::nanoseconds kRecheck = std::chrono::milliseconds(1);

  const int32_t pid_;
  const net::Fd process_;
  std::atomic<int64_t> checked_{0};  // Clock ticks of the last check that found it alive
  std::atomic<bool> dead_{false};
};

}  // namespace

bool CmaTransport::Available(std::string* why) {
  uint64_t src = 0x5846455243ull, dst = 0;
  iovec l{&dst, sizeof dst}, r{&src, sizeof src};
  if (::process_vm_readv(::getpid(), &l, 1, &r, 1, 0) != sizeof dst || dst != src) {
    *why = std::string("process_vm_readv on this process failed: ") + std::strerror(errno) +
           (errno == ENOSYS || errno == EPERM ? " (blocked by the kernel or a seccomp filter)" : "");
    return false;
  }
  return true;
}

size_t CmaTransport::max_slices_per_batch() { return kIovMax; }

Status CmaTransport::Connect(const CmaPeer& peer, std::shared_ptr<Link>* link) {
  if (peer.cookie == 0 || peer.pid <= 0) {
    return {StatusCode::kUnsupported, "cma: the peer does not offer cma"};
  }
  uint64_t cookie = 0;
  iovec l{&cookie, sizeof cookie};
  iovec r{reinterpret_cast<void*>(peer.cookie), sizeof cookie};
  ssize_t got = ::process_vm_readv(peer.pid, &l, 1, &r, 1, 0);
  if (got != sizeof cookie) {
    int err = errno;
    std::string why = "cma: cannot read pid " + std::to_string(peer.pid) + ": " + std::strerror(err);
    if (err == EPERM) {
      why += " (ptrace not permitted: see kernel.yama.ptrace_scope, or run both as one user)";
    } else if (err == ESRCH) {
      why += " (no such process here: another pid namespace?)";
    }
    XLOG(WARN) << why << "; cma is not used for this peer";
    return {StatusCode::kUnsupported, why};
  }
  if (cookie != peer.incarnation) {
    return {StatusCode::kUnsupported,
            "cma: pid " + std::to_string(peer.pid) + " is not the peer (another pid namespace?)"};
  }
  net::Fd process(peer.pidfd >= 0 ? ::fcntl(peer.pidfd, F_DUPFD_CLOEXEC, 0) : -1);
  if (peer.pidfd >= 0 && !process.valid()) {  // without it the link could not tell the pid's end
    return {StatusCode::kResourceExhausted, "cma: " + text::Errno("dup of the peer's pidfd")};
  }
  *link = std::make_shared<CmaLink>(peer.pid, std::move(process));
  return Status::Ok();
}

}  // namespace xfer::transport
