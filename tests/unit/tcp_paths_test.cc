// The tcp transport's paths over several NICs: which pairs of NICs it uses, and how a lost
// path is avoided, then tried again.
#include "transport/tcp/tcp_paths.h"

#include <gtest/gtest.h>

#include <thread>

namespace xfer::transport {
namespace {

TcpPeer Peer(std::vector<std::string> addresses) {
  TcpPeer p;
  p.host = "10.9.9.9";
  p.port = 4000;
  p.nics = std::move(addresses);
  return p;
}
net::Nic NicOf(const std::string& name, const std::string& address, int prefix) {
  return net::Nic{name, address, prefix, true, false};
}
std::vector<std::string> Names(const std::vector<std::unique_ptr<Path>>& paths) {
  std::vector<std::string> out;
  for (const auto& p : paths) out.push_back(p->Name());
  return out;
}

TEST(TcpPaths, WithoutNicsOneRouteToThePeersHostAsEver) {
  EXPECT_EQ(Names(PathsTo(Peer({}), {})), (std::vector<std::string>{"-> 10.9.9.9:4000"}));
  EXPECT_EQ(Names(PathsTo(Peer({"10.0.1.2:5", "10.0.2.2:6"}), {})),
            (std::vector<std::string>{"-> 10.9.9.9:4000"}))
      << "the peer's NICs may not be reachable from here";
}

TEST(TcpPaths, AddressesThatDoNotParseAreLeftOut) {
  EXPECT_EQ(Names(PathsTo(Peer({"garbage", "10.0.3.2:7"}), {NicOf("eth1", "10.0.3.1", 24)})),
            (std::vector<std::string>{"eth1 (10.0.3.1) -> 10.0.3.2:7"}));
  EXPECT_EQ(Names(PathsTo(Peer({"no port"}), {NicOf("eth9", "10.9.9.1", 24)})),
            (std::vector<std::string>{"eth9 (10.9.9.1) -> 10.9.9.9:4000"}));
}

TEST(TcpPaths, EachNicPairsWithTheAddressesInItsSubnet) {
  const std::vector<net::Nic> nics = {NicOf("eth1", "10.0.1.1", 24), NicOf("eth2", "10.0.2.1", 24)};
  EXPECT_EQ(Names(PathsTo(Peer({"10.0.2.2:6", "10.0.1.2:5"}), nics)),
            (std::vector<std::string>{"eth1 (10.0.1.1) -> 10.0.1.2:5", "eth2 (10.0.2.1) -> 10.0.2.2:6"}));
  // A peer with one address in eth1's subnet: eth2 is not used.
  EXPECT_EQ(Names(PathsTo(Peer({"10.0.1.2:5"}), nics)),
            (std::vector<std::string>{"eth1 (10.0.1.1) -> 10.0.1.2:5"}));
}

TEST(TcpPaths, WithoutASharedSubnetNicsAndAddressesPairInOrder) {
  const std::vector<net::Nic> nics = {NicOf("eth1", "192.168.1.1", 24), NicOf("eth2", "192.168.2.1", 24)};
  EXPECT_EQ(Names(PathsTo(Peer({}), nics)),
            (std::vector<std::string>{"eth1 (192.168.1.1) -> 10.9.9.9:4000",
                                      "eth2 (192.168.2.1) -> 10.9.9.9:4000"}));
  EXPECT_EQ(Names(PathsTo(Peer({"10.0.1.2:5", "10.0.2.2:6", "10.0.3.2:7"}), nics)),
            (std::vector<std::string>{"eth1 (192.168.1.1) -> 10.0.1.2:5", "eth2 (192.168.2.1) -> 10.0.2.2:6",
                                      "eth1 (192.168.1.1) -> 10.0.3.2:7"}));
}

TEST(TcpPaths, ALostPathIsAvoidedForABackoffThatDoubles) {
  Path p;
  EXPECT_FALSE(p.Avoided(Clock::now()));
  const auto before = Clock::now();
  EXPECT_EQ(p.Lost(), std::chrono::milliseconds(100)) << "the first loss";
  EXPECT_TRUE(p.Avoided(before + std::chrono::milliseconds(99)));
  EXPECT_FALSE(p.Avoided(Clock::now() + std::chrono::milliseconds(101)));
  EXPECT_EQ(p.Lost(), std::chrono::milliseconds(0)) << "other batches failing with it: no new loss";
  EXPECT_EQ(p.backoff(), std::chrono::milliseconds(200));
  while (p.backoff() < std::chrono::milliseconds(800)) {  // losses in a row, each after the last's back-off
    while (p.Avoided(Clock::now())) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const auto got = p.Lost();
    EXPECT_EQ(got * 2, p.backoff()) << "doubling";
  }
  EXPECT_EQ(p.backoff(), std::chrono::milliseconds(800));
  EXPECT_TRUE(p.Worked(100)) << "back";
  EXPECT_FALSE(p.Avoided(Clock::now()));
  EXPECT_FALSE(p.Worked(50));
  EXPECT_EQ(p.bytes(), 150u);
  EXPECT_EQ(p.backoff(), std::chrono::milliseconds(100)) << "starts over";
}

}  // namespace
}  // namespace xfer::transport
