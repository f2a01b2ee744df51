// The options table (src/api/option_table.cc, util/option_rows.h, each backend's Options):
// every option by name, set from text and shown back, its range refused past either end, and
// docs/options.md listing exactly the options there are.
#include <algorithm>
#include <fstream>
#include <regex>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "api/option_table.h"
#include "util/option_rows.h"
#include "xfer/options.h"

#ifndef XFER_SOURCE_DIR
#error "XFER_SOURCE_DIR must be defined by the build"
#endif

namespace xfer {
namespace {

TEST(OptionTable, EveryOptionIsNamedOnceAndShowsWhatParsesBack) {
  std::set<std::string> keys;
  for (const OptionInfo& o : DescribeOptions()) {
    EXPECT_TRUE(keys.insert(o.key).second) << o.key << " twice";
    EXPECT_FALSE(o.doc.empty()) << o.key;
    if (o.kind == OptionKind::kSecret) continue;
    EngineOptions set;
    ASSERT_TRUE(SetOption(&set, o.key, o.value).ok()) << o.key << " = '" << o.value << "'";
    for (const OptionInfo& again : DescribeOptions(set)) {
      if (again.key == o.key) {
        EXPECT_EQ(again.value, o.value) << o.key;
      }
    }
  }
  // The engine's own and every backend's group, each field of EngineOptions.
  for (const char* k : {"streams", "heartbeat_timeout", "spin", "staging", "notify.ring_bytes",
                        "metrics_listen", "tcp.links", "tcp.nics", "ucx.mode", "ucx.endpoints",
                        "shm.streaming_copy_bytes", "cuda.pin_host_memory", "secret"}) {
    EXPECT_TRUE(keys.count(k)) << k;
  }
}

TEST(OptionTable, TextOfEachKindSetsTheField) {
  EngineOptions o;
  ASSERT_TRUE(SetOption(&o, "streams", "8").ok());
  EXPECT_EQ(o.streams, 8);
  ASSERT_TRUE(SetOption(&o, "staging_buffer_bytes", "8M").ok());
  EXPECT_EQ(o.staging_buffer_bytes, 8u << 20);
  ASSERT_TRUE(SetOption(&o, "notify.queue_bytes", "2 GiB").ok());
  EXPECT_EQ(o.notify.queue_bytes, 2ull << 30);
  ASSERT_TRUE(SetOption(&o, "heartbeat_timeout", "2.5s").ok());
  EXPECT_EQ(o.heartbeat_timeout, std::chrono::milliseconds(2500));
  ASSERT_TRUE(SetOption(&o, "heartbeat_interval", "250").ok());  // (a bare number: the field's ms)
  EXPECT_EQ(o.heartbeat_interval, std::chrono::milliseconds(250));
  ASSERT_TRUE(SetOption(&o, "spin", "0.0001 s").ok());
  EXPECT_EQ(o.spin, std::chrono::microseconds(100));
  ASSERT_TRUE(SetOption(&o, "tcp.least_loaded", "on").ok());
  EXPECT_TRUE(o.tcp.least_loaded);
  ASSERT_TRUE(SetOption(&o, "tcp.nics", "eth1,,eth2").ok());
  EXPECT_EQ(o.tcp.nics, (std::vector<std::string>{"eth1", "eth2"}));
  ASSERT_TRUE(SetOption(&o, "ucx.mode", "on").ok());
  EXPECT_EQ(o.ucx.mode, UcxMode::kOn);
  ASSERT_TRUE(SetOption(&o, "staging", "always").ok());
  EXPECT_EQ(o.staging, Staging::kAlways);
  ASSERT_TRUE(SetOption(&o, "secret", std::string("\0binary secret of 20 B", 21)).ok());
  EXPECT_EQ(o.secret.size(), 21u);
  // Times in any form a binding may print (an exponent, a capital unit), to the nearest unit,
  // and at least one unit when above 0; whole numbers exactly, past what a double holds.
  ASSERT_TRUE(SetOption(&o, "spin", "5e-05 s").ok());
  EXPECT_EQ(o.spin, std::chrono::microseconds(50));
  ASSERT_TRUE(SetOption(&o, "spin", "0.000050000 s").ok());
  EXPECT_EQ(o.spin, std::chrono::microseconds(50));
  ASSERT_TRUE(SetOption(&o, "heartbeat_timeout", "3S").ok());
  EXPECT_EQ(o.heartbeat_timeout, std::chrono::milliseconds(3000));
  ASSERT_TRUE(SetOption(&o, "auto_connect_timeout", "100us").ok());
  EXPECT_EQ(o.auto_connect_timeout, std::chrono::milliseconds(1));
  ASSERT_TRUE(SetOption(&o, "batch_bytes", "9007199254740993").ok());
  EXPECT_EQ(o.batch_bytes, 9007199254740993ull);
  ASSERT_TRUE(SetOption(&o, "slice_bytes", "1.5K").ok());
  EXPECT_EQ(o.slice_bytes, 1536u);
}

TEST(OptionTable, WrongTextAndUnknownKeysNameTheOption) {
  EngineOptions o;
  const Status unknown = SetOption(&o, "tcp.linx", "4");
  EXPECT_EQ(unknown.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.message().find("tcp.linx"), std::string::npos) << unknown.message();
  EXPECT_NE(unknown.message().find("tcp.links"), std::string::npos) << "the known names are listed";
  for (auto [key, text] : {std::pair{"streams", "four"},
                           {"streams", "4.5"},
                           {"max_sessions", "-1"},
                           {"staging_buffer_bytes", "4 parsecs"},
                           {"heartbeat_timeout", "3 fortnights"},
                           {"auto_connect", "maybe"},
                           {"ucx.mode", "sometimes"},
                           {"streams", "99999999999"}}) {
    const Status s = SetOption(&o, key, text);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << key << " = " << text;
    EXPECT_NE(s.message().find(key), std::string::npos) << s.message();
  }
  EXPECT_EQ(o.streams, EngineOptions().streams) << "a refused text leaves the field as it was";
}

// Each number's range, from the rows: its ends pass, one past either end is refused naming it.
TEST(OptionTable, InitializeRefusesEachNumberJustPastItsRange) {
  for (const options::Row& row : OptionRows()) {
    if (row.number == nullptr || row.lo > row.hi) continue;
    SCOPED_TRACE(std::string(row.key));
    for (int64_t v : {row.lo - 1, row.hi == std::numeric_limits<int64_t>::max() ? row.lo : row.hi + 1}) {
      if (v == row.lo || (row.zero_ok && v == 0) || v < 0) continue;
      EngineOptions o;
      if (!row.set(o, std::to_string(v) + (row.kind == OptionKind::kDuration ? std::string(row.unit) : ""))
               .ok()) {
        continue;  // (past what the field's type holds: refused already)
      }
      const Status s = CheckOptions(o);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << v;
      EXPECT_NE(s.message().find(row.key), std::string::npos) << s.message();
    }
    if (row.hi == std::numeric_limits<int64_t>::max()) continue;  // (no upper end)
    EngineOptions ends;
    ASSERT_TRUE(row.set(ends, options::ShowNumber(row, row.hi)).ok());
    EXPECT_TRUE(CheckOptions(ends).ok()) << CheckOptions(ends).ToString();
  }
  EXPECT_TRUE(CheckOptions(EngineOptions()).ok()) << "the defaults are in range";
}

// A host id goes in every hello, and peers refuse one longer than wire::kMaxAuthName: refused
// at Initialize, naming the option.
TEST(OptionTable, AHostIdPeersWouldRefuseIsRefused) {
  EngineOptions o;
  o.host_id = std::string(1024, 'h');
  EXPECT_TRUE(CheckOptions(o).ok()) << CheckOptions(o).ToString();
  o.host_id += 'h';
  const Status s = CheckOptions(o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("host_id"), std::string::npos) << s.message();
}

// docs/options.md has a row for each option (`key` first) in its tables of fields (those whose
// header starts "| field |"), and no row there for one that is not an option.
TEST(OptionTable, DocsListExactlyTheOptions) {
  std::ifstream in(std::string(XFER_SOURCE_DIR) + "/docs/options.md");
  ASSERT_TRUE(in) << "docs/options.md";
  std::set<std::string> documented;
  bool in_fields = false;
  const std::regex row(R"(^\| `([a-z_.]+)` \|)");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("## Allocation options", 0) == 0) break;  // (AllocOptions: not EngineOptions)
    if (line.rfind("| field |", 0) == 0) in_fields = true;
    if (line.empty() || line[0] != '|') in_fields = false;
    std::smatch m;
    if (in_fields && std::regex_search(line, m, row)) documented.insert(m[1]);
  }
  std::set<std::string> keys;
  for (const OptionInfo& o : DescribeOptions()) keys.insert(o.key);
  for (const auto& k : keys) EXPECT_TRUE(documented.count(k)) << k << " is not in docs/options.md";
  for (const auto& d : documented) EXPECT_TRUE(keys.count(d)) << d << " is in docs/options.md, not an option";
}

}  // namespace
}  // namespace xfer
