// Two hosts on one machine for the fault tests: two network namespaces joined by veth pairs
// (one per "NIC"), and a request that outlasts a cut of them. Nothing leaves the namespaces a
// test creates (and removes). Needs root: the tests skip with the reason otherwise.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "test_common.h"

namespace xfer_test {

inline bool Shell(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; }

// Namespaces a and b, joined by `links` veth pairs: pair n is dev_a_[n] (ip_a_[n]) in a and
// dev_b_[n] (ip_b_[n]) in b, in a /30 subnet of its own.
class TwoNamespaces : public ::testing::Test {
 protected:
  // Builds them; false with *why when this machine cannot.
  bool Build(int links, std::string* why) {
    if (geteuid() != 0) {
      *why = "network namespaces need root";
      return false;
    }
    const std::string id = std::to_string(getpid());
    ns_a_ = "xfer-a-" + id;
    ns_b_ = "xfer-b-" + id;
    std::vector<std::string> cmds = {"ip netns add " + ns_a_, "ip netns add " + ns_b_,
                                     "ip -n " + ns_a_ + " link set lo up",
                                     "ip -n " + ns_b_ + " link set lo up"};
    built_ = true;
    for (int n = 0; n < links; ++n) {
      const std::string a = "xa" + std::to_string(n) + "-" + id, b = "xb" + std::to_string(n) + "-" + id;
      const std::string net = "10." + std::to_string(231 + n) + "." + std::to_string(getpid() % 250) + ".";
      dev_a_.push_back(a);
      dev_b_.push_back(b);
      ip_a_.push_back(net + "1");
      ip_b_.push_back(net + "2");
      for (const std::string& c :
           {// Made in a, not here: an interface of this namespace, even for a moment, is one
            // that UCX in a test running beside this one may pick and then lose. Both ends in a
            // first, so that their interface indices differ (UCX takes two interfaces of one
            // host with one index for ends that cannot reach each other: seen with UCX 1.13).
            "ip link add " + a + " netns " + ns_a_ + " type veth peer name " + b + " netns " + ns_a_,
            "ip -n " + ns_a_ + " link set " + b + " netns " + ns_b_,
            "ip -n " + ns_a_ + " addr add " + net + "1/30 dev " + a,
            "ip -n " + ns_b_ + " addr add " + net + "2/30 dev " + b,
            "ip -n " + ns_a_ + " link set " + a + " up", "ip -n " + ns_b_ + " link set " + b + " up"}) {
        cmds.push_back(c);
      }
    }
    for (const auto& c : cmds) {
      if (!Shell(c)) {
        *why = "cannot build the network ('" + c + "' failed)";
        return false;
      }
    }
    return true;
  }
  // Removes them (after the peers are gone).
  void Remove() {
    if (!built_) return;
    Shell("ip netns del " + ns_a_);
    Shell("ip netns del " + ns_b_);
  }
  // Options for a peer in ns named ip:0, as host `host` (empty: the machine's own id).
  static PeerOptions PeerIn(const std::string& ns, const std::string& ip, const std::string& host,
                            std::vector<std::string> args) {
    PeerOptions o;
    o.extra_args = std::move(args);
    o.netns = ns;
    o.name = ip + ":0";
    o.host_id = host;
    o.heartbeat_ms = 200;
    o.heartbeat_timeout_ms = 1500;
    return o;
  }

  std::string ns_a_, ns_b_;
  std::vector<std::string> dev_a_, dev_b_, ip_a_, ip_b_;
  bool built_ = false;
};

// An async WRITE of 64 x 64 MiB from a to b (far more than moves before the cut), then, `after`
// it started, host a's interfaces `devs` in namespace ns taken down: the cut is made when this
// returns. req (the request's handle) is "" after a failed assertion.
struct CutWrite {
  PeerRegion region;
  uint64_t local = 0;
  std::string req;
};
inline CutWrite StartWriteThenCut(PeerProcess& a, PeerProcess& b, const std::string& ns,
                                  const std::vector<std::string>& devs, std::chrono::milliseconds after) {
  constexpr uint64_t kLen = 64 << 20;
  CutWrite w{b.Alloc(kLen), a.Buf(kLen), ""};
  Reply req = a.Call("axfer write " + b.name() + " 60000 " + std::to_string(w.local) + " " +
                     std::to_string(w.region.addr) + " " + std::to_string(kLen) + " 64");
  EXPECT_TRUE(req.ok) << req.line;
  if (!req.ok) return w;
  w.req = req.words.at(0);
  std::this_thread::sleep_for(after);
  for (const auto& d : devs) EXPECT_TRUE(Shell("ip -n " + ns + " link set " + d + " down")) << d;
  return w;
}

// The request ends FAILED with CONNECTION_LOST within the heartbeat timeout (1.5 s in these
// tests, and 2 s of slack) of t0, when the cut was made.
inline void ExpectLostWithinHeartbeat(PeerProcess& a, const std::string& req, Clock::time_point t0) {
  Reply done = a.Call("wait " + req + " 15000", std::chrono::seconds(20));
  ASSERT_TRUE(done.ok) << done.line;
  EXPECT_EQ(done.words.at(0), "FAILED") << done.line;
  EXPECT_EQ(done.words.at(1), "CONNECTION_LOST") << done.line;
  EXPECT_LT(SecondsSince(t0), 1.5 + 2.0) << "not ended within the heartbeat timeout";
}

}  // namespace xfer_test
