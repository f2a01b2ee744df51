#include "transport/tcp/nics.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <algorithm>
#include <bit>

#include "util/log.h"
#include "util/pci_locality.h"

namespace xfer::net {
namespace {

bool ToIpv4(const std::string& dotted, uint32_t* host_order) {
  in_addr a{};
  if (::inet_pton(AF_INET, dotted.c_str(), &a) != 1) return false;
  *host_order = ntohl(a.s_addr);
  return true;
}

}  // namespace

bool Nic::OnLink(const std::string& addr) const {
  uint32_t mine = 0, theirs = 0;
  if (!ToIpv4(address, &mine) || !ToIpv4(addr, &theirs)) return false;
  const uint32_t mask = prefix <= 0 ? 0 : ~uint32_t{0} << (32 - std::min(prefix, 32));
  return (mine & mask) == (theirs & mask);
}

bool IsRemoteIpv4(const std::string& addr, const std::string& peer_host) {
  uint32_t a = 0, peer = 0;
  if (!ToIpv4(addr, &a)) return false;
  const auto loopback = [](uint32_t v) { return (v >> 24) == 127; };
  if ((a >> 24) == 0 || (a >> 28) >= 0xE) return false;  // unspecified, multicast, reserved, broadcast
  return !loopback(a) || (ToIpv4(peer_host, &peer) && loopback(peer)) || peer_host == "localhost";
}

std::vector<Nic> LocalNics() {
  std::vector<Nic> out;
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return out;
  for (const ifaddrs* i = all; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    Nic n;
    n.name = i->ifa_name;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text);
    n.address = text;
    if (i->ifa_netmask != nullptr) {
      n.prefix = std::popcount(ntohl(reinterpret_cast<const sockaddr_in*>(i->ifa_netmask)->sin_addr.s_addr));
    }
    n.up = (i->ifa_flags & IFF_UP) != 0 && (i->ifa_flags & IFF_RUNNING) != 0;
    n.loopback = (i->ifa_flags & IFF_LOOPBACK) != 0;
    out.push_back(std::move(n));
  }
  ::freeifaddrs(all);
  return out;
}

namespace {

// "near:BUS_ID": the usable NICs nearest that PCI device (all those of the nearest class).
Status ExpandNear(const std::string& entry, const std::vector<Nic>& here, const std::string& sysfs,
                  std::vector<std::string>* names) {
  const std::string bus_id = entry.substr(5);
  if (pci::PlaceOfPciDevice(sysfs, bus_id).path.empty()) {
    return {StatusCode::kInvalidArgument, "tcp.nics: '" + entry + "': no PCI device " + bus_id +
                                              " on this host (a bus id as 0000:3b:00.0)"};
  }
  std::vector<std::string> usable;
  for (const Nic& n : here) {
    if (n.up && !n.loopback && std::find(usable.begin(), usable.end(), n.name) == usable.end())
      usable.push_back(n.name);
  }
  const std::vector<pci::RankedNic> ranked = pci::RankNics(sysfs, bus_id, usable);
  if (ranked.empty() || ranked[0].distance == pci::Distance::kUnknown) {
    return {StatusCode::kInvalidArgument,
            "tcp.nics: '" + entry +
                "': no interface here that is up, has an IPv4 "
                "address and sits on the PCI tree (virtual ones have no place on it)"};
  }
  std::string chosen;
  for (const auto& r : ranked) {
    if (r.distance != ranked[0].distance) break;
    names->push_back(r.name);
    chosen += " " + r.name;
  }
  XLOG(INFO) << "tcp.nics " << entry << ":" << chosen << " (" << pci::DistanceName(ranked[0].distance)
             << "; classes nearest first: PXB, PHB, NODE, SYS)";
  return Status::Ok();
}

}  // namespace

Status ResolveNics(const std::vector<std::string>& wanted, std::vector<Nic>* out, const std::string& sysfs) {
  out->clear();
  if (wanted.empty()) return Status::Ok();
  const std::vector<Nic> here = LocalNics();
  std::vector<std::string> named, nearby;
  for (const std::string& w : wanted) {
    if (w.rfind("near:", 0) != 0) {
      named.push_back(w);
    } else if (Status s = ExpandNear(w, here, sysfs, &nearby); !s.ok()) {
      return s;
    }
  }
  for (const std::string& w : named) {
    auto it =
        std::find_if(here.begin(), here.end(), [&](const Nic& n) { return n.name == w || n.address == w; });
    if (it == here.end()) {
      const bool is_interface = ::if_nametoindex(w.c_str()) != 0;
      return {StatusCode::kInvalidArgument,
              "tcp.nics: '" + w + "' is " +
                  (is_interface ? "an interface without an IPv4 address"
                                : "neither an interface nor an IPv4 address of this host")};
    }
    if (!it->up) return {StatusCode::kInvalidArgument, "tcp.nics: interface " + it->name + " is down"};
    if (std::any_of(out->begin(), out->end(), [&](const Nic& n) { return n.address == it->address; })) {
      return {StatusCode::kInvalidArgument, "tcp.nics: " + w + " is named twice"};
    }
    out->push_back(*it);
  }
  // The ones "near:" chose, after those named: an interface also named (by name or address),
  // or chosen by two entries, counts once.
  for (const std::string& w : nearby) {
    auto it = std::find_if(here.begin(), here.end(), [&](const Nic& n) { return n.name == w; });
    if (std::none_of(out->begin(), out->end(), [&](const Nic& n) { return n.name == w; }))
      out->push_back(*it);
  }
  return Status::Ok();
}

}  // namespace xfer::net
