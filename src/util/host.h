// Host identity and process facts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace xfer::host {

// The kernel's boot id: equal for two processes exactly when they run on one booted host.
std::string BootId();
// A random 64-bit value that is never 0.
uint64_t RandomU64();
// The size of the largest CPU cache (sysfs; glibc's sysconf can report a VM's L3 ten times
// too large). 32 MiB when unknown.
uint64_t LastLevelCacheBytes();
// The RDMA devices (InfiniBand, RoCE, iWARP) the kernel lists in /sys/class/infiniband, sorted.
std::vector<std::string> RdmaDevices();

}  // namespace xfer::host
