#include "control/wire.h"

#include <sys/socket.h>

#include "control/session.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

namespace xfer::wire {
namespace {

Message RoundTrip(const Message& m) {
  std::vector<uint8_t> frame = Encode(m);
  Header h;
  std::string why;
  EXPECT_TRUE(DecodeHeader(frame, &h, &why)) << why;
  EXPECT_EQ(h.length, frame.size() - kHeaderSize);
  Message out;
  EXPECT_TRUE(DecodePayload(h.type, std::span(frame).subspan(kHeaderSize), &out, &why)) << why;
  return out;
}

Hello SampleHello() {
  Hello h;
  h.name = "[::1]:5000";
  h.incarnation = 0x1122334455667788ull;
  h.host_id = "boot-id";
  h.pid = 4242;
  h.features = kFeatureNotifyOutcomes;
  h.backends = {{"local", ""},
                {"cma", std::string("\0\x7f\xff\0\0\0\0\0", 8)},
                {"ucx", std::string("\0\x05worker", 8)}};
  h.regions.push_back({7,
                       RegionInfo{0x1000, 4096, MemType::kHost, -1, "kv-cache", true},
                       {{"shm", "fd and key"}, {"ucx", "packed \x01 rkey"}}});
  h.regions.push_back(
      {9, RegionInfo{0x9000, 1, MemType::kCuda, 3, "", false}, {{"cuda", "cuda \x02 handle"}}});
  h.regions.push_back(
      {11, RegionInfo{0x2000, 64, MemType::kHost, -1, "ro", true, PeerAccess::kReadOnly}, {}});
  return h;
}

TEST(WireCodec, EveryMessageRoundTrips) {
  std::vector<Message> all = {
      SampleHello(),
      RegionAdd{{3, RegionInfo{0xabc, 10, MemType::kHost, -1, "t", false}, {}}},
      RegionRemove{3, 17},
      RegionRemoveAck{3, 17},
      Sync{5},
      SyncAck{5},
      Heartbeat{},
      Goodbye{"bye", 3},
      Notify{8, std::string("blocks 17-42\0free", 17)},
      NotifyAck{8, StatusCode::kOk, ""},
      NotifyAck{9, StatusCode::kResourceExhausted, "queue full"},
      AuthChallenge{std::string(kAuthNonceBytes, '\x07')},
      AuthProof{"10.0.0.1:5555", 42, "10.0.0.2:7000", std::string(kAuthMacBytes, '\xaa')},
      NotifyRingOffer{11, 7, 3, 4096 + 192, 4096},
      NotifyBegin{12, "request 7"},
      NotifyEnded{13, 12, NotifyOutcome::kTimedOut, {0, 1, 5}},
      NotifyEnded{14, 12, NotifyOutcome::kCompleted, {}},
      Digest{15, true, {{0x1000, 4096}, {0x9000, 1}}},
      Digest{16, false, {}},
      DigestAnswer{15, StatusCode::kOk, "", {0x0123456789abcdefull, 7}},
      DigestAnswer{16, StatusCode::kRemoteAccessDenied, "range 0: not inside one region registered here", {}},
      DigestCancel{15},
      StageOpen{17},
      StageOpened{17,
                  StatusCode::kOk,
                  "",
                  {1ull << 63, RegionInfo{0x7000, 4 << 20, MemType::kHost, -1, ""}, {{"ucx", "rkey"}}},
                  1 << 20,
                  4},
      StageOpened{18, StatusCode::kUnsupported, "staging is off here", {}, 0, 0},
      StageMove{19, true, 3, {{0x1000, 4096}, {0x9000, 1}}},
      StageMove{20, false, 0, {}},
      StageMoved{19, StatusCode::kOk, ""},
      StageMoved{20, StatusCode::kRemoteAccessDenied, "range 0: not inside one region registered here"}};
  for (const auto& m : all) EXPECT_EQ(RoundTrip(m), m);
}

TEST(WireCodec, StageMovesRefuseBadFlagsCodesAndTooManyRanges) {
  auto refused = [](const Message& m, MsgType type, size_t byte, uint8_t value, const char* why_part) {
    std::vector<uint8_t> f = Encode(m);
    if (byte != SIZE_MAX) f[kHeaderSize + byte] = value;
    Message out;
    std::string why;
    EXPECT_FALSE(DecodePayload(type, std::span(f).subspan(kHeaderSize), &out, &why));
    EXPECT_NE(why.find(why_part), std::string::npos) << why;
  };
  refused(StageMove{1, true, 0, {}}, MsgType::kStageMove, 8, 2, "write flag");
  refused(StageMove{1, true, 0, std::vector<DigestRange>(kMaxStageRanges + 1)}, MsgType::kStageMove, SIZE_MAX,
          0, "more ranges");
  refused(StageMoved{1, StatusCode::kOk, ""}, MsgType::kStageMoved, 8, 99, "status code");
  refused(StageOpened{1, StatusCode::kOk, "", {}, 0, 0}, MsgType::kStageOpened, 8, 99, "status code");
}

TEST(WireCodec, AuthFramesOfTheWrongLengthAreRefused) {
  for (const Message& m :
       {Message{AuthChallenge{std::string(31, 'n')}}, Message{AuthChallenge{std::string(33, 'n')}},
        Message{AuthProof{"a:1", 1, "", std::string(31, 'm')}}, Message{AuthProof{"a:1", 1, "", ""}},
        Message{AuthProof{std::string(kMaxAuthName + 1, 'a'), 1, "", std::string(32, 'm')}},
        Message{AuthProof{"a:1", 1, std::string(kMaxAuthName + 1, 'd'), std::string(32, 'm')}}}) {
    const std::vector<uint8_t> f = Encode(m);
    Header h;
    std::string why;
    ASSERT_TRUE(DecodeHeader(f, &h, &why)) << why;
    Message out;
    EXPECT_FALSE(DecodePayload(h.type, std::span(f).subspan(kHeaderSize), &out, &why));
  }
}

TEST(WireCodec, NotificationsUpToTheCapDecodeAndBadOnesAreRefused) {
  EXPECT_EQ(RoundTrip(Notify{1, std::string(kMaxNotify, 'n')}),
            (Message{Notify{1, std::string(kMaxNotify, 'n')}}));
  std::string why;
  Message out;
  auto payload = [](const Message& m) {
    std::vector<uint8_t> f = Encode(m);
    return std::vector<uint8_t>(f.begin() + kHeaderSize, f.end());
  };
  std::vector<uint8_t> big = payload(Notify{1, std::string(kMaxNotify + 1, 'n')});
  EXPECT_FALSE(DecodePayload(MsgType::kNotify, big, &out, &why));
  EXPECT_NE(why.find("cap"), std::string::npos) << why;
  std::vector<uint8_t> ack = payload(NotifyAck{2, StatusCode::kOk, ""});
  ack[8] = 99;  // an unknown status code
  EXPECT_FALSE(DecodePayload(MsgType::kNotifyAck, ack, &out, &why));
  EXPECT_NE(why.find("status code"), std::string::npos) << why;
  std::vector<uint8_t> cut = payload(Notify{3, "abc"});
  cut.pop_back();
  EXPECT_FALSE(DecodePayload(MsgType::kNotify, cut, &out, &why));
}

// A request's end: completed, failed, timed out or canceled (an initiator lost is the target's
// own finding), and the landed descriptors strictly ascending (none when completed).
TEST(WireCodec, NotifyEndedRefusesOtherOutcomesAndLandedOutOfOrder) {
  auto refused = [](const NotifyEnded& m, const char* why_part) {
    const std::vector<uint8_t> f = Encode(m);
    Message out;
    std::string why;
    EXPECT_FALSE(DecodePayload(MsgType::kNotifyEnded, std::span(f).subspan(kHeaderSize), &out, &why));
    EXPECT_NE(why.find(why_part), std::string::npos) << why;
  };
  refused({1, 0, NotifyOutcome::kInitiatorLost, {}}, "not completed");
  refused({1, 0, static_cast<NotifyOutcome>(77), {}}, "not completed");
  refused({1, 0, NotifyOutcome::kCompleted, {0}}, "landed list");
  refused({1, 0, NotifyOutcome::kFailed, {3, 2}}, "out of order");
  refused({1, 0, NotifyOutcome::kFailed, {2, 2}}, "out of order");
  std::vector<uint8_t> f = Encode(NotifyEnded{1, 0, NotifyOutcome::kFailed, {0, 1}});
  f[kHeaderSize + 17] = 0xff;  // a landed count the frame cannot hold
  Message out;
  std::string why;
  EXPECT_FALSE(DecodePayload(MsgType::kNotifyEnded, std::span(f).subspan(kHeaderSize), &out, &why));
  EXPECT_NE(why.find("cannot fit"), std::string::npos) << why;
}

// A Digest's landed flag is 0 or 1 and its ranges fit the frame; a refusal carries no checksums.
TEST(WireCodec, DigestFramesOutOfShapeAreRefused) {
  auto refused = [](const Message& m, size_t poke, uint8_t value, const char* why_part) {
    std::vector<uint8_t> f = Encode(m);
    if (poke != 0) f[kHeaderSize + poke] = value;
    Header h;
    std::string why;
    ASSERT_TRUE(DecodeHeader(f, &h, &why)) << why;
    Message out;
    EXPECT_FALSE(DecodePayload(h.type, std::span(f).subspan(kHeaderSize), &out, &why));
    EXPECT_NE(why.find(why_part), std::string::npos) << why;
  };
  refused(Digest{1, true, {{1, 1}}}, 8, 2, "landed flag");
  refused(Digest{1, true, {{1, 1}}}, 12, 0xff, "cannot fit");  // (the count's top byte)
  refused(DigestAnswer{1, StatusCode::kTimeout, "late", {5}}, 0, 0, "checksums in a refusal");
  refused(DigestAnswer{1, StatusCode::kOk, "", {5}}, 8, 99, "status code");
}

TEST(WireCodec, RejectsBadHeaders) {
  std::vector<uint8_t> frame = Encode(Heartbeat{});
  Header h;
  std::string why;
  EXPECT_FALSE(DecodeHeader(std::span(frame).first(5), &h, &why));
  auto bad = frame;
  bad[0] ^= 0xff;
  EXPECT_FALSE(DecodeHeader(bad, &h, &why));
  EXPECT_NE(why.find("magic"), std::string::npos);
  bad = frame;
  bad[4] = static_cast<uint8_t>(kVersion + 1);  // version
  EXPECT_FALSE(DecodeHeader(bad, &h, &why));
  EXPECT_NE(why.find("version"), std::string::npos);
  bad = frame;
  bad[6] = 200;  // type
  EXPECT_FALSE(DecodeHeader(bad, &h, &why));
  bad = frame;
  uint32_t huge = kMaxPayload + 1;
  std::memcpy(bad.data() + 8, &huge, 4);
  EXPECT_FALSE(DecodeHeader(bad, &h, &why));
  EXPECT_NE(why.find("cap"), std::string::npos);
}

TEST(WireCodec, RejectsEveryTruncationAndTrailingBytes) {
  std::vector<uint8_t> frame = Encode(SampleHello());
  auto payload = std::span(frame).subspan(kHeaderSize);
  Message out;
  std::string why;
  for (size_t n = 0; n < payload.size(); ++n) {
    EXPECT_FALSE(DecodePayload(MsgType::kHello, payload.first(n), &out, &why)) << n;
  }
  std::vector<uint8_t> longer(payload.begin(), payload.end());
  longer.push_back(0);
  EXPECT_FALSE(DecodePayload(MsgType::kHello, longer, &out, &why));
  EXPECT_NE(why.find("trailing"), std::string::npos);
}

TEST(WireCodec, HugeCountsAreRefusedBeforeAllocation) {
  // A hello whose region count claims four billion entries in a few bytes.
  Hello h;
  h.name = "a:1";
  h.incarnation = 1;
  std::vector<uint8_t> frame = Encode(h);
  std::vector<uint8_t> payload(frame.begin() + kHeaderSize, frame.end());
  uint32_t lots = 0xffffffffu;
  std::memcpy(payload.data() + payload.size() - 4, &lots, 4);  // region count is last
  Message out;
  std::string why;
  EXPECT_FALSE(DecodePayload(MsgType::kHello, payload, &out, &why));
  EXPECT_NE(why.find("cannot fit"), std::string::npos) << why;
  // And a string length past the end.
  std::vector<uint8_t> g = Encode(Goodbye{"x"});
  std::vector<uint8_t> gp(g.begin() + kHeaderSize, g.end());
  uint32_t len = 1000;
  std::memcpy(gp.data(), &len, 4);
  EXPECT_FALSE(DecodePayload(MsgType::kGoodbye, gp, &out, &why));
}

// A hello's name and host id are kept per peer (its session's key, the metrics') and logged:
// longer than kMaxAuthName, the hello is refused (the default cap on strings is 64 KiB).
TEST(WireCodec, AHellosNameAndHostIdAreShort) {
  Message out;
  std::string why;
  for (int field = 0; field < 2; ++field) {
    Hello h = SampleHello();
    (field == 0 ? h.name : h.host_id) = std::string(kMaxAuthName, 'n');
    std::vector<uint8_t> frame = Encode(h);
    EXPECT_TRUE(DecodePayload(MsgType::kHello, std::span(frame).subspan(kHeaderSize), &out, &why)) << why;
    (field == 0 ? h.name : h.host_id) += 'n';
    frame = Encode(h);
    EXPECT_FALSE(DecodePayload(MsgType::kHello, std::span(frame).subspan(kHeaderSize), &out, &why)) << field;
  }
}

TEST(WireCodec, RefusesUnknownRegionFlagsAndTooManyBackends) {
  Hello h = SampleHello();
  for (uint32_t i = 0; i <= kMaxBlobs; ++i) h.backends.push_back({"b" + std::to_string(i), ""});
  std::vector<uint8_t> frame = Encode(h);
  Message out;
  std::string why;
  EXPECT_FALSE(DecodePayload(MsgType::kHello, std::span(frame).subspan(kHeaderSize), &out, &why));
  EXPECT_NE(why.find("cap"), std::string::npos) << why;
  // A region record: id, addr, len (u64 each), type u8, device i32, tag "t", then flags u8.
  frame = Encode(RegionAdd{{3, RegionInfo{0xabc, 10, MemType::kHost, -1, "t", false}, {}}});
  std::vector<uint8_t> payload(frame.begin() + kHeaderSize, frame.end());
  payload[8 + 8 + 8 + 1 + 4 + 4 + 1] = 4;
  EXPECT_FALSE(DecodePayload(MsgType::kRegionAdd, payload, &out, &why));
  EXPECT_NE(why.find("flags"), std::string::npos) << why;
}

TEST(WireCodec, ADecodedFrameTakesAtMostAFewTimesItsSizeInMemory) {
  // Tiny region records with the most (empty) blobs: about 7 bytes of memory per byte of frame.
  Hello h = SampleHello();
  h.regions.clear();
  WireRegion tiny{0, RegionInfo{0x1000, 1, MemType::kHost, -1, "", false}, {}};
  tiny.blobs.assign(kMaxBlobs, transport::Blob{"", ""});
  for (uint64_t i = 1; i <= 10000; ++i) {
    tiny.id = i;
    h.regions.push_back(tiny);
  }
  std::vector<uint8_t> frame = Encode(h);
  Message out;
  std::string why;
  EXPECT_FALSE(DecodePayload(MsgType::kHello, std::span(frame).subspan(kHeaderSize), &out, &why));
  EXPECT_NE(why.find("memory"), std::string::npos) << why;
  // 100,000 regions as engines advertise them (a UCX remote key and a memfd each) decode.
  h.regions.clear();
  for (uint64_t i = 1; i <= 100000; ++i) {
    h.regions.push_back({i,
                         RegionInfo{i << 20, 1 << 20, MemType::kHost, -1, "", true},
                         {{"ucx", std::string(60, 'k')}, {"shm", std::string(12, 's')}}});
  }
  frame = Encode(h);
  ASSERT_TRUE(DecodePayload(MsgType::kHello, std::span(frame).subspan(kHeaderSize), &out, &why)) << why;
  EXPECT_EQ(std::get<Hello>(out), h);
}

// An acknowledgment of a round trip never sent acknowledges nothing: it would otherwise answer
// our next Syncs and region removals before they were sent.
TEST(SessionAcks, OnlyRoundTripsSentCanBeAcknowledged) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  net::Fd theirs(fds[1]);
  control::Session s(net::Fd(fds[0]), true, "test");
  const auto soon = [] { return std::chrono::steady_clock::now() + std::chrono::milliseconds(20); };
  EXPECT_FALSE(s.Acked(1000));
  uint64_t seq = 0;
  ASSERT_TRUE(s.SendNumbered([](uint64_t n) { return Sync{n}; }, &seq).ok());
  EXPECT_EQ(seq, 1u);
  EXPECT_FALSE(s.WaitAcked(1, soon())) << "an early acknowledgment of 1000 answered round trip 1";
  EXPECT_FALSE(s.Acked(2));
  EXPECT_TRUE(s.Acked(1));
  EXPECT_TRUE(s.WaitAcked(1, soon()));
}

TEST(WireCodec, RandomBytesNeverCrash) {
  std::mt19937_64 rng(42);
  Message out;
  std::string why;
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> b(rng() % 96);
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    auto type = static_cast<MsgType>(1 + rng() % 8);
    accepted += DecodePayload(type, b, &out, &why);
  }
  // Mutations of a valid frame: flip one byte at a time.
  std::vector<uint8_t> frame = Encode(SampleHello());
  for (size_t i = kHeaderSize; i < frame.size(); ++i) {
    auto m = frame;
    m[i] ^= static_cast<uint8_t>(1 + rng() % 255);
    accepted += DecodePayload(MsgType::kHello, std::span(m).subspan(kHeaderSize), &out, &why);
  }
  SUCCEED() << accepted << " random payloads happened to decode";
}

}  // namespace
}  // namespace xfer::wire
