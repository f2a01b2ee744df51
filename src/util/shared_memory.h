// Memory two processes of one host share: its owner makes a memfd (Segment), and a peer takes
// a duplicate of the descriptor through pidfd_getfd and maps it (PeerMapper). The shm
// transport keeps AllocMem memory in such segments; same-host notification rings live in them
// too.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "xfer/status.h"

namespace xfer::shared_memory {

// True when this kernel lets us take descriptors from other processes (pidfd_getfd).
bool Available(std::string* why);

// The memfd name that identifies one allocation of one engine incarnation. A peer checks it
// on the descriptor it took, so a reused pid or fd number can never map the wrong memory.
std::string SegmentName(uint64_t incarnation, uint64_t key);

// Owner side: one allocation, mapped shared in this process.
class Segment {
 public:
  // huge_pages: try MAP_HUGETLB pages first; when the kernel has none, fall back to normal
  // pages with a log line. peers_write false: sealed against writes through any mapping or
  // descriptor but this one (F_SEAL_FUTURE_WRITE), so peers can only map it read-only.
  static Status Create(uint64_t len, bool huge_pages, bool peers_write, const std::string& name,
                       std::unique_ptr<Segment>* out);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  int fd() const { return fd_; }
  void* data() const { return base_; }

 private:
  Segment() = default;
  int fd_ = -1;
  void* base_ = nullptr;
  uint64_t len_ = 0;
};

// Initiator side: a peer's segment mapped into this process; unmapped when the last user
// (the peer's region table, or a request still running on it) lets go. Its bytes count
// against PeerMapper's budget until then.
class Mapping {
 public:
  Mapping(uint8_t* base, uint64_t len) : base_(base), len_(len) {}
  ~Mapping();
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  uint8_t* base() const { return base_; }

 private:
  uint8_t* base_;
  uint64_t len_;
};

// Maps segments of one peer process. Peers' segments mapped in this process, all peers and
// mappers together, stay within max_mapped_bytes(), this host's memory and swap: the AllocMem
// memory of every process of the host cannot hold more, and a peer advertising regions in huge
// sparse segments would otherwise fill this process's address space. A mapping past it is
// refused (kResourceExhausted): that region takes another route.
class PeerMapper {
 public:
  // pidfd: the peer process, verified (PeerContext::pidfd; a duplicate is kept), or -1 to
  // open pid as it is now.
  static Status Open(int32_t pid, int pidfd, std::unique_ptr<PeerMapper>* out);
  ~PeerMapper();
  PeerMapper(const PeerMapper&) = delete;
  PeerMapper& operator=(const PeerMapper&) = delete;

  // Takes the peer's descriptor remote_fd, checks that it is the memfd called name and holds
  // at least len bytes, and maps it (read-only unless writable).
  Status Map(int32_t remote_fd, const std::string& name, uint64_t len, bool writable,
             std::shared_ptr<Mapping>* out) const;
  // The same for a small segment both sides write (a notification ring): maps exactly len
  // bytes (rounded up to whole pages), writable, and refuses huge-page segments (whose owner
  // could punch holes that fault in this process).
  Status MapExactly(int32_t remote_fd, const std::string& name, uint64_t len,
                    std::shared_ptr<Mapping>* out) const;
  // A duplicate of the peer's descriptor remote_fd in this process (the caller closes it):
  // how GPU memory exported as a file descriptor (CUDA VMM) reaches us.
  Status TakeFd(int32_t remote_fd, int* fd) const;
  static uint64_t mapped_bytes();  // now, in this process
  static uint64_t max_mapped_bytes();

 private:
  explicit PeerMapper(int pidfd, int32_t pid) : pidfd_(pidfd), pid_(pid) {}
  Status MapSegment(int32_t remote_fd, const std::string& name, uint64_t len, bool writable, bool exactly,
                    std::shared_ptr<Mapping>* out) const;
  int pidfd_;
  int32_t pid_;
};

}  // namespace xfer::shared_memory
