#include "core/notify/notify_ring.h"
#include "core/notify/ring_record.h"
#include "util/futex.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <thread>

namespace xfer {
namespace {

constexpr uint64_t kCapacity = 4096;
constexpr uint64_t kBytes = NotifyRing::BytesFor(kCapacity);

// Exactly kBytes, 64-byte aligned and zeroed: ASan reports any access outside it.
struct RingMemory {
  RingMemory() : p(static_cast<uint8_t*>(std::aligned_alloc(64, kBytes))) { std::memset(p, 0, kBytes); }
  ~RingMemory() { std::free(p); }
  uint8_t* p;
};

void AttachBoth(uint8_t* memory, NotifyRing* writer, NotifyRing* reader) {
  ASSERT_TRUE(NotifyRing::Format(memory, kBytes).ok());
  ASSERT_TRUE(NotifyRing::Attach(memory, kBytes, writer).ok());
  ASSERT_TRUE(NotifyRing::Attach(memory, kBytes, reader).ok());
}

std::string Message(uint64_t n, size_t len) {
  std::string m(len, '\0');
  for (size_t i = 0; i < len; ++i) m[i] = static_cast<char>('a' + (n + i) % 26);
  return m;
}

void Put64(uint8_t* at, uint64_t v) { std::memcpy(at, &v, 8); }
uint8_t* Data(uint8_t* memory) { return memory + NotifyRing::kHeaderBytes; }
constexpr uint64_t kHeadAt = 64, kTailAt = 128;

TEST(NotifyRing, EveryMessageComesOutOnceInOrderAcrossManyWraps) {
  RingMemory mem;
  NotifyRing w, r;
  AttachBoth(mem.p, &w, &r);
  std::mt19937_64 rng(7);
  uint64_t written = 0, read = 0;
  std::vector<std::string> got;
  while (read < 20000) {
    // Write until full, with sizes from empty to the largest, then read some of it back.
    for (int k = 0; k < 50; ++k) {
      const size_t len = rng() % 8 == 0 ? NotifyRing::MaxMessage(kCapacity) : rng() % 300;
      const Status s = w.Write(Message(written, len));
      if (s.code() == StatusCode::kResourceExhausted) break;
      ASSERT_TRUE(s.ok()) << s.ToString();
      ++written;
    }
    got.clear();
    ASSERT_TRUE(r.ReadAll(NotifyRing::MaxMessage(kCapacity), &got).ok());
    for (const std::string& m : got) {
      ASSERT_EQ(m, Message(read, m.size())) << "message " << read;
      ++read;
    }
    ASSERT_EQ(read, written);
  }
  EXPECT_FALSE(r.HasMessages());
}

TEST(NotifyRing, AFullRingRefusesUntilTheReaderTakesAndLosesNothing) {
  RingMemory mem;
  NotifyRing w, r;
  AttachBoth(mem.p, &w, &r);
  int accepted = 0;
  Status s;
  while ((s = w.Write(Message(accepted, 100))).ok()) ++accepted;
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message().find("full"), std::string::npos) << s.ToString();
  EXPECT_EQ(accepted, static_cast<int>(kCapacity / 112));  // 8 + 104 bytes a record
  std::vector<std::string> got;
  ASSERT_TRUE(r.ReadAll(4096, &got).ok());
  ASSERT_EQ(got.size(), static_cast<size_t>(accepted));
  for (int i = 0; i < accepted; ++i) EXPECT_EQ(got[size_t(i)], Message(uint64_t(i), 100));
  EXPECT_TRUE(w.Write("again").ok());
}

TEST(NotifyRing, BadShapesAndSizesAreRefused) {
  RingMemory mem;
  NotifyRing ring;
  EXPECT_EQ(NotifyRing::Format(mem.p + 8, kBytes - 8).code(), StatusCode::kInvalidArgument);  // unaligned
  EXPECT_EQ(NotifyRing::Format(mem.p, kBytes - 64).code(), StatusCode::kInvalidArgument);     // not 2^n
  EXPECT_EQ(NotifyRing::Format(nullptr, kBytes).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(NotifyRing::Attach(mem.p, kBytes, &ring).code(), StatusCode::kInvalidArgument);  // no ring
  ASSERT_TRUE(NotifyRing::Format(mem.p, kBytes).ok());
  // A ring of another size is not this one (the capacity is part of the layout).
  const Status other = NotifyRing::Attach(mem.p, NotifyRing::BytesFor(kCapacity / 2), &ring);
  EXPECT_EQ(other.code(), StatusCode::kInvalidArgument) << other.ToString();
  ASSERT_TRUE(NotifyRing::Attach(mem.p, kBytes, &ring).ok());
  EXPECT_EQ(ring.Write(std::string(NotifyRing::MaxMessage(kCapacity) + 1, 'x')).code(),
            StatusCode::kInvalidArgument);
  NotifyRing unattached;
  std::vector<std::string> got;
  EXPECT_EQ(unattached.Write("x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(unattached.ReadAll(100, &got).code(), StatusCode::kInvalidArgument);
}

// The writer is another process the reader does not trust: each way it can lie ends the ring
// with kConnectionLost, for good, and nothing outside the memory is read. Each lie follows one
// honest record of 16 bytes, which the reader took.
TEST(NotifyRing, AWriterThatLiesEndsTheRingAndNothingIsReadOutsideIt) {
  struct Lie {
    const char* what;
    void (*apply)(uint8_t* memory);
  };
  const Lie lies[] = {
      {"head far ahead", [](uint8_t* m) { Put64(m + kHeadAt, 16 + 2 * kCapacity); }},
      {"head behind the tail", [](uint8_t* m) { Put64(m + kHeadAt, 8); }},
      {"head not a multiple of 8", [](uint8_t* m) { Put64(m + kHeadAt, 16 + 13); }},
      {"length past the head",
       [](uint8_t* m) {
         Put64(Data(m) + 16, 64);
         Put64(m + kHeadAt, 32);
       }},
      {"length past the limit",
       [](uint8_t* m) {
         Put64(Data(m) + 16, 1000);
         Put64(m + kHeadAt, 16 + 1008);
       }},
      {"length near 2^64",
       [](uint8_t* m) {
         Put64(Data(m) + 16, ~0ull - 3);
         Put64(m + kHeadAt, 32);
       }},
      {"pad past the head",
       [](uint8_t* m) {
         Put64(Data(m) + 16, ~0ull);
         Put64(m + kHeadAt, 32);
       }},
  };
  for (const Lie& lie : lies) {
    SCOPED_TRACE(lie.what);
    RingMemory mem;
    NotifyRing w, r;
    AttachBoth(mem.p, &w, &r);
    ASSERT_TRUE(w.Write("12345678").ok());
    std::vector<std::string> got;
    ASSERT_TRUE(r.ReadAll(100, &got).ok());
    ASSERT_EQ(got.size(), 1u);
    lie.apply(mem.p);
    got.clear();
    const Status s = r.ReadAll(100, &got);
    EXPECT_EQ(s.code(), StatusCode::kConnectionLost) << s.ToString();
    EXPECT_NE(s.message().find("given up"), std::string::npos) << s.ToString();
    EXPECT_TRUE(got.empty());
    EXPECT_TRUE(r.broken());
    EXPECT_FALSE(r.HasMessages());
    EXPECT_EQ(r.ReadAll(100, &got).code(), StatusCode::kConnectionLost);  // for good
  }
}

TEST(NotifyRing, ARecordRunningOffTheEndOfTheRingEndsIt) {
  RingMemory mem;
  ASSERT_TRUE(NotifyRing::Format(mem.p, kBytes).ok());
  // Both indices at the ring's last word (consistent), then a 100-byte record claimed there.
  Put64(mem.p + kHeadAt, kCapacity - 8);
  Put64(mem.p + kTailAt, kCapacity - 8);
  NotifyRing r;
  ASSERT_TRUE(NotifyRing::Attach(mem.p, kBytes, &r).ok());
  Put64(Data(mem.p) + kCapacity - 8, 100);
  Put64(mem.p + kHeadAt, kCapacity - 8 + 8 + 104);
  std::vector<std::string> got;
  const Status s = r.ReadAll(200, &got);
  EXPECT_EQ(s.code(), StatusCode::kConnectionLost) << s.ToString();
  EXPECT_TRUE(got.empty());
}

TEST(NotifyRing, AReaderThatLiesEndsTheRingForTheWriter) {
  for (uint64_t tail : {uint64_t{64}, uint64_t{16} - 2 * kCapacity}) {
    RingMemory mem;
    NotifyRing w, r;
    AttachBoth(mem.p, &w, &r);
    ASSERT_TRUE(w.Write("12345678").ok());
    Put64(mem.p + kTailAt, tail);  // ahead of the head, or more than the ring behind it
    const Status s = w.Write("next");
    EXPECT_EQ(s.code(), StatusCode::kConnectionLost) << s.ToString();
    EXPECT_EQ(w.Write("next").code(), StatusCode::kConnectionLost);
  }
}

// Another thread scribbles random words over the whole ring while the reader reads: whatever it
// finds, the reader stays inside the memory and answers ok or kConnectionLost (ASan watches).
TEST(NotifyRing, ScribbledMemoryNeverTakesTheReaderOutside) {
  for (int round = 0; round < 200; ++round) {
    RingMemory mem;
    NotifyRing w, r;
    AttachBoth(mem.p, &w, &r);
    std::mt19937_64 rng(static_cast<uint64_t>(round));
    for (int i = 0; i < 20; ++i) (void)w.Write(Message(uint64_t(i), rng() % 200));
    for (int k = 0; k < 4; ++k) {
      const uint64_t at = (rng() % (kBytes / 8)) * 8;
      if (at < 64) continue;  // (the magic and capacity are read once, at Attach)
      Put64(mem.p + at, rng() % 3 == 0 ? rng() : rng() % (3 * kCapacity));
    }
    std::vector<std::string> got;
    const Status s = r.ReadAll(300, &got);
    EXPECT_TRUE(s.ok() || s.code() == StatusCode::kConnectionLost) << s.ToString();
    for (const std::string& m : got) EXPECT_LE(m.size(), 300u);
    const Status again = w.Write("after");
    EXPECT_TRUE(again.ok() || again.code() == StatusCode::kConnectionLost ||
                again.code() == StatusCode::kResourceExhausted)
        << again.ToString();
  }
}

// Two processes over MAP_SHARED memory: the child writes 100,000 numbered messages as fast as
// the ring lets it, the parent sleeps whenever the ring is empty and finds every one, in order.
// Every sleep ends by a wake-up: a lost one would sleep out its 5 s.
TEST(NotifyRing, TwoProcessesThroughSharedMemoryAndNoWakeUpIsLost) {
  void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  ASSERT_TRUE(NotifyRing::Format(p, kBytes).ok());
  constexpr uint64_t kCount = 100000;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    NotifyRing w;
    if (!NotifyRing::Attach(p, kBytes, &w).ok()) _exit(2);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (uint64_t i = 0; i < kCount;) {
      const Status s = w.Write(std::to_string(i));
      if (s.ok()) {
        ++i;
        if (i % 1000 == 0) usleep(200);  // (now and then the reader finds the ring empty)
      } else if (s.code() != StatusCode::kResourceExhausted || std::chrono::steady_clock::now() > give_up) {
        _exit(3);
      } else {
        std::this_thread::yield();
      }
    }
    _exit(0);
  }
  NotifyRing r;
  ASSERT_TRUE(NotifyRing::Attach(p, kBytes, &r).ok());
  uint64_t next = 0, sleeps = 0, slept_out = 0;
  std::vector<std::string> got;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (next < kCount && std::chrono::steady_clock::now() < give_up) {
    got.clear();
    ASSERT_TRUE(r.ReadAll(100, &got).ok());
    for (const std::string& m : got) ASSERT_EQ(m, std::to_string(next++));
    if (!got.empty()) continue;
    const uint32_t seen = r.BeginWait();
    if (!r.HasMessages()) {
      ++sleeps;
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      const futex::Watch watch{r.doorbell(), seen, true};
      futex::WaitAny({&watch, 1}, until);
      if (std::chrono::steady_clock::now() >= until) ++slept_out;
    }
    r.EndWait();
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "writer status " << status;
  EXPECT_EQ(next, kCount);
  EXPECT_GT(sleeps, 0u) << "the reader never slept: the test proved nothing about wake-ups";
  EXPECT_EQ(slept_out, 0u) << "of " << sleeps << " sleeps";
  munmap(p, kBytes);
}

// A typed ring's records: each kind comes back as it went; bytes that are no record are
// refused with the reason, never read past their end.
TEST(RingRecord, EachKindRoundTripsAndBadBytesAreRefused) {
  using Kind = RingRecord::Kind;
  const std::vector<RingRecord> records = {
      {Kind::kNotify, 0, NotifyOutcome::kCompleted, {}, "plain"},
      {Kind::kBegin, 7, NotifyOutcome::kCompleted, {}, "begun"},
      {Kind::kEnded, 7, NotifyOutcome::kCompleted, {}, "done"},
      {Kind::kEnded, 9, NotifyOutcome::kTimedOut, {0, 2, 40}, ""},
  };
  for (const RingRecord& r : records) {
    const std::string bytes = EncodeRingRecord(r);
    RingRecord back;
    ASSERT_TRUE(DecodeRingRecord(bytes, 100, &back).ok()) << bytes.size();
    EXPECT_EQ(back.kind, r.kind);
    EXPECT_EQ(back.id, r.id);
    EXPECT_EQ(back.outcome, r.outcome);
    EXPECT_EQ(back.landed, r.landed);
    EXPECT_EQ(back.message, r.message);
    // A cut within the fixed fields is refused; past them, it reads as a shorter message.
    const size_t fixed = bytes.size() - r.message.size();
    for (size_t n = 0; n < bytes.size(); ++n) {
      const Status s = DecodeRingRecord(bytes.substr(0, n), 100, &back);
      EXPECT_EQ(s.ok(), n >= fixed) << "cut at " << n << ": " << s.ToString();
      if (s.ok()) {
        EXPECT_EQ(back.message, r.message.substr(0, n - fixed));
      }
    }
  }
  auto refused = [](const RingRecord& r, uint32_t most = 100) {
    RingRecord back;
    const Status s = DecodeRingRecord(EncodeRingRecord(r), most, &back);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    return s.message();
  };
  EXPECT_NE(refused({Kind::kEnded, 1, NotifyOutcome::kInitiatorLost, {}, ""}).find("other than"),
            std::string::npos);
  EXPECT_NE(refused({Kind::kEnded, 1, NotifyOutcome::kCompleted, {3}, ""}).find("completed"),
            std::string::npos);
  EXPECT_NE(refused({Kind::kEnded, 1, NotifyOutcome::kFailed, {3, 3}, ""}).find("order"), std::string::npos);
  EXPECT_NE(refused({Kind::kNotify, 0, {}, {}, std::string(11, 'x')}, 10).find("over 10"), std::string::npos);
  RingRecord back;
  EXPECT_FALSE(DecodeRingRecord(std::string(1, '\x03'), 100, &back).ok());  // no such kind
  std::string long_list = EncodeRingRecord({Kind::kEnded, 1, NotifyOutcome::kFailed, {1}, ""});
  long_list[10] = 2;  // (n: two landed indices, of which one is there)
  EXPECT_NE(DecodeRingRecord(long_list, 100, &back).message().find("landed list"), std::string::npos);
}

}  // namespace
}  // namespace xfer
