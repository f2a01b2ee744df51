// The etcd client's pure parts: URLs, base64 (its talk with a real etcd is in
// tests/integration/cluster_test.cc).
#include <gtest/gtest.h>

#include "metadata/directory.h"
#include "metadata/etcd_client.h"

namespace xfer::metadata {
namespace {

TEST(EtcdUrl, EndpointsAndPrefix) {
  EtcdUrl u;
  ASSERT_TRUE(ParseEtcdUrl("etcd://10.0.0.1:2379", &u).ok());
  EXPECT_EQ(u.endpoints, std::vector<std::string>{"10.0.0.1:2379"});
  EXPECT_EQ(u.prefix, "/xfer");
  ASSERT_TRUE(ParseEtcdUrl("etcd://a:1,b:2,[::1]:3/my/cluster/", &u).ok());
  EXPECT_EQ(u.endpoints, (std::vector<std::string>{"a:1", "b:2", "[::1]:3"}));
  EXPECT_EQ(u.prefix, "/my/cluster");
  ASSERT_TRUE(ParseEtcdUrl("etcd://a:1//x", &u).ok());
  EXPECT_EQ(u.prefix, "/x");
  ASSERT_TRUE(ParseEtcdUrl("etcd://a:1;b:2", &u).ok());  // (Mooncake's and NIXL's lists use ';' too)
  EXPECT_EQ(u.endpoints, (std::vector<std::string>{"a:1", "b:2"}));
  for (const char* bad : {"", "etcd://", "http://a:1", "etcd://a", "etcd://a:", "etcd://:1", "etcd://a:1,",
                          "etcd://a:x1", "etcd://a:1,,b:2"}) {
    const Status s = ParseEtcdUrl(bad, &u);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("etcd://host:port"), std::string::npos) << s.message();
  }
}

TEST(EtcdUrl, Base64RoundTripsEveryLengthAndRefusesWhatIsNot) {
  EXPECT_EQ(Base64Encode(""), "");
  EXPECT_EQ(Base64Encode("f"), "Zg==");
  EXPECT_EQ(Base64Encode("fo"), "Zm8=");
  EXPECT_EQ(Base64Encode("foo"), "Zm9v");
  EXPECT_EQ(Base64Encode("/x/a"), "L3gvYQ==");  // (as etcd's gateway answered it)
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  for (size_t n = 0; n <= all.size(); n += 37) {
    std::string back;
    ASSERT_TRUE(Base64Decode(Base64Encode(all.substr(0, n)), &back)) << n;
    EXPECT_EQ(back, all.substr(0, n));
  }
  std::string out;
  for (const char* bad : {"Zg=", "Z===", "Zg=a", "Zm9v!A==", "=Zm9", "Zg==Zg=="}) {
    EXPECT_FALSE(Base64Decode(bad, &out)) << bad;
  }
}

TEST(ClusterName, LettersDigitsDotsDashesUnderscores) {
  EXPECT_TRUE(CheckClusterName("prefill-0").ok());
  EXPECT_TRUE(CheckClusterName("a.b_C-9").ok());
  EXPECT_TRUE(CheckClusterName(std::string(128, 'x')).ok());
  for (const std::string& bad : {std::string(), std::string(129, 'x'), std::string("a:b"), std::string("a b"),
                                 std::string("a/b"), std::string("ü")}) {
    EXPECT_EQ(CheckClusterName(bad).code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_TRUE(IsClusterName("prefill-0"));
  EXPECT_FALSE(IsClusterName("127.0.0.1:5000"));
}

}  // namespace
}  // namespace xfer::metadata
