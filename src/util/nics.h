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
// The NICs a list names: each entry an interface name or one of this host's IPv4 addresses.
// Fails (kInvalidArgument, naming the entry) for an unknown name or address, an interface
// that is down or has no IPv4 address, or an entry named twice.
Status ResolveNics(const std::vector<std::string>& wanted, std::vector<Nic>* out);

}  // namespace xfer::net
