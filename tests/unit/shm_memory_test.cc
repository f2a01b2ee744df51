// shm segments: sealed at their size, so that a peer that maps one can rely on every page; and
// a peer's segment that is not sealed is not mapped (its owner could shrink it under the
// mapping, and the next copy would die of SIGBUS).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "transport/shm/shm_memory.h"

namespace xfer::transport::shm {
namespace {

TEST(ShmSegment, IsSealedAgainstResizing) {
  std::string why;
  if (!Available(&why)) GTEST_SKIP() << "shm unavailable here: " << why;
  std::unique_ptr<Segment> seg;
  ASSERT_TRUE(Segment::Create(1 << 16, false, SegmentName(1, 1), &seg).ok());
  const int seals = fcntl(seg->fd(), F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  EXPECT_NE(ftruncate(seg->fd(), 4096), 0);
  EXPECT_EQ(errno, EPERM);
}

TEST(ShmSegment, APeersSegmentThatIsNotSealedIsNotMapped) {
  std::string why;
  if (!Available(&why)) GTEST_SKIP() << "shm unavailable here: " << why;
  std::unique_ptr<PeerMapper> mapper;
  ASSERT_TRUE(PeerMapper::Open(getpid(), &mapper).ok());  // this process plays the peer

  const std::string name = SegmentName(2, 1);
  const int unsealed = memfd_create(name.c_str(), MFD_CLOEXEC);
  ASSERT_GE(unsealed, 0);
  ASSERT_EQ(ftruncate(unsealed, 1 << 16), 0);
  std::shared_ptr<Mapping> m;
  const Status s = mapper->Map(unsealed, name, 1 << 16, &m);
  EXPECT_EQ(s.code(), StatusCode::kRemoteAccessDenied) << s.ToString();
  EXPECT_NE(s.message().find("sealed"), std::string::npos) << s.message();
  close(unsealed);

  std::unique_ptr<Segment> seg;
  const std::string sealed_name = SegmentName(2, 2);
  ASSERT_TRUE(Segment::Create(1 << 16, false, sealed_name, &seg).ok());
  EXPECT_TRUE(mapper->Map(seg->fd(), sealed_name, 1 << 16, &m).ok());
}

}  // namespace
}  // namespace xfer::transport::shm
