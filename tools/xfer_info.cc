// xfer-info: what this build of xfer and this machine offer: version, host identity, each
// transport available or not and why, and the engine's defaults.
//
//   xfer-info [--host-id ID] [--no-engine]
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <signal.h>
#include <unistd.h>

#include <dlfcn.h>
#include <net/if.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "transport/common/cuda/cuda_api.h"
#include "transport/tcp/nics.h"
#include "util/pci_locality.h"
#include "transport/ucx/ucx_transport.h"
#include "util/crypto.h"
#include "util/host.h"
#include "xfer/engine.h"

#ifndef XFER_TOOLS_VERSION
#define XFER_TOOLS_VERSION "unknown"
#endif

namespace {

std::string ReadFirstLine(const char* path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

std::string CpuModel() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos)
      return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

// Why the kernel refused access to another process's memory (cma, and shm's pidfd_getfd).
std::string PtraceDenied() {
  std::string why = "ptrace not permitted";
  std::string scope = ReadFirstLine("/proc/sys/kernel/yama/ptrace_scope");
  if (!scope.empty()) why += " (kernel.yama.ptrace_scope=" + scope + ")";
  return why;
}

// Probes process_vm_readv and process_vm_writev on a forked child. Empty = works, else why not.
std::string ProbeCma() {
  int ready[2], ctl[2];
  if (pipe(ready) != 0 || pipe(ctl) != 0) return std::string("probe failed: pipe: ") + std::strerror(errno);
  static volatile char target[64];
  pid_t pid = fork();
  if (pid < 0) return std::string("probe failed: fork: ") + std::strerror(errno);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(ready[0]);
    close(ctl[1]);
    std::memcpy(const_cast<char*>(target), "xfer-cma-probe", 15);
    char c = 1;
    if (write(ready[1], &c, 1) != 1) _exit(1);
    while (read(ctl[0], &c, 1) > 0) {
    }
    _exit(0);
  }
  close(ready[1]);
  close(ctl[0]);
  char c;
  std::string why;
  if (read(ready[0], &c, 1) != 1) why = "probe failed: the child did not start";
  if (why.empty()) {
    char buf[16] = {0};
    iovec l{buf, 15}, r{const_cast<char*>(target), 15};
    ssize_t n = process_vm_readv(pid, &l, 1, &r, 1, 0);
    int e = errno;
    if (n < 0) {
      if (e == EPERM) {
        why = PtraceDenied();
      } else if (e == ENOSYS) {
        why = "kernel built without CONFIG_CROSS_MEMORY_ATTACH";
      } else {
        why = std::string("process_vm_readv: ") + std::strerror(e);
      }
    } else if (n != 15 || std::strcmp(buf, "xfer-cma-probe") != 0) {
      why = "process_vm_readv read the wrong bytes";
    } else {
      iovec w{buf, 15};
      n = process_vm_writev(pid, &w, 1, &r, 1, 0);
      if (n != 15) why = std::string("process_vm_writev: ") + std::strerror(errno);
    }
  }
  close(ctl[1]);
  close(ready[0]);
  int st;
  waitpid(pid, &st, 0);
  return why;
}

// Probes what shm needs (src/util/shared_memory.h): a memfd in a forked child, taken by
// this process with pidfd_open + pidfd_getfd (the ptrace access check, as for cma) and mapped
// shared; the bytes the child wrote must show. Empty = works, else why not.
std::string ProbeShm() {
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_getfd)
  int ready[2], ctl[2];
  if (pipe(ready) != 0 || pipe(ctl) != 0) return std::string("probe failed: pipe: ") + std::strerror(errno);
  pid_t pid = fork();
  if (pid < 0) return std::string("probe failed: fork: ") + std::strerror(errno);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(ready[0]);
    close(ctl[1]);
    int msg[2] = {-1, 0};  // fd, errno
    int fd = memfd_create("xfer-shm-probe", MFD_CLOEXEC);
    void* p = MAP_FAILED;
    if (fd >= 0 && ftruncate(fd, 4096) == 0)
      p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
      std::memcpy(p, "xfer-shm-probe", 15);
      msg[0] = fd;
    } else {
      msg[1] = errno;
    }
    if (write(ready[1], msg, sizeof msg) != sizeof msg) _exit(1);
    char c;
    while (read(ctl[0], &c, 1) > 0) {
    }
    _exit(0);
  }
  close(ready[1]);
  close(ctl[0]);
  int msg[2] = {-1, 0};
  std::string why;
  if (read(ready[0], msg, sizeof msg) != sizeof msg) why = "probe failed: the child did not start";
  else if (msg[0] < 0) why = std::string("memfd_create/mmap: ") + std::strerror(msg[1]);
  if (why.empty()) {
    int pidfd = int(syscall(SYS_pidfd_open, pid, 0));
    if (pidfd < 0) {
      why = errno == ENOSYS ? "pidfd_open: not in this kernel (needs Linux 5.3; pidfd_getfd 5.6)"
                            : std::string("pidfd_open: ") + std::strerror(errno);
    } else {
      int fd = int(syscall(SYS_pidfd_getfd, pidfd, msg[0], 0));
      int e = errno;
      if (fd < 0) {
        if (e == EPERM) {
          why = "pidfd_getfd: " + PtraceDenied();
        } else if (e == ENOSYS) {
          why = "pidfd_getfd: not in this kernel (needs Linux 5.6)";
        } else {
          why = std::string("pidfd_getfd: ") + std::strerror(e);
        }
      } else {
        void* p = mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) why = std::string("mmap of the peer's memfd: ") + std::strerror(errno);
        else if (std::memcmp(p, "xfer-shm-probe", 15) != 0) why = "the mapped memfd shows the wrong bytes";
        if (p != MAP_FAILED) munmap(p, 4096);
        close(fd);
      }
      close(pidfd);
    }
  }
  close(ctl[1]);
  close(ready[0]);
  int st;
  waitpid(pid, &st, 0);
  return why;
