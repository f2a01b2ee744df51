// control::Session's output: a frame sent with the next one (SendWithNext) waits in the kernel
// until the next frame, and leaves with it in one read, or when the socket closes.
#include "control/session.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <memory>
#include <vector>

#include "control/wire.h"
#include "util/net.h"

namespace xfer::control {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class SessionOutput : public ::testing::Test {
 protected:
  void SetUp() override {
    net::Fd listener;
    net::Address bound;
    ASSERT_TRUE(net::Listen(net::Address{"127.0.0.1", 0, true}, &listener, &bound).ok());
    net::Fd out;
    ASSERT_TRUE(net::ConnectTcp(bound, Clock::now() + 5s, &out).ok());
    pollfd p{listener.get(), POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 5000), 1);
    in_ = net::Fd(::accept(listener.get(), nullptr, nullptr));
    ASSERT_TRUE(in_.valid());
    session_ = std::make_unique<Session>(std::move(out), true, "127.0.0.1");
  }
  // What one read gets within `wait` (nothing: empty).
  std::vector<uint8_t> ReadOnce(std::chrono::milliseconds wait) {
    pollfd p{in_.get(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(wait.count())) != 1) return {};
    std::vector<uint8_t> got(64 * 1024);
    const ssize_t n = ::recv(in_.get(), got.data(), got.size(), 0);
    got.resize(n > 0 ? static_cast<size_t>(n) : 0);
    return got;
  }
  static size_t FrameBytes(const wire::Message& m) { return wire::Encode(m).size(); }

  net::Fd in_;
  std::unique_ptr<Session> session_;
};

TEST_F(SessionOutput, AFrameSentWithTheNextLeavesWithIt) {
  const wire::Message begin = wire::NotifyBegin{1, "blocks 1-8"}, sync = wire::Sync{7};
  ASSERT_TRUE(session_->SendWithNext(begin).ok());
  EXPECT_TRUE(ReadOnce(50ms).empty()) << "it left alone (the kernel holds it up to 200 ms)";
  ASSERT_TRUE(session_->Send(sync).ok());
  EXPECT_EQ(ReadOnce(5000ms).size(), FrameBytes(begin) + FrameBytes(sync)) << "not in one read";
}

TEST_F(SessionOutput, AFrameSentWithTheNextLeavesWhenTheSocketCloses) {
  const wire::Message begin = wire::NotifyBegin{2, "blocks 9-16"};
  ASSERT_TRUE(session_->SendWithNext(begin).ok());
  session_.reset();  // (as a process's end closes it)
  EXPECT_EQ(ReadOnce(5000ms).size(), FrameBytes(begin));
}

}  // namespace
}  // namespace xfer::control
