// A user's program against an installed xfer (only <xfer/...> headers, libxfer.so): a target
// process and an initiator process on loopback. The initiator READs the target's pattern, then
// WRITEs its own; the target checks what landed. Exits 0 when both sides saw the right bytes.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "xfer/engine.h"

namespace {

using namespace std::chrono_literals;
constexpr size_t kBytes = 1 << 20;

bool Fail(const char* what, const xfer::Status& s) {
  std::fprintf(stderr, "consumer: %s: %s\n", what, s.ToString().c_str());
  return false;
}

std::vector<char> Pattern(char seed) {
  std::vector<char> v(kBytes);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<char>(seed + i * 7);
  return v;
}

// The target: registers its pattern, says its name on `name_out`, and once the initiator says
// it is done (a byte on `done_in`), checks that the initiator's pattern landed.
bool Target(int name_out, int done_in) {
  xfer::Engine engine;
  std::vector<char> mem = Pattern('t');
  xfer::MemHandle h;
  if (auto s = engine.Initialize("127.0.0.1:0"); !s.ok()) return Fail("target Initialize", s);
  if (auto s = engine.RegisterMem(mem.data(), mem.size(), xfer::MemType::kHost, &h, "pool"); !s.ok()) {
    return Fail("RegisterMem", s);
  }
  const std::string name = engine.LocalName() + "\n";
  if (write(name_out, name.data(), name.size()) != static_cast<ssize_t>(name.size())) return false;
  char done;
  if (read(done_in, &done, 1) != 1) return false;
  return mem == Pattern('i');
}

bool Initiator(const std::string& target) {
  xfer::Engine engine;
  std::vector<char> mem(kBytes);
  xfer::MemHandle h;
  std::vector<xfer::RegionInfo> regions;
  if (auto s = engine.Initialize("127.0.0.1"); !s.ok()) return Fail("initiator Initialize", s);
  if (auto s = engine.RegisterMem(mem.data(), mem.size(), xfer::MemType::kHost, &h); !s.ok()) {
    return Fail("RegisterMem", s);
  }
  if (auto s = engine.Connect(target, 10s); !s.ok()) return Fail("Connect", s);
  if (auto s = engine.GetRemoteRegions(target, &regions); !s.ok() || regions.empty()) {
    return Fail("GetRemoteRegions", s);
  }
  std::vector<xfer::TransferDesc> descs = {{reinterpret_cast<uint64_t>(mem.data()), regions[0].addr, kBytes}};
  if (auto s = engine.TransferSync(target, xfer::Op::kRead, descs, 10s); !s.ok()) return Fail("READ", s);
  if (mem != Pattern('t')) {
    std::fprintf(stderr, "consumer: READ brought the wrong bytes\n");
    return false;
  }
  const std::vector<char> mine = Pattern('i');
  std::copy(mine.begin(), mine.end(), mem.begin());  // (in place: the registered range stays)
  if (auto s = engine.TransferSync(target, xfer::Op::kWrite, descs, 10s); !s.ok()) return Fail("WRITE", s);
  xfer::PeerInfo info;
  if (engine.GetPeerInfo(target, &info).ok())
    std::printf("consumer: xfer %s, transport %s\n", std::string(xfer::Version()).c_str(),
                info.transport.c_str());
  return true;
}

}  // namespace

int main() {
  int name_pipe[2], done_pipe[2];
  if (pipe(name_pipe) != 0 || pipe(done_pipe) != 0) return 1;
  const pid_t child = fork();
  if (child == 0) {
    // (Each side keeps only its own ends: when one side dies, the other's read returns.)
    close(name_pipe[0]);
    close(done_pipe[1]);
    _exit(Target(name_pipe[1], done_pipe[0]) ? 0 : 1);
  }
  close(name_pipe[1]);
  close(done_pipe[0]);
  std::string name;
  char c;
  while (read(name_pipe[0], &c, 1) == 1 && c != '\n') name += c;
  const bool ok = !name.empty() && Initiator(name);
  if (write(done_pipe[1], "x", 1) != 1) return 1;
  int status = 0;
  waitpid(child, &status, 0);
  const bool target_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (!target_ok) std::fprintf(stderr, "consumer: the target did not find the initiator's bytes\n");
  return ok && target_ok ? 0 : 1;
}