#else
  return "this build's system headers have no pidfd_open/pidfd_getfd";
#endif
}

// Whether this build's engine knows a transport: an unknown name is refused by Initialize.
bool EngineKnowsTransport(const char* t) {
  xfer::EngineOptions o;
  o.transport = t;
  xfer::Engine e;
  xfer::Status st = e.Initialize("127.0.0.1", o);
  e.Finalize();
  return !(st.code() == xfer::StatusCode::kInvalidArgument &&
           st.message().find("unknown transport") != std::string::npos);
}

#if !XFER_HAVE_UCX  // (with UCX built in, UcxTransport::Describe says it all)
// UCX's version (empty when libucp is not found) and its transports (from ucx_info -d).
std::string UcxVersion() {
  void* h = dlopen("libucp.so.0", RTLD_NOW | RTLD_LOCAL);
  if (!h) return "";
  using Fn = const char* (*)();
  auto fn = reinterpret_cast<Fn>(dlsym(h, "ucp_get_version_string"));
  std::string v = fn ? fn() : "unknown version";
  dlclose(h);
  return v;
}

std::string UcxTransports() {
  FILE* p = popen("ucx_info -d 2>/dev/null", "r");
  if (!p) return "";
  std::set<std::string> seen;
  std::string out;
  char line[512];
  while (std::fgets(line, sizeof line, p)) {
    const char* k = std::strstr(line, "Transport: ");
    if (!k) continue;
    std::string t = k + 11;
    while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
    if (seen.insert(t).second) out += (out.empty() ? "" : ", ") + t;
  }
  pclose(p);
  return out;
}
#endif

