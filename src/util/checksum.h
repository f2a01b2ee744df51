// A fast 64-bit checksum of bytes (XXH3 from libxxhash; Debian: libxxhash-dev), for
// EngineOptions::tcp.checksum and the end-to-end checksums of requests (EngineOptions::checksum).
// Without libxxhash, Available() is false and the engine refuses both.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace xfer::checksum {

// True when this build has libxxhash.
bool Available();

// The checksum of n bytes at p (as Running's over the same bytes).
uint64_t Of(const void* p, size_t n);

// The checksum of the bytes given to Add, in order, as if they were one run.
class Running {
 public:
  Running();
  ~Running();
  Running(Running&&) noexcept;
  Running& operator=(Running&&) noexcept;
  void Add(const void* p, size_t n);
  uint64_t Value() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace xfer::checksum
