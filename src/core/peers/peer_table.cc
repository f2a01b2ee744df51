#include "core/peers/peer_table.h"

#include <algorithm>

#include "util/net.h"

namespace xfer {
namespace {

Status StillAccepting(const std::string& remote) {
  return {StatusCode::kTimeout, "Connect: the session '" + remote + "' opened to us is still being set up"};
}

}  // namespace

bool PeerTable::Find(const std::string& key, Peer* out) const {
  // The peer this thread found last, held weakly (a peer that goes away is not kept alive
  // by a thread that stopped transferring to it).
  // (Once the thread's copy was destroyed, at its exit or the process's, a call from a later
  // destructor takes the lock: `gone`, trivially destructible, outlives it.)
  thread_local bool gone = false;
  struct Found {
    const PeerTable* table = nullptr;
    uint64_t version = 0;
    std::string key;
    std::weak_ptr<control::Session> session;
    std::weak_ptr<PeerState> state;
    ~Found() { gone = true; }
  };
  const uint64_t version = version_.load(std::memory_order_acquire);
  Found* last = nullptr;
  if (!gone) {
    thread_local Found mine;
    last = &mine;
  }
  if (last != nullptr && last->table == this && last->version == version && last->key == key) {
    Peer p{last->session.lock(), last->state.lock()};
    if (p.session && p.state) {
      *out = std::move(p);
      return true;
    }
  }
  std::lock_guard lock(mu_);
  auto it = peers_.find(key);
  if (it == peers_.end()) return false;
  *out = it->second;
  // (The version read above, not the current one: a change since then makes the next call
  // look again.)
  if (last != nullptr) {  // (field by field: a temporary Found's destructor would set gone)
    last->table = this;
    last->version = version;
    last->key = key;
    last->session = out->session;
    last->state = out->state;
  }
  return true;
}

bool PeerTable::HasLive(uint64_t incarnation) const {
  std::lock_guard lock(mu_);
  for (const auto& [key, p] : peers_) {
    if (p.state->info.incarnation == incarnation && p.state->alive.load()) return true;
  }
  return false;
}

std::vector<std::string> PeerTable::AuthKeysOf(uint64_t incarnation) const {
  std::lock_guard lock(mu_);
  std::vector<std::string> keys;
  for (const auto& [key, p] : peers_) {
    // ("" is no key, a session without a secret's: anyone could prove it.)
    if (p.state->info.incarnation == incarnation && p.state->alive.load() && !p.state->auth_key.empty()) {
      keys.push_back(p.state->auth_key);
    }
  }
  return keys;
}

std::vector<std::shared_ptr<PeerState>> PeerTable::States() const {
  std::lock_guard lock(mu_);
  std::vector<std::shared_ptr<PeerState>> out;
  for (const auto& [key, p] : peers_) out.push_back(p.state);
  return out;
}

bool PeerTable::AwaitAccepted(std::unique_lock<std::mutex>& lock, const std::string& remote,
                              Clock::time_point deadline) {
  return changed_.wait_until(lock, deadline, [&] { return !accepting_.count(remote); });
}

Status PeerTable::Claim(const std::string& remote, Clock::time_point deadline) {
  std::unique_lock lock(mu_);
  if (!AwaitAccepted(lock, remote, deadline)) return StillAccepting(remote);
  if (peers_.count(remote) || connecting_.count(remote)) {
    return {StatusCode::kAlreadyConnected, "already connected to '" + remote + "'"};
  }
  if (Full()) return TooMany();
  connecting_.insert(remote);
  return Status::Ok();
}

void PeerTable::Unclaim(const std::string& remote) {
  std::lock_guard lock(mu_);
  connecting_.erase(remote);
}

bool PeerTable::InstallClaimed(const std::string& remote, const Peer& peer) {
  std::lock_guard lock(mu_);
  connecting_.erase(remote);
  if (peers_.count(remote)) return false;
  peers_[remote] = peer;
  Changed();
  return true;
}

Status PeerTable::AwaitCrossed(const std::string& remote, Clock::time_point deadline) {
  std::unique_lock lock(mu_);
  if (!AwaitAccepted(lock, remote, deadline)) return StillAccepting(remote);
  return peers_.count(remote) ? Status::Ok()
                              : Status{StatusCode::kAlreadyConnected,
                                       "'" + remote + "' already has a session with this engine"};
}

bool PeerTable::Full() const {
  return peers_.size() + connecting_.size() + accepting_.size() >= max_sessions_;
}

Status PeerTable::TooMany() const {
  return {StatusCode::kResourceExhausted, "this engine holds as many sessions as it allows (" +
                                              std::to_string(max_sessions_) +
                                              ", EngineOptions::max_sessions)"};
}

size_t PeerTable::OpenedFrom(const std::string& host) const {
  size_t n = 0;
  for (const auto& [key, p] : peers_) {
    n += p.session && !p.session->outbound() && net::HostOf(p.session->remote_addr()) == host;
  }
  for (const auto& [key, from] : accepting_) n += from == host;
  return n;
}

bool PeerTable::DialledUnderAnotherKey(const std::string& key, const std::string& name, uint64_t incarnation,
                                       Peer* out) const {
  std::lock_guard lock(mu_);
  for (const auto& [other, p] : peers_) {
    if (other != key && p.session && p.session->outbound() && p.state->info.name == name &&
        p.state->info.incarnation == incarnation) {
      *out = p;
      return true;
    }
  }
  return false;
}

Status PeerTable::BeginAccept(const std::string& key, const std::string& name, uint64_t incarnation,
                              const std::string& host, const control::Session* vouched, Peer* replaced) {
  std::lock_guard lock(mu_);
  // While this hello is answered, accepting_ keeps a Connect() of ours from starting a
  // crossing session.
  const bool our_connect_wins = connecting_.count(key) && mine_ < incarnation;
  auto it = peers_.find(key);
  const bool duplicate = it != peers_.end() && (it->second.state->info.incarnation == incarnation ||
                                                it->second.session->outbound());
  if (our_connect_wins || accepting_.count(key) || duplicate) {
    return {StatusCode::kAlreadyConnected, "already connected to '" + key + "'"};
  }
  if (incarnation == mine_) return {StatusCode::kInvalidArgument, "its incarnation is this engine's"};
  // (The same engine under another key, our outbound sessions to the addresses we dialled it
  // at, is not an impostor: when the caller found that this session comes from the engine of
  // one of them, still here under that name and incarnation. A name and an incarnation alone
  // are no proof: anyone may state them.)
  const bool vouched_here =
      vouched != nullptr && std::any_of(peers_.begin(), peers_.end(), [&](const auto& entry) {
        const Peer& p = entry.second;
        return p.session.get() == vouched && p.session->outbound() && p.state->info.name == name &&
               p.state->info.incarnation == incarnation;
      });
  for (const auto& [other, p] : peers_) {
    const bool same_engine = vouched_here && p.session && p.session->outbound() && p.state->info.name == name;
    if (other != key && p.state->info.incarnation == incarnation && !same_engine) {
      return {StatusCode::kInvalidArgument, "its incarnation is that of peer '" + other + "'"};
    }
  }
  // (A restart takes its old session's place; a hello crossing our Connect, that of the claim.)
  if (it == peers_.end() && !connecting_.count(key) && Full()) return TooMany();
  if (it == peers_.end() && OpenedFrom(host) >= max_per_host_) {
    return {StatusCode::kResourceExhausted, "this engine holds as many sessions from " + host +
                                                " as it allows (" + std::to_string(max_per_host_) +
                                                ", EngineOptions::max_sessions_per_host)"};
  }
  accepting_.emplace(key, host);
  if (it != peers_.end()) {  // same name, new incarnation: the peer restarted
    *replaced = it->second;
    peers_.erase(it);
    Changed();
  }
  return Status::Ok();
}

void PeerTable::FinishAccept(const std::string& key, const Peer& peer) {
  {
    std::lock_guard lock(mu_);
    peers_[key] = peer;
    Changed();
    accepting_.erase(key);
  }
  changed_.notify_all();
}

bool PeerTable::RemoveSession(const std::string& key, const std::shared_ptr<control::Session>& s) {
  std::lock_guard lock(mu_);
  auto it = peers_.find(key);
  if (it == peers_.end() || it->second.session != s) return false;
  peers_.erase(it);
  Changed();
  return true;
}

bool PeerTable::Take(const std::string& key, Peer* out) {
  std::lock_guard lock(mu_);
  auto it = peers_.find(key);
  if (it == peers_.end()) return false;
  *out = it->second;
  peers_.erase(it);
  Changed();
  return true;
}

}  // namespace xfer
