// The host's network interfaces (IPv4), and the choice of the ones a transport may use
// (EngineOptions::tcp.nics).
#pragma once

#include <string>
#include <vector>

#include "xfer/status.h"

namespace xfer::net {

struct Nic {
  std::string name;     // "eth0"
  std::string address;  // its IPv4 address, dotted
  int prefix = 32;      // of its subnet
  bool up = false;
  bool loopback = false;
  // True when addr (IPv4, dotted) is in this NIC's subnet: reached without a router.
  bool OnLink(const std::string& addr) const;
};

// True when addr is a dotted IPv4 address a peer may send us to: not unspecified (0.0.0.0/8),
// multicast, reserved or broadcast (224.0.0.0 and up), and not loopback unless the peer itself
// (peer_host) is on loopback.
bool IsRemoteIpv4(const std::string& addr, const std::string& peer_host);

// Every IPv4 address of every interface (an interface with two addresses appears twice).
std::vector<Nic> LocalNics();
// The NICs a list names: each entry an interface name, one of this host's IPv4 addresses, or
// "near:BUS_ID": the interfaces (up, IPv4, not loopback) nearest the PCI device BUS_ID on the
// PCIe tree, every one of the nearest class (pci_locality.h; read under `sysfs`). Fails
// (kInvalidArgument, naming the entry) for an unknown name, address or bus id, an interface
// that is down or has no IPv4 address, an entry named twice, or a "near:" entry no usable
// interface on the PCI tree answers.
Status ResolveNics(const std::vector<std::string>& wanted, std::vector<Nic>* out,
                   const std::string& sysfs = "/sys");

}  // namespace xfer::net
