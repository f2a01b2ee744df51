// xfer-info: what this build of xfer and this machine offer: version, host identity, each
// backend as an engine here starts it (on, or off and why), and every option with its default.
//
//   xfer-info [--host-id ID] [--no-engine]
#include <net/if.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "transport/tcp/nics.h"
#include "util/crypto.h"
#include "util/host.h"
#include "util/pci_locality.h"
#include "xfer/engine.h"
#include "xfer/options.h"

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

// The interfaces tcp.nics may name here, where each sits (what "near:BUS_ID" ranks by), and
// those it may not, with why.
void PrintNamableInterfaces() {
  std::printf("; interfaces here:");
  const std::vector<xfer::net::Nic> nics = xfer::net::LocalNics();
  for (const xfer::net::Nic& n : nics) {
    const xfer::pci::Place at = xfer::pci::PlaceOfNic("/sys", n.name);
    const std::string place =
        at.path.empty() ? std::string(n.loopback ? "" : ", virtual")
                        : ", PCI " + at.path.back() +
                              (at.numa_node >= 0 ? ", NUMA node " + std::to_string(at.numa_node) : "");
    std::printf(" %s %s/%d%s%s;", n.name.c_str(), n.address.c_str(), n.prefix,
                !n.up        ? " (down: refused)"
                : n.loopback ? " (loopback)"
                             : "",
                place.c_str());
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
  std::printf(" or near:BUS_ID, the ones nearest a GPU's PCI bus id");
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
      std::printf("xfer-info %s\n", std::string(xfer::Version()).c_str());
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
  std::printf("xfer %s\n", std::string(xfer::Version()).c_str());
  std::printf("host:        %s, %ld CPUs (%s), kernel %s %s\n", u.nodename, sysconf(_SC_NPROCESSORS_ONLN),
              CpuModel().c_str(), u.sysname, u.release);
  std::string boot_id = ReadFirstLine("/proc/sys/kernel/random/boot_id");
  if (!host_id_override.empty())
    std::printf("host id:     %s (overridden by --host-id; the kernel boot id is %s)\n",
                host_id_override.c_str(), boot_id.empty() ? "unreadable" : boot_id.c_str());
  else
    std::printf(
        "host id:     %s (kernel boot id, /proc/sys/kernel/random/boot_id; "
        "EngineOptions::host_id overrides)\n",
        boot_id.empty() ? "unreadable" : boot_id.c_str());

  // The backends as an engine here starts them (with the defaults, or --host-id): on, or off
  // and why, and what each says it moves and found.
  std::printf("transports:\n");
  {
    xfer::EngineOptions o;
    o.host_id = host_id_override;
    std::vector<xfer::TransportState> transports;
    if (xfer::Status st = xfer::DescribeTransports(o, &transports); !st.ok()) {
      std::printf("  (the backends did not start: %s)\n", st.ToString().c_str());
    }
    // An unavailable backend: why, then what it found (ucx: the UCX here, and what becomes of
    // GPU memory with it).
    for (const auto& t : transports) {
      std::istringstream lines(t.available ? t.about : t.why_not + "\n" + t.about);
      std::string line;
      std::getline(lines, line);
      std::printf("  %-6s %-12s %s\n", t.name.c_str(), t.available ? "available" : "unavailable",
                  line.c_str());
      while (std::getline(lines, line)) std::printf("  %-6s %-12s %s\n", "", "", line.c_str());
    }
  }

  const char* xfer_secret = std::getenv("XFER_SECRET_FILE");
  std::printf(
      "authentication: %s\n",
      !xfer::crypto::Available()
          ? "unavailable: built without libsodium (apt-get install libsodium-dev and rebuild); "
            "a secret is refused"
      : xfer_secret != nullptr
          ? (std::string("available; tools read the secret from $XFER_SECRET_FILE = ") + xfer_secret).c_str()
          : "available (EngineOptions::secret or secret_file; tools: --secret-file or "
            "$XFER_SECRET_FILE), off until a secret is set");
  // Every option by name (xfer::DescribeOptions; xfer-bench --set takes these names), with
  // what this machine makes of a few.
  std::printf("defaults (EngineOptions; docs/options.md):\n");
  for (const xfer::OptionInfo& opt : xfer::DescribeOptions()) {
    std::string value = opt.value.empty() ? "(empty)" : opt.value;
    if (opt.key == "shm.streaming_copy_bytes" && opt.value == "0") {
      value += " (the last-level cache's size: " + std::to_string(xfer::host::LastLevelCacheBytes()) +
               " bytes here)";
    }
    std::printf("  %-26s %s%s%s: %s", opt.key.c_str(), value.c_str(), opt.range.empty() ? "" : " [",
                opt.range.empty() ? "" : (opt.range + "]").c_str(), opt.doc.c_str());
    if (opt.key == "tcp.nics") PrintNamableInterfaces();  // (on the same line)
    std::printf("\n");
  }

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
      std::printf(
          "engine check: two engines in this process connected over %s; host id %s, "
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
