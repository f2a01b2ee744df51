// One step of a bounded spin-wait. It yields the core rather than burning it: when threads
// outnumber cores (2 here: caller, streams, control), the thread being waited for may need
// exactly this core, and a yield costs well under a microsecond where a sleep costs ~20.
#pragma once

#include <sched.h>

namespace xfer {

inline void SpinPause() { ::sched_yield(); }

}  // namespace xfer
