// How near a NIC sits to a GPU (or any PCI device) on this host's PCIe tree, read from sysfs:
// the rule behind tcp.nics' "near:PCI_ADDRESS" entries (docs/transports.md, "Several NICs").
// Every function takes the sysfs root ("/sys" on a host; a directory of fake topologies in tests).
#pragma once

#include <string>
#include <vector>

namespace xfer::pci {

// From nearest to farthest (the names NCCL and nvidia-smi topo use for the same classes).
enum class Distance {
  kBridge,      // PXB: both below one PCIe bridge or switch under the host bridge (or the same device)
  kHostBridge,  // PHB: under the same host bridge (root complex), no bridge in common below it
  kNumaNode,    // NODE: under different host bridges of one NUMA node
  kSystem,      // SYS: in different NUMA nodes
  kUnknown,     // either is not a PCI device here (a virtual NIC, a bus id not on this host)
};
const char* DistanceName(Distance d);

// Where a device sits: the PCI path from its host bridge ("pci0000:3a", then bus ids down to
// the device's own) and its NUMA node (-1: none given, as on a one-node host).
struct Place {
  std::vector<std::string> path;  // empty: not a PCI device here
  int numa_node = -1;
};
// The PCI device with bus id `bus_id` ("0000:3b:00.0"; "3b:00.0" means domain 0000).
Place PlaceOfPciDevice(const std::string& sysfs, const std::string& bus_id);
// The PCI device behind network interface `nic` (through a virtio device where there is one).
Place PlaceOfNic(const std::string& sysfs, const std::string& nic);

Distance Between(const Place& a, const Place& b);

struct RankedNic {
  std::string name;
  Distance distance;
};
// `nics` ranked by their distance to the PCI device `bus_id`, nearest first (equals keep their
// order).
std::vector<RankedNic> RankNics(const std::string& sysfs, const std::string& bus_id,
                                const std::vector<std::string>& nics);

// "0000:3b:00.0" for "3b:00.0" or "0000:3B:00.0"; empty when `bus_id` is not a PCI bus id.
std::string NormalizeBusId(const std::string& bus_id);

}  // namespace xfer::pci
