// shm segments: sealed at their size, so that a peer that maps one can rely on every page; and
// a peer's segment that is not sealed is not mapped (its owner could shrink it under the
// mapping, and the next copy would die of SIGBUS).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "util/shared_memory.h"

namespace xfer::shared_memory {
namespace {

TEST(ShmSegment, IsSealedAgainstResizing) {
  std::string why;
  if (!Available(&why)) GTEST_SKIP() << "shm unavailable here: " << why;
  std::unique_ptr<Segment> seg;
  ASSERT_TRUE(Segment::Create(1 << 16, false, true, SegmentName(1, 1), &seg).ok());
  const int seals = fcntl(seg->fd(), F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  EXPECT_NE(ftruncate(seg->fd(), 4096), 0);
  EXPECT_EQ(errno, EPERM);
}

TEST(ShmSegment, APeersSegmentThatIsNotSealedIsNotMapped) {
  std::string why;
  if (!Available(&why)) GTEST_SKIP() << "shm unavailable here: " << why;
  std::unique_ptr<PeerMapper> mapper;
  ASSERT_TRUE(PeerMapper::Open(getpid(), -1, &mapper).ok());  // this process plays the peer

  const std::string name = SegmentName(2, 1);
  const int unsealed = memfd_create(name.c_str(), MFD_CLOEXEC);
  ASSERT_GE(unsealed, 0);
  ASSERT_EQ(ftruncate(unsealed, 1 << 16), 0);
  std::shared_ptr<Mapping> m;
  const Status s = mapper->Map(unsealed, name, 1 << 16, true, &m);
  EXPECT_EQ(s.code(), StatusCode::kRemoteAccessDenied) << s.ToString();
  EXPECT_NE(s.message().find("sealed"), std::string::npos) << s.message();
  close(unsealed);

  std::unique_ptr<Segment> seg;
  const std::string sealed_name = SegmentName(2, 2);
  ASSERT_TRUE(Segment::Create(1 << 16, false, true, sealed_name, &seg).ok());
  EXPECT_TRUE(mapper->Map(seg->fd(), sealed_name, 1 << 16, true, &m).ok());
}

// The length of the mapping that starts at addr, as /proc/self/maps shows it (0: none).
uint64_t MappingLengthAt(const void* addr) {
  std::ifstream maps("/proc/self/maps");
  const auto a = reinterpret_cast<uintptr_t>(addr);
  for (std::string line; std::getline(maps, line);) {
    const uintptr_t lo = std::stoull(line.substr(0, line.find('-')), nullptr, 16);
    const uintptr_t hi = std::stoull(line.substr(line.find('-') + 1), nullptr, 16);
    if (a == lo) return hi - lo;
  }
  return 0;
}

// A peer's 1 MiB region in a sparse 1 TiB segment: only the region is mapped here (the whole
// segment took a TiB of this process's address space per region, 128 of them all of it).
TEST(ShmSegment, OnlyTheRegionsExtentOfAPeersSegmentIsMapped) {
  std::string why;
  if (!Available(&why)) GTEST_SKIP() << "shm unavailable here: " << why;
  std::unique_ptr<PeerMapper> mapper;
  ASSERT_TRUE(PeerMapper::Open(getpid(), -1, &mapper).ok());  // this process plays the peer
  const std::string name = SegmentName(4, 1);
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 1ll << 40), 0);  // sparse: no memory behind it
  ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  for (const uint64_t len : {uint64_t{1} << 20, uint64_t{4097}}) {
    std::shared_ptr<Mapping> m;
    ASSERT_TRUE(mapper->Map(fd, name, len, true, &m).ok());
    EXPECT_EQ(MappingLengthAt(m->base()), (len + 4095) / 4096 * 4096);
    m->base()[len - 1] = 7;  // (the region's last byte is there)
  }
  close(fd);
}

// Peers' mapped segments are bounded by this host's memory and swap: regions of a sparse
// segment past that are refused (each took its length of this process's address space before:
// 128 regions of a TiB all of it), and the budget comes back as mappings go.
TEST(ShmSegment, PeersMappedBytesStayWithinThisHostsMemory) {
  std::string why;
  if (!Available(&why)) GTEST_SKIP() << "shm unavailable here: " << why;
  std::unique_ptr<PeerMapper> mapper;
  ASSERT_TRUE(PeerMapper::Open(getpid(), -1, &mapper).ok());
  const std::string name = SegmentName(5, 1);
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  const uint64_t cap = PeerMapper::max_mapped_bytes();
  const uint64_t beyond = (cap / 4096 + 1) * 4096 + (uint64_t{1} << 30);  // (sparse: no memory behind it)
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(beyond)), 0);
  ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  const uint64_t before = PeerMapper::mapped_bytes();
  std::shared_ptr<Mapping> whole, half, other;
  Status s = mapper->Map(fd, name, beyond, true, &whole);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message().find("memory and swap"), std::string::npos) << s.message();
  const uint64_t part = (cap - before) / 2 / 4096 * 4096;
  ASSERT_TRUE(mapper->Map(fd, name, part, true, &half).ok());
  ASSERT_TRUE(mapper->Map(fd, name, part, true, &other).ok());
  EXPECT_EQ(PeerMapper::mapped_bytes(), before + 2 * part);
  std::shared_ptr<Mapping> more;
  EXPECT_EQ(mapper->Map(fd, name, 1 << 20, true, &more).code(), StatusCode::kResourceExhausted);
  other.reset();  // (unmapped: its bytes are free again)
  EXPECT_EQ(PeerMapper::mapped_bytes(), before + part);
  EXPECT_TRUE(mapper->Map(fd, name, 1 << 20, true, &more).ok());
  close(fd);
}

