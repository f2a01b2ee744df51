#include "util/shared_memory.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <linux/memfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "util/log.h"
#include "util/process_check.h"
#include "util/text.h"

namespace xfer::shared_memory {
using text::Errno;
namespace {

int PidfdGetfd(int pidfd, int fd) { return static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, fd, 0)); }

uint64_t RoundUp(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

// What a segment is sealed against: changing its size, and the seals themselves.
constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

// One attempt at a memfd of len bytes, mapped shared and sealed (against writes through
// any other mapping or descriptor too, when peers_write is false); false with *why on failure.
bool MakeMapped(const std::string& name, uint64_t len, bool huge, bool peers_write, int* fd, void** base,
                uint64_t* mapped, std::string* why) {
  const unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING | (huge ? MFD_HUGETLB : 0u);
  int f = ::memfd_create(name.c_str(), flags);
  if (f < 0) {
    *why = Errno("memfd_create");
    return false;
  }
  // Huge pages: the length must be a multiple of the huge page size (2 MiB default).
  const uint64_t n = RoundUp(len, huge ? (2ull << 20) : static_cast<uint64_t>(::getpagesize()));
  void* p = MAP_FAILED;
  if (::ftruncate(f, static_cast<off_t>(n)) != 0) {
    *why = Errno("ftruncate");
  } else {
    // MAP_POPULATE: fault every page in now, so the kernel refuses huge pages it lacks here
    // rather than with SIGBUS on first touch, and the first transfer pays no fault.
    p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, f, 0);
    if (p == MAP_FAILED) *why = Errno("mmap");
  }
  // Sealed at its size before any peer sees it: a peer that mapped it can rely on every page
  // (a shrink would SIGBUS it). Read-only for peers: no writable mapping but ours, ever.
  const int seals = kSeals | (peers_write ? 0 : F_SEAL_FUTURE_WRITE);
  if (p != MAP_FAILED && ::fcntl(f, F_ADD_SEALS, seals) != 0) {
    *why = Errno("fcntl(F_ADD_SEALS)");
    ::munmap(p, n);
    p = MAP_FAILED;
  }
  if (p == MAP_FAILED) {
    ::close(f);
    return false;
  }
  *fd = f;
  *base = p;
  *mapped = n;
  return true;
}

}  // namespace

bool Available(std::string* why) {
  int pidfd = host::PidfdOpen(::getpid());
  if (pidfd < 0) {
    *why = Errno("pidfd_open");
    return false;
  }
  int probe = PidfdGetfd(pidfd, pidfd);
  const int err = errno;
  ::close(pidfd);
  if (probe < 0) {
    *why = std::string("pidfd_getfd: ") + std::strerror(err);
    return false;
  }
  ::close(probe);
  return true;
}

std::string SegmentName(uint64_t incarnation, uint64_t key) {
  char b[64];
  std::snprintf(b, sizeof b, "xfer.%016llx.%llu", static_cast<unsigned long long>(incarnation),
                static_cast<unsigned long long>(key));
  return b;
}

Status Segment::Create(uint64_t len, bool huge_pages, bool peers_write, const std::string& name,
                       std::unique_ptr<Segment>* out) {
  if (len == 0) return {StatusCode::kInvalidArgument, "shared memory: zero length"};
  std::unique_ptr<Segment> s(new Segment());
  std::string why;
  bool ok = false;
  if (huge_pages) {
    ok = MakeMapped(name, len, true, peers_write, &s->fd_, &s->base_, &s->len_, &why);
    if (!ok) {
      XLOG(WARN) << "shared memory: the kernel refused huge pages for " << len << " bytes (" << why
                 << "); using normal pages";
    }
  }
  if (!ok && !MakeMapped(name, len, false, peers_write, &s->fd_, &s->base_, &s->len_, &why)) {
    return {errno == ENOMEM ? StatusCode::kResourceExhausted : StatusCode::kInternal,
            std::to_string(len) + " bytes of shared memory: " + why};
  }
  *out = std::move(s);
  return Status::Ok();
}

Segment::~Segment() {
  if (base_) ::munmap(base_, len_);
  if (fd_ >= 0) ::close(fd_);
}

namespace {
std::atomic<uint64_t> peers_mapped{0};  // bytes of peers' segments mapped in this process now

// Counts len more mapped bytes, unless that would pass cap (then nothing changes).
bool Reserve(uint64_t len, uint64_t cap) {
  uint64_t now = peers_mapped.load();
  do {
    if (len > cap || now > cap - len) return false;
  } while (!peers_mapped.compare_exchange_weak(now, now + len));
  return true;
}
}  // namespace

Mapping::~Mapping() {
  ::munmap(base_, len_);
  peers_mapped.fetch_sub(len_);
}

uint64_t PeerMapper::mapped_bytes() { return peers_mapped.load(); }

