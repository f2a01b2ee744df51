// Drives a live engine (with a secret) through its ports with arbitrary bytes, as a hostile
// peer would: each input opens a connection and sends its bytes, after a well-formed handshake
// and hello when its first byte asks for them, so that what follows reaches an established
// control session or a tcp data connection's frame parser: a peer that knows the secret and
// misbehaves. The engine must neither crash nor misbehave (ASan, UBSan) nor stop serving: every
// 64 inputs a legitimate peer engine must still move bytes to it.
//
// An input: a mode byte (mod 3), then the bytes.
//   0: the bytes to the control port, as a stranger's first words;
//   1: the authentication and a hello, then the bytes, on the control port;
//   2: the same on the control port, then a data connection's handshake (its proof included)
//      on the tcp data port, and the bytes as that connection's frames.
#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "control/auth.h"
#include "control/session.h"
#include "control/wire.h"
#include "transport/remote_region.h"
#include "transport/tcp/tcp_wire.h"
#include "util/crypto.h"
#include "util/net.h"
#include "xfer/engine.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
namespace net = xfer::net;
namespace wire = xfer::wire;

struct World {
  xfer::Engine target, legit;
  std::vector<uint8_t> region = std::vector<uint8_t>(1 << 20), read_only = std::vector<uint8_t>(1 << 16);
  std::vector<uint8_t> src = std::vector<uint8_t>(4096, 7);
  net::Address control;
  uint64_t inputs = 0;
};
World* world = nullptr;
const std::string kSecret = "the session fuzzer's own secret!";

[[noreturn]] void Fail(const char* what, const xfer::Status& s) {
  std::fprintf(stderr, "session_fuzzer: %s: %s\n", what, s.ToString().c_str());
  std::abort();
}

// A hello from a peer elsewhere whose name no other input uses.
wire::Hello FuzzHello() {
  wire::Hello h;
  h.name = "127.0.0.2:" + std::to_string(1 + world->inputs % 60000);
  h.incarnation = 1000 + world->inputs;
  h.host_id = "fuzz-elsewhere";
  h.pid = 1;
  return h;
}

// Authenticates the session as the peer of `ours` (knowing the secret); *key: the session's.
bool Authenticate(xfer::control::Session& s, const wire::Hello& ours, std::string* key) {
  xfer::control::Handshake hs(kSecret, true, ours.name, ours.incarnation);
  wire::Message m;
  const auto deadline = Clock::now() + 1s;
  if (!s.Send(hs.Mine()).ok() || !s.FlushUntil(deadline).ok() || !s.ReadOne(deadline, &m).ok() ||
      !std::holds_alternative<wire::AuthChallenge>(m)) {
    return false;
  }
  hs.TheirChallenge(std::get<wire::AuthChallenge>(m));
  hs.set_dialled(xfer::net::PeerOf(s.fd()));
  if (!s.Send(hs.Proof()).ok() || !s.FlushUntil(deadline).ok() || !s.ReadOne(deadline, &m).ok() ||
      !std::holds_alternative<wire::AuthProof>(m) || !hs.Verify(std::get<wire::AuthProof>(m))) {
    return false;
  }
  const xfer::crypto::Mac k = hs.SessionKey();
  key->assign(reinterpret_cast<const char*>(k.data()), k.size());
  return true;
}

// A data connection past its handshake, to the engine whose hello is `theirs`.
bool OpenData(const wire::Hello& theirs, uint64_t me, const std::string& key, net::Fd* fd) {
  namespace tcp = xfer::transport::tcp_wire;
  const std::string* blob = xfer::transport::FindBlob(theirs.backends, "tcp");
  uint16_t port = 0;
  if (blob == nullptr || blob->size() != sizeof port) return false;
  std::memcpy(&port, blob->data(), sizeof port);
  const auto deadline = Clock::now() + 1s;
  const auto hello = tcp::DataHello(theirs.incarnation, me);
  uint8_t nonce[xfer::crypto::kNonceBytes], verdict[tcp::kAcceptBytes];
  if (!net::ConnectTcp(net::Address{"127.0.0.1", port, true}, deadline, fd).ok() ||
      !net::SendAll(fd->get(), hello.data(), hello.size(), deadline).ok() ||
      !net::RecvAll(fd->get(), nonce, sizeof nonce, deadline).ok()) {
    return false;
  }
  const xfer::crypto::Mac proof = tcp::DataProof(key, nonce, theirs.incarnation, me);
  return net::SendAll(fd->get(), proof.data(), proof.size(), deadline).ok() &&
         net::RecvAll(fd->get(), verdict, sizeof verdict, deadline).ok() && tcp::Get<uint32_t>(verdict) == 0;
}