template <class Rep, class Period>
long long Ms(std::chrono::duration<Rep, Period> d) {
  return (long long)std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

void Usage(FILE* f) {
  std::fprintf(f,
               "usage: xfer-info [--host-id ID] [--no-engine]\n"
               "  --host-id ID   show the engine's view with EngineOptions::host_id = ID\n"
               "  --no-engine    skip the in-process engine check\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::string host_id_override;
  bool engine_check = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      Usage(stdout);
      return 0;
    } else if (a == "--version") {
      std::printf("xfer-info %s\n", XFER_TOOLS_VERSION);
      return 0;
    } else if (a == "--host-id" && i + 1 < argc) {
      host_id_override = argv[++i];
    } else if (a.rfind("--host-id=", 0) == 0) {
      host_id_override = a.substr(10);
    } else if (a == "--no-engine") {
      engine_check = false;
    } else {
      std::fprintf(stderr, "xfer-info: unknown argument '%s'\n", a.c_str());
      Usage(stderr);
      return 2;
    }
  }

  utsname u{};
  uname(&u);
  std::printf("xfer %s\n", XFER_TOOLS_VERSION);
  std::printf("host:        %s, %ld CPUs (%s), kernel %s %s\n", u.nodename,
              sysconf(_SC_NPROCESSORS_ONLN), CpuModel().c_str(), u.sysname, u.release);
  std::string boot_id = ReadFirstLine("/proc/sys/kernel/random/boot_id");
  if (!host_id_override.empty())
    std::printf("host id:     %s (overridden by --host-id; the kernel boot id is %s)\n",
                host_id_override.c_str(), boot_id.empty() ? "unreadable" : boot_id.c_str());
  else
    std::printf("host id:     %s (kernel boot id, /proc/sys/kernel/random/boot_id; "
                "EngineOptions::host_id overrides)\n",
                boot_id.empty() ? "unreadable" : boot_id.c_str());

  std::printf("transports:\n");
  std::printf("  %-6s %-12s %s\n", "local", "available", "memcpy between engines of one process");
  std::string cma = ProbeCma();
  if (cma.empty())
    std::printf("  %-6s %-12s %s\n", "cma", "available",
                "process_vm_readv/writev between processes of this host (probed)");
  else
    std::printf("  %-6s %-12s cma: %s\n", "cma", "unavailable", cma.c_str());
  if (EngineKnowsTransport("tcp"))
    std::printf("  %-6s %-12s %s\n", "tcp", "available", "TCP sockets to peers on any host");
  else
    std::printf("  %-6s %-12s tcp: not built in this version\n", "tcp", "unavailable");
  if (!EngineKnowsTransport("shm")) {
    std::printf("  %-6s %-12s shm: not built in this version\n", "shm", "unavailable");
  } else {
    std::string shm = ProbeShm();
    if (shm.empty())
      std::printf("  %-6s %-12s %s\n", "shm", "available",
                  "Engine::AllocMem memory mapped by processes of this host, moved with memcpy "
                  "(probed pidfd_getfd)");
    else
      std::printf("  %-6s %-12s shm: %s (AllocMem memory goes through cma)\n", "shm", "unavailable",
                  shm.c_str());
  }
#if XFER_HAVE_UCX
  // What UCX itself sees (version, UCX_TLS, transports and devices), and whether the engine
  // offers it by default: only with an RDMA device, since UCX over TCP emulates put/get.
  const bool rdma = !xfer::host::RdmaDevices().empty();
  std::printf("  %-6s %-12s ucx: %s\n", "ucx", "available",
              xfer::transport::UcxTransport::Describe().c_str());
  std::printf("  %-6s %-12s %s\n", "", "",
              rdma ? "offered by default (an RDMA device is present; EngineOptions::ucx.mode = kAuto)"
                   : "not offered by default: no RDMA device, and UCX would only emulate put/get "
                     "over TCP (EngineOptions::ucx.mode = kOn or transport \"ucx\" to use it anyway)");
#else
  std::string ucx_v = UcxVersion();
  std::printf("  %-6s %-12s ucx: not built in this version (%s; apt-get install libucx-dev and "
              "rebuild)\n", "ucx", "unavailable",
              ucx_v.empty() ? "libucp not found" : ("libucp " + ucx_v + " present, " +
              [] { std::string t = UcxTransports(); return t.empty() ? std::string("no ucx_info") : "transports " + t; }()).c_str());
#endif
  {
    // GPU memory: the copy engines between processes of this host (CUDA IPC), the buffer pool
    // to other hosts. Describe() lists the runtime, the driver and each device, or says why not.
    std::string why;
    const bool gpu = xfer::transport::cuda::Available(&why);
    std::printf("  %-6s %-12s %s\n", "cuda", gpu ? "available" : "unavailable",
                gpu ? "GPU memory: copy engines between processes of this host (CUDA IPC); other "
                      "hosts through the buffer pool"
                    : ("cuda: " + why).c_str());
    std::istringstream lines(gpu ? xfer::transport::cuda::Describe() : "");
    for (std::string line; std::getline(lines, line);) std::printf("  %-6s %-12s %s\n", "", "", line.c_str());
  }

  xfer::EngineOptions d;
  const char* xfer_secret = std::getenv("XFER_SECRET_FILE");
  std::printf("authentication: %s\n",
              !xfer::crypto::Available()
                  ? "unavailable: built without libsodium (apt-get install libsodium-dev and rebuild); "
                    "a secret is refused"
                  : xfer_secret != nullptr
                        ? (std::string("available; tools read the secret from $XFER_SECRET_FILE = ") + xfer_secret).c_str()
                        : "available (EngineOptions::secret or secret_file; tools: --secret-file or "
                          "$XFER_SECRET_FILE), off until a secret is set");
  std::printf("defaults (EngineOptions):\n");
  std::printf("  %-22s %lld ms\n", "heartbeat_interval", Ms(d.heartbeat_interval));
  std::printf("  %-22s %lld ms\n", "heartbeat_timeout", Ms(d.heartbeat_timeout));
  std::printf("  %-22s %s\n", "auto_connect", d.auto_connect ? "true" : "false");
  std::printf("  %-22s %lld ms\n", "auto_connect_timeout", Ms(d.auto_connect_timeout));
  std::printf("  %-22s %d\n", "streams", d.streams);
  const char* per_transport = "0 (each transport's own: 256 KiB local/cma, 512 KiB tcp, 1 MiB ucx, 128 KiB shm, "
      "4/16 MiB cuda, one staging buffer staged)";
  std::printf("  %-22s %s\n", "slice_bytes", per_transport);
  std::printf("  %-22s %s\n", "batch_bytes", per_transport);
  std::printf("  %-22s %lld us\n", "spin",
              (long long)std::chrono::duration_cast<std::chrono::microseconds>(d.spin).count());
  std::printf("  %-22s %s\n", "transport", d.transport.empty() ? "(best available)" : d.transport.c_str());
  std::printf("  %-22s %s\n", "host_id", d.host_id.empty() ? "(kernel boot id)" : d.host_id.c_str());
  std::printf("  %-22s %s (auto: only pairs no transport reaches, e.g. GPU memory to another host)\n",
              "staging", std::string(xfer::StagingName(d.staging)).c_str());
  std::printf("  %-22s %d x %llu bytes (buffer pool: page-locked host buffers, allocated on first use)\n",
              "staging_buffers", d.staging_buffers, (unsigned long long)d.staging_buffer_bytes);
  std::printf("  %-22s %d (data connections per peer)\n", "tcp.links", d.tcp.links);
  std::printf("  %-22s %s\n", "tcp.least_loaded", d.tcp.least_loaded ? "true" : "false");
  std::printf("  %-22s (none: one route, the kernel's) interfaces here that it may name:", "tcp.nics");
  const std::vector<xfer::net::Nic> nics = xfer::net::LocalNics();
  for (const xfer::net::Nic& n : nics) {
    // (Where it sits on the PCIe tree: what "near:BUS_ID" entries rank by.)
    const xfer::pci::Place at = xfer::pci::PlaceOfNic("/sys", n.name);
    const std::string place = at.path.empty() ? std::string(n.loopback ? "" : ", virtual")
                              : ", PCI " + at.path.back() +
                                    (at.numa_node >= 0 ? ", NUMA node " + std::to_string(at.numa_node) : "");
    std::printf(" %s %s/%d%s%s;", n.name.c_str(), n.address.c_str(), n.prefix,
                !n.up ? " (down: refused)" : n.loopback ? " (loopback)" : "", place.c_str());
  }
  // Interfaces without an IPv4 address cannot be named: listed, so that none goes unexplained.
  if (struct if_nameindex* all = ::if_nameindex(); all != nullptr) {
    for (struct if_nameindex* i = all; i->if_name != nullptr; ++i) {
      const std::string name = i->if_name;
      if (std::none_of(nics.begin(), nics.end(), [&](const xfer::net::Nic& n) { return n.name == name; })) {
        std::printf(" %s (no IPv4 address: refused);", name.c_str());
      }
    }
    ::if_freenameindex(all);
  }
  std::printf(" or near:BUS_ID, the ones nearest a GPU's PCI bus id\n");
  std::printf("  %-22s %s (auto: offered when an RDMA device is present)\n", "ucx.mode",
              std::string(xfer::UcxModeName(d.ucx.mode)).c_str());
  std::printf("  %-22s %d (per peer, a worker each)\n", "ucx.endpoints", d.ucx.endpoints);
  if (d.shm.streaming_copy_bytes == 0)
    std::printf("  %-22s 0 (non-temporal copies from the last-level cache's size, %llu bytes here)\n",
                "shm.streaming_copy_bytes", (unsigned long long)xfer::host::LastLevelCacheBytes());
  else
    std::printf("  %-22s %llu\n", "shm.streaming_copy_bytes", (unsigned long long)d.shm.streaming_copy_bytes);
  std::printf("  %-22s %s (with a GPU: registered host memory is page-locked)\n", "cuda.pin_host_memory",
              d.cuda.pin_host_memory ? "true" : "false");

  if (engine_check) {
    // Two engines in this process: what the engine itself reports about a peer.
    xfer::EngineOptions o;
    o.host_id = host_id_override;
    xfer::Engine a, b;
    xfer::Status st = a.Initialize("127.0.0.1:0", o);
    if (st.ok()) st = b.Initialize("127.0.0.1", o);
    if (st.ok()) st = b.Connect(a.LocalName(), std::chrono::milliseconds(3000));
    xfer::PeerInfo pi;
    if (st.ok()) st = b.GetPeerInfo(a.LocalName(), &pi);
    if (st.ok())
      std::printf("engine check: two engines in this process connected over %s; host id %s, "
                  "transport %s\n",
                  a.LocalName().c_str(), pi.host_id.c_str(), pi.transport.c_str());
    else
      std::printf("engine check: FAILED: %s\n", st.ToString().c_str());
    b.Finalize();
    a.Finalize();
    if (!st.ok()) return 1;
  }
  return 0;
}