// The permissions of the mapping that holds addr, as /proc/self/maps shows them ("r--s").
std::string PermsAt(const void* addr) {
  std::ifstream maps("/proc/self/maps");
  const auto a = reinterpret_cast<uintptr_t>(addr);
  for (std::string line; std::getline(maps, line);) {
    std::istringstream in(line);
    std::string range, perms;
    in >> range >> perms;
    const uintptr_t lo = std::stoull(range.substr(0, range.find('-')), nullptr, 16);
    const uintptr_t hi = std::stoull(range.substr(range.find('-') + 1), nullptr, 16);
    if (a >= lo && a < hi) return perms;
  }
  return "";
}

TEST(ShmSegment, ReadOnlyForPeersIsSealedAgainstEveryOtherWritableMapping) {
  std::string why;
  if (!Available(&why)) GTEST_SKIP() << "shm unavailable here: " << why;
  std::unique_ptr<Segment> seg;
  const std::string name = SegmentName(3, 1);
  ASSERT_TRUE(Segment::Create(1 << 16, false, false, name, &seg).ok());
  EXPECT_NE(fcntl(seg->fd(), F_GET_SEALS) & F_SEAL_FUTURE_WRITE, 0);
  static_cast<char*>(seg->data())[0] = 42;  // the owner still writes through its own mapping
  void* w = mmap(nullptr, 1 << 16, PROT_READ | PROT_WRITE, MAP_SHARED, seg->fd(), 0);
  EXPECT_EQ(w, MAP_FAILED) << "a second writable mapping of a read-only segment";
  EXPECT_NE(pwrite(seg->fd(), "x", 1, 0), 1) << "a write through the descriptor";

  std::unique_ptr<PeerMapper> mapper;
  ASSERT_TRUE(PeerMapper::Open(getpid(), -1, &mapper).ok());  // this process plays the peer
  std::shared_ptr<Mapping> m;
  const Status writable = mapper->Map(seg->fd(), name, 1 << 16, true, &m);
  EXPECT_EQ(writable.code(), StatusCode::kRemoteAccessDenied) << writable.ToString();
  ASSERT_TRUE(mapper->Map(seg->fd(), name, 1 << 16, false, &m).ok());
  EXPECT_EQ(m->base()[0], 42);
  EXPECT_EQ(PermsAt(m->base()), "r--s");

  // A read-write segment maps writable.
  std::unique_ptr<Segment> rw;
  ASSERT_TRUE(Segment::Create(1 << 16, false, true, SegmentName(3, 2), &rw).ok());
  EXPECT_EQ(fcntl(rw->fd(), F_GET_SEALS) & F_SEAL_FUTURE_WRITE, 0);
  ASSERT_TRUE(mapper->Map(rw->fd(), SegmentName(3, 2), 1 << 16, true, &m).ok());
  EXPECT_EQ(PermsAt(m->base()), "rw-s");
}

}  // namespace
}  // namespace xfer::shared_memory
