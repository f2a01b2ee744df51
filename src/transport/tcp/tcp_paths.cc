#include "transport/tcp/tcp_paths.h"

#include <algorithm>

namespace xfer::transport {
namespace {
constexpr std::chrono::milliseconds kFirstBackoff{100}, kMaxBackoff{5000};
}  // namespace

std::string Path::Name() const {
  const std::string dest = "-> " + to.ToString();
  return from.address.empty() ? dest : from.device + " (" + from.address + ") " + dest;
}

std::chrono::milliseconds Path::backoff() const {
  const uint32_t n = std::min<uint32_t>(losses_.load(), 6);
  return std::min(kMaxBackoff, kFirstBackoff * (1 << n));
}

std::chrono::milliseconds Path::Lost() {
  const auto now = Clock::now();
  int64_t until = avoid_until_.load();
  const auto wait = backoff();
  const int64_t next = (now + wait).time_since_epoch().count();
  do {
    if (now.time_since_epoch().count() < until) return std::chrono::milliseconds(0);  // (avoided already)
  } while (!avoid_until_.compare_exchange_weak(until, next));
  losses_.fetch_add(1);
  return wait;
}

bool Path::Worked(uint64_t bytes) {
  bytes_.fetch_add(bytes, std::memory_order_relaxed);
  if (losses_.load(std::memory_order_relaxed) == 0) return false;
  avoid_until_.store(0);
  return losses_.exchange(0) != 0;
}

std::vector<std::unique_ptr<Path>> PathsTo(const TcpPeer& peer, const std::vector<net::Nic>& nics) {
  std::vector<std::unique_ptr<Path>> paths;
  auto add = [&](net::Source from, const net::Address& to) {
    paths.push_back(std::make_unique<Path>());
    paths.back()->from = std::move(from);
    paths.back()->to = to;
  };
  const net::Address main{peer.host, peer.port, true};
  if (nics.empty()) {  // (one route, as ever: the peer's NICs may not be reachable from here)
    add({}, main);
    return paths;
  }
  std::vector<net::Address> theirs;
  for (const std::string& a : peer.nics) {
    net::Address parsed;
    if (net::ParseAddress(a, &parsed).ok() && parsed.has_port) theirs.push_back(parsed);
  }
  if (theirs.empty()) theirs.push_back(main);
  for (const net::Nic& n : nics) {
    for (const auto& t : theirs) {
      if (n.OnLink(t.host)) add({n.address, n.name}, t);
    }
  }
  if (paths.empty()) {
    for (size_t i = 0; i < std::max(nics.size(), theirs.size()); ++i) {
      const net::Nic& n = nics[i % nics.size()];
      add({n.address, n.name}, theirs[i % theirs.size()]);
    }
  }
  return paths;
}

}  // namespace xfer::transport
