// tcp.nics: naming the host's interfaces, and which addresses each reaches without a router.
#include "transport/tcp/nics.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "xfer/options.h"

namespace xfer::net {
namespace {

TEST(Nics, AnInterfaceIsNamedByItsNameOrItsAddress) {
  std::vector<Nic> nics;
  const auto all = LocalNics();
  if (std::none_of(all.begin(), all.end(), [](const Nic& n) { return n.name == "lo" && n.up; })) {
    GTEST_SKIP() << "no loopback interface up here (a sandbox without networking)";
  }
  ASSERT_TRUE(ResolveNics({"lo"}, &nics).ok());
  ASSERT_EQ(nics.size(), 1u);
  EXPECT_EQ(nics[0].address, "127.0.0.1");
  EXPECT_TRUE(nics[0].loopback);
  EXPECT_TRUE(nics[0].up);
  ASSERT_TRUE(ResolveNics({"127.0.0.1"}, &nics).ok());
  ASSERT_EQ(nics.size(), 1u);
  EXPECT_EQ(nics[0].name, "lo");
  ASSERT_TRUE(ResolveNics({}, &nics).ok());
  EXPECT_TRUE(nics.empty());
}

TEST(Nics, BadNamesAreRefusedWithTheReason) {
  std::vector<Nic> nics;
  Status s = ResolveNics({"no-such-nic0"}, &nics);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'no-such-nic0' is neither an interface nor an IPv4 address"), std::string::npos)
      << s.message();
  s = ResolveNics({"198.51.100.77"}, &nics);  // (TEST-NET-2: documentation only)
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
  s = ResolveNics({"lo", "127.0.0.1"}, &nics);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("named twice"), std::string::npos) << s.message();
}

TEST(Nics, APeerMayOnlySendUsToAnotherHostsAddress) {
  EXPECT_TRUE(IsRemoteIpv4("10.0.0.2", "10.0.0.9"));
  EXPECT_FALSE(IsRemoteIpv4("127.0.0.1", "10.0.0.9")) << "loopback, from a peer on another host";
  EXPECT_TRUE(IsRemoteIpv4("127.0.0.1", "127.0.0.1"));
  EXPECT_FALSE(IsRemoteIpv4("0.0.0.0", "10.0.0.9"));
  EXPECT_FALSE(IsRemoteIpv4("224.0.0.1", "10.0.0.9"));
  EXPECT_FALSE(IsRemoteIpv4("255.255.255.255", "10.0.0.9"));
  EXPECT_FALSE(IsRemoteIpv4("240.0.0.1", "10.0.0.9"));
  EXPECT_FALSE(IsRemoteIpv4("example.com", "10.0.0.9")) << "no names: no lookups on a peer's word";
  EXPECT_FALSE(IsRemoteIpv4("::1", "10.0.0.9"));
}

TEST(Nics, OnLinkMeansTheSameSubnet) {
  Nic n{"eth1", "10.1.2.3", 24, true, false};
  EXPECT_TRUE(n.OnLink("10.1.2.200"));
  EXPECT_FALSE(n.OnLink("10.1.3.1"));
  EXPECT_FALSE(n.OnLink("not-an-address"));
  n.prefix = 30;
  EXPECT_TRUE(n.OnLink("10.1.2.2"));
  EXPECT_FALSE(n.OnLink("10.1.2.4"));
  n.prefix = 0;
  EXPECT_TRUE(n.OnLink("192.168.0.1"));
}

TEST(Nics, ToolsTakeACommaSeparatedList) {
  EXPECT_EQ(SplitList("eth1,eth2"), (std::vector<std::string>{"eth1", "eth2"}));
  EXPECT_EQ(SplitList("eth1,,10.0.0.1,"), (std::vector<std::string>{"eth1", "10.0.0.1"}));
  EXPECT_TRUE(SplitList("").empty());
  EXPECT_TRUE(SplitList(",").empty());
}

}  // namespace
}  // namespace xfer::net