uint64_t PeerMapper::max_mapped_bytes() {
  static const uint64_t cap = [] {
    struct sysinfo si {};
    if (::sysinfo(&si) != 0) return uint64_t{1} << 40;  // (a TiB: should sysinfo ever fail)
    return (static_cast<uint64_t>(si.totalram) + si.totalswap) * si.mem_unit;
  }();
  return cap;
}

Status PeerMapper::Open(int32_t pid, int pidfd, std::unique_ptr<PeerMapper>* out) {
  const int fd = pidfd >= 0 ? ::fcntl(pidfd, F_DUPFD_CLOEXEC, 0) : host::PidfdOpen(pid);
  if (fd < 0) return {StatusCode::kUnsupported, "shared memory: " + Errno(pidfd >= 0 ? "dup" : "pidfd_open")};
  out->reset(new PeerMapper(fd, pid));
  return Status::Ok();
}

PeerMapper::~PeerMapper() { ::close(pidfd_); }

Status PeerMapper::TakeFd(int32_t remote_fd, int* fd) const {
  *fd = PidfdGetfd(pidfd_, remote_fd);
  if (*fd >= 0) return Status::Ok();
  return {errno == ESRCH ? StatusCode::kConnectionLost : StatusCode::kRemoteAccessDenied,
          "descriptor " + std::to_string(remote_fd) + " of pid " + std::to_string(pid_) + ": " +
              Errno("pidfd_getfd")};
}

Status PeerMapper::Map(int32_t remote_fd, const std::string& name, uint64_t len, bool writable,
                       std::shared_ptr<Mapping>* out) const {
  return MapSegment(remote_fd, name, len, writable, false, out);
}

Status PeerMapper::MapExactly(int32_t remote_fd, const std::string& name, uint64_t len,
                              std::shared_ptr<Mapping>* out) const {
  return MapSegment(remote_fd, name, len, true, true, out);
}

Status PeerMapper::MapSegment(int32_t remote_fd, const std::string& name, uint64_t len, bool writable,
                              bool exactly, std::shared_ptr<Mapping>* out) const {
  const std::string who = "shared memory: segment " + name + " of pid " + std::to_string(pid_);
  int fd = -1;
  if (Status s = TakeFd(remote_fd, &fd); !s.ok()) return {s.code(), who + ": " + s.message()};
  char link[256] = {};
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(path.c_str(), link, sizeof link - 1);
  // "/memfd:NAME (deleted)"
  const std::string want = "/memfd:" + name + " ";
  struct stat st {};
  struct statfs fs {};
  Status s;
  if (n <= 0 || std::strncmp(link, want.c_str(), want.size()) != 0) {
    s = {StatusCode::kRemoteAccessDenied,
         who + ": descriptor " + std::to_string(remote_fd) + " is not that segment (found '" + link + "')"};
  } else if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < len) {
    s = {StatusCode::kRemoteAccessDenied, who + ": segment is smaller than the region"};
  } else if ((::fcntl(fd, F_GET_SEALS) & F_SEAL_SHRINK) == 0) {
    // Its owner could shrink it under our mapping, and a copy would then die of SIGBUS.
    s = {StatusCode::kRemoteAccessDenied, who + ": segment is not sealed against shrinking"};
  } else if (::fstatfs(fd, &fs) != 0) {
    s = {StatusCode::kInternal, who + ": " + Errno("fstatfs")};
  } else if (exactly && fs.f_type == HUGETLBFS_MAGIC) {
    s = {StatusCode::kRemoteAccessDenied, who + ": segment of huge pages"};
  }
  void* p = MAP_FAILED;
  // The region's extent in whole pages of the segment (huge pages: its own page size), never
  // the whole segment: a peer could make that terabytes long and sparse, and fill this
  // process's address space with its regions.
  const bool huge = s.ok() && fs.f_type == HUGETLBFS_MAGIC;
  const uint64_t page = huge ? static_cast<uint64_t>(fs.f_bsize) : static_cast<uint64_t>(::getpagesize());
  const uint64_t mapped = RoundUp(len, page);
  if (s.ok() && (mapped < len || !Reserve(mapped, max_mapped_bytes()))) {
    s = {StatusCode::kResourceExhausted, who + ": peers' mapped segments would pass " +
                                             std::to_string(max_mapped_bytes()) +
                                             " bytes (this host's memory and swap)"};
  } else if (s.ok()) {
    p = ::mmap(nullptr, mapped, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      // EPERM: a writable mapping of a segment its owner sealed read-only for peers.
      s = {errno == EPERM ? StatusCode::kRemoteAccessDenied : StatusCode::kResourceExhausted,
           who + ": " + Errno("mmap")};
      peers_mapped.fetch_sub(mapped);
    }
  }
  ::close(fd);
  if (!s.ok()) return s;
  *out = std::make_shared<Mapping>(static_cast<uint8_t*>(p), mapped);
  return Status::Ok();
}

}  // namespace xfer::shared_memory