// Sends the bytes, closes our sending side and reads until the engine closes (or 500 ms).
void SendAndDrain(int fd, const uint8_t* data, size_t size) {
  (void)net::SendAll(fd, data, size, Clock::now() + 500ms);
  ::shutdown(fd, SHUT_WR);
  char sink[4096];
  while (net::RecvAll(fd, sink, 1, Clock::now() + 500ms).ok()) {
    while (::recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0) {
    }
  }
}

void CheckStillServing() {
  World& w = *world;
  const xfer::TransferDesc d{reinterpret_cast<uint64_t>(w.src.data()),
                             reinterpret_cast<uint64_t>(w.region.data()), w.src.size()};
  if (xfer::Status s = w.legit.TransferSync(w.target.LocalName(), xfer::Op::kWrite, {d}, 10s); !s.ok()) {
    Fail("the engine stopped serving a legitimate peer", s);
  }
  std::vector<xfer::Notification> drained;  // (notifications the inputs queued)
  (void)w.target.GetNotifies(&drained);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("XFER_LOG", "error", 0);  // (every refused input would log a warning)
  if (!xfer::crypto::Available()) Fail("this build has no libsodium", {});
  world = new World();
  std::atexit([] {  // (libFuzzer ends with exit(): no engine thread may outlive the statics)
    world->legit.Finalize();
    world->target.Finalize();
  });
  xfer::EngineOptions o;
  o.secret = kSecret;
  o.heartbeat_timeout = 1000ms;
  o.transport = "tcp";  // (the legitimate peer moves bytes over the data port the inputs reach)
  xfer::MemHandle h = 0;
  if (xfer::Status s = world->target.Initialize("127.0.0.1:0", o); !s.ok()) Fail("Initialize", s);
  if (xfer::Status s =
          world->target.RegisterMem(world->region.data(), world->region.size(), xfer::MemType::kHost, &h);
      !s.ok()) {
    Fail("RegisterMem", s);
  }
  if (xfer::Status s = world->target.RegisterMem(world->read_only.data(), world->read_only.size(),
                                                 xfer::MemType::kHost, &h, "ro", xfer::PeerAccess::kReadOnly);
      !s.ok()) {
    Fail("RegisterMem read-only", s);
  }
  if (xfer::Status s = world->legit.Initialize("127.0.0.1:0", o); !s.ok()) Fail("Initialize", s);
  if (xfer::Status s = world->legit.Connect(world->target.LocalName(), 10s); !s.ok()) Fail("Connect", s);
  if (xfer::Status s = net::ParseAddress(world->target.LocalName(), &world->control); !s.ok())
    Fail("address", s);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  World& w = *world;
  const int mode = data[0] % 3;
  ++w.inputs;
  net::Fd fd;
  if (!net::ConnectTcp(w.control, Clock::now() + 1s, &fd).ok()) return 0;
  if (mode == 0) {
    SendAndDrain(fd.get(), data + 1, size - 1);
  } else {
    const wire::Hello ours = FuzzHello();
    auto session = std::make_shared<xfer::control::Session>(std::move(fd), true, "engine");
    wire::Message theirs;
    std::string key;
    if (Authenticate(*session, ours, &key) && session->Send(ours).ok() &&
        session->FlushUntil(Clock::now() + 1s).ok() && session->ReadOne(Clock::now() + 1s, &theirs).ok() &&
        std::holds_alternative<wire::Hello>(theirs)) {
      net::Fd data_fd;
      if (mode == 1) {
        SendAndDrain(session->fd(), data + 1, size - 1);
      } else if (OpenData(std::get<wire::Hello>(theirs), ours.incarnation, key, &data_fd)) {
        SendAndDrain(data_fd.get(), data + 1, size - 1);
      }
    }
    session->Close();
  }
  if (w.inputs % 64 == 0) CheckStillServing();
  return 0;
}
