#include "core/datapath/share_rule.h"

#include <gtest/gtest.h>

#include <chrono>

namespace xfer {
namespace {
using std::chrono::nanoseconds;
constexpr size_t k16K = 16 << 10, k64K = 64 << 10;

// The modes n copies in a row run in, and how many of them are timed, from tick first on.
struct Modes {
  int share = 0, alone = 0, timed = 0;
};
Modes Count(const ShareRule& rule, size_t len, uint32_t first, int n) {
  Modes r;
  for (int i = 0; i < n; ++i) {
    const ShareRule::Choice c = rule.Choose(len, first + static_cast<uint32_t>(i));
    (c.mode == ShareRule::kShare ? r.share : r.alone)++;
    r.timed += c.timed;
  }
  return r;
}

TEST(ShareRule, TriesSharingThenCopyingAloneFirst) {
  ShareRule rule;
  EXPECT_EQ(rule.Preferred(k16K), ShareRule::kShare) << "nothing measured: share, as before";
  rule.Record(k16K, ShareRule::kShare, nanoseconds(400));
  EXPECT_EQ(rule.Preferred(k16K), ShareRule::kAlone) << "alone not measured yet";
  rule.Record(k16K, ShareRule::kAlone, nanoseconds(300));
  EXPECT_EQ(rule.Preferred(k16K), ShareRule::kAlone);
  EXPECT_EQ(rule.Preferred(k64K), ShareRule::kShare) << "each size class learns for itself";
}

TEST(ShareRule, UsesTheCheaperModeAndTriesTheOtherInShortRuns) {
  ShareRule rule;
  rule.Record(k16K, ShareRule::kShare, nanoseconds(200));
  rule.Record(k16K, ShareRule::kAlone, nanoseconds(400));
  ASSERT_EQ(rule.Backoff(k16K), 0u);
  const int periods = 10;
  Modes r = Count(rule, k16K, 1, ShareRule::kPeriod * periods);
  EXPECT_EQ(r.alone, 4 * periods) << "4 copies a period in the other mode";
  EXPECT_EQ(r.share, (ShareRule::kPeriod - 4) * periods);
  EXPECT_EQ(r.timed, (7 + 2) * periods) << "7 in the preferred mode, the other's trial's last 2";
  // The copies in the other mode come in a row, and the first of them are not timed.
  for (uint32_t t = 0; t < 4; ++t) {
    const ShareRule::Choice c = rule.Choose(k16K, ShareRule::kPeriod * 3 + t);
    EXPECT_EQ(c.mode, ShareRule::kAlone);
    EXPECT_EQ(c.timed, t >= 2);
    EXPECT_EQ(c.ends_trial, t == 3);
  }
}

TEST(ShareRule, AModeThatKeepsLosingIsTriedLessOften) {
  ShareRule rule;
  rule.Record(k16K, ShareRule::kShare, nanoseconds(200));
  rule.Record(k16K, ShareRule::kAlone, nanoseconds(400));
  for (uint32_t i = 1; i <= ShareRule::kMaxBackoff + 2; ++i) {
    rule.Record(k16K, ShareRule::kAlone, nanoseconds(400));  // a trial alone loses again:
    EXPECT_EQ(rule.Backoff(k16K), std::min(i - 1, ShareRule::kMaxBackoff)) << "not counted before its end";
    rule.Record(k16K, ShareRule::kAlone, nanoseconds(400), true);  // its last copy
    EXPECT_EQ(rule.Backoff(k16K), std::min(i, ShareRule::kMaxBackoff));
  }
  const uint32_t every = 1u << ShareRule::kMaxBackoff;
  Modes r = Count(rule, k16K, 0, ShareRule::kPeriod * every * 2);
  EXPECT_EQ(r.alone, 2 * 4) << "one trial every " << every << " periods";
  // Once the other mode wins, trials start over at every period.
  while (rule.Preferred(k16K) == ShareRule::kShare) rule.Record(k16K, ShareRule::kShare, nanoseconds(800));
  EXPECT_EQ(rule.Backoff(k16K), 0u);
  rule.Record(k16K, ShareRule::kAlone, nanoseconds(400));  // the winner's own samples leave it
  EXPECT_EQ(rule.Backoff(k16K), 0u);
}

TEST(ShareRule, OneSlowCopyCountsForAtMostTwiceTheAverage) {
  ShareRule rule;
  rule.Record(k16K, ShareRule::kShare, nanoseconds(200));
  rule.Record(k16K, ShareRule::kAlone, nanoseconds(300));
  rule.Record(k16K, ShareRule::kShare, std::chrono::milliseconds(5));  // a preempted stream
  EXPECT_EQ(rule.Preferred(k16K), ShareRule::kShare);
}

TEST(ShareRule, FollowsAChangeWithinAFewSamples) {
  ShareRule rule;
  rule.Record(k16K, ShareRule::kShare, nanoseconds(200));
  rule.Record(k16K, ShareRule::kAlone, nanoseconds(400));
  // The other core gets taken: sharing now takes 3x as long as before.
  int samples = 0;
  while (rule.Preferred(k16K) == ShareRule::kShare) {
    rule.Record(k16K, ShareRule::kShare, nanoseconds(600));
    ASSERT_LT(++samples, 20) << "still sharing after 20 slow samples";
  }
  EXPECT_GE(samples, 2) << "one slow sample should not flip it";
  // And back: the alone average does not move while it wins, so sharing is tried again only by
  // its exploration samples; they bring it back once they are fast again.
  samples = 0;
  while (rule.Preferred(k16K) == ShareRule::kAlone) {
    rule.Record(k16K, ShareRule::kShare, nanoseconds(150), samples % 2 == 1);
    ASSERT_LT(++samples, 40);
  }
}

TEST(ShareRule, AModeThatCannotBeMeasuredIsTriedAgainInTime) {
  ShareRule rule;
  rule.Record(k16K, ShareRule::kShare, nanoseconds(800));
  rule.Record(k16K, ShareRule::kAlone, nanoseconds(400));
  int tries = 0;
  while (rule.Preferred(k16K) == ShareRule::kAlone) {
    rule.Unmeasured(k16K, ShareRule::kShare);  // no stream spun to take a half
    ASSERT_LT(++tries, 200) << "sharing never tried again";
  }
  EXPECT_GE(tries, 20) << "given up on too soon";
  // Once in favour, a copy that found no stream leaves its average as measured.
  const uint64_t share = rule.AverageCost(k16K, ShareRule::kShare);
  for (int i = 0; i < 1000; ++i) rule.Unmeasured(k16K, ShareRule::kShare);
  EXPECT_EQ(rule.AverageCost(k16K, ShareRule::kShare), share);
}

TEST(ShareRule, CostIsPerByte) {
  ShareRule rule;
  rule.Record(k16K, ShareRule::kAlone, nanoseconds(1024));  // 1/16 ns a byte
  EXPECT_EQ(rule.AverageCost(k16K, ShareRule::kAlone), 4096u);
  rule.Record(size_t{8} << 20, ShareRule::kAlone, nanoseconds(1));  // rounds up to 1, not 0 (unmeasured)
  EXPECT_EQ(rule.AverageCost(size_t{8} << 20, ShareRule::kAlone), 1u);
}

}  // namespace
}  // namespace xfer
