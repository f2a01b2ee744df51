#include "util/checksum.h"

#ifdef XFER_HAVE_XXHASH
#include <xxhash.h>
#endif
#ifdef XFER_HAVE_XXHASH_DISPATCH
#include <xxh_x86dispatch.h>  // XXH3_64bits and its update become the dispatching versions
#endif

namespace xfer::checksum {

#ifdef XFER_HAVE_XXHASH
struct Running::State {
  XXH3_state_t* s = XXH3_createState();
  ~State() { XXH3_freeState(s); }
};
bool Available() { return true; }
uint64_t Of(const void* p, size_t n) { return XXH3_64bits(p, n); }
Running::Running() : state_(std::make_unique<State>()) { XXH3_64bits_reset(state_->s); }
void Running::Add(const void* p, size_t n) { XXH3_64bits_update(state_->s, p, n); }
uint64_t Running::Value() const { return XXH3_64bits_digest(state_->s); }
#else
struct Running::State {};
bool Available() { return false; }
uint64_t Of(const void*, size_t) { return 0; }
Running::Running() = default;
void Running::Add(const void*, size_t) {}
uint64_t Running::Value() const { return 0; }
#endif

Running::~Running() = default;
Running::Running(Running&&) noexcept = default;
Running& Running::operator=(Running&&) noexcept = default;

}  // namespace xfer::checksum
