// GPU <-> NIC locality on the PCIe tree (pci_locality.h), and tcp.nics' "near:" entries, over
// fake sysfs trees built in a temporary directory the way the kernel lays them out: devices/
// holds the tree, bus/pci/devices/ and class/net/*/device link into it.
#include "util/pci_locality.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "transport/tcp/nics.h"
#include "xfer/engine.h"

namespace xfer::pci {
namespace {
namespace fs = std::filesystem;

class FakeSysfs : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("xfer-sysfs-" + std::to_string(::getpid()) + "-" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_ / "bus/pci/devices");
    fs::create_directories(root_ / "class/net");
    fs::create_directories(root_ / "devices/virtual/net");
  }
  void TearDown() override { fs::remove_all(root_); }

  // A PCI device at devices/<path> (host bridge first, then bus ids), in NUMA node `numa`.
  void Pci(const std::string& path, int numa = -1) {
    const fs::path dir = root_ / "devices" / path;
    fs::create_directories(dir);
    if (numa >= 0) std::ofstream(dir / "numa_node") << numa << "\n";
    fs::create_symlink(dir, root_ / "bus/pci/devices" / dir.filename());
  }
  // Network interface `name` whose device is devices/<path> (a PCI function, or below one).
  void Net(const std::string& name, const std::string& path) {
    fs::create_directories(root_ / "devices" / path);
    fs::create_directories(root_ / "class/net" / name);
    fs::create_symlink(root_ / "devices" / path, root_ / "class/net" / name / "device");
  }
  // A virtual interface: no device on the PCI tree (veth, bridges, tunnels).
  void VirtualNet(const std::string& name) {
    fs::create_directories(root_ / "devices/virtual/net" / name);
    fs::create_directories(root_ / "class/net" / name);
    fs::create_symlink(root_ / "devices/virtual/net" / name, root_ / "class/net" / name / "device");
  }
  std::string sysfs() const { return root_.string(); }

  fs::path root_;
};

// A two-socket server: socket 0 has host bridges 17 and 3a, socket 1 has b0. Below bridge 17's
// root port a PCIe switch holds GPU 1a and NIC 1c; NIC 3c sits under the same host bridge as GPU
// 3b but another root port; NIC b1 is on the other socket.
class TwoSocketServer : public FakeSysfs {
 protected:
  void SetUp() override {
    FakeSysfs::SetUp();
    Pci("pci0000:17/0000:17:00.0", 0);                                         // root port
    Pci("pci0000:17/0000:17:00.0/0000:18:00.0", 0);                            // switch, upstream
    Pci("pci0000:17/0000:17:00.0/0000:18:00.0/0000:19:00.0", 0);               // switch, downstream
    Pci("pci0000:17/0000:17:00.0/0000:18:00.0/0000:19:00.0/0000:1a:00.0", 0);  // GPU
    Pci("pci0000:17/0000:17:00.0/0000:18:00.0/0000:19:04.0", 0);
    Pci("pci0000:17/0000:17:00.0/0000:18:00.0/0000:19:04.0/0000:1c:00.0", 0);  // NIC
    Net("ens1f0", "pci0000:17/0000:17:00.0/0000:18:00.0/0000:19:04.0/0000:1c:00.0");
    Pci("pci0000:3a/0000:3a:00.0", 0);
    Pci("pci0000:3a/0000:3a:00.0/0000:3b:00.0", 0);  // GPU
    Pci("pci0000:3a/0000:3a:02.0", 0);
    Pci("pci0000:3a/0000:3a:02.0/0000:3c:00.0", 0);  // NIC
    Net("ens2f0", "pci0000:3a/0000:3a:02.0/0000:3c:00.0");
    Pci("pci0000:b0/0000:b0:00.0", 1);
    Pci("pci0000:b0/0000:b0:00.0/0000:b1:00.0", 1);  // NIC, socket 1
    Net("ens3f0", "pci0000:b0/0000:b0:00.0/0000:b1:00.0");
    VirtualNet("veth0");
  }
  Distance D(const std::string& bus_id, const std::string& nic) {
    return Between(PlaceOfPciDevice(sysfs(), bus_id), PlaceOfNic(sysfs(), nic));
  }
};

TEST_F(TwoSocketServer, EachNicFallsInItsClass) {
  EXPECT_EQ(D("0000:1a:00.0", "ens1f0"), Distance::kBridge) << "under one PCIe switch";
  EXPECT_EQ(D("0000:1a:00.0", "ens2f0"), Distance::kNumaNode) << "another host bridge, same socket";
  EXPECT_EQ(D("0000:1a:00.0", "ens3f0"), Distance::kSystem) << "the other socket";
  EXPECT_EQ(D("0000:3b:00.0", "ens2f0"), Distance::kHostBridge) << "same host bridge, other root port";
  EXPECT_EQ(D("0000:1a:00.0", "veth0"), Distance::kUnknown) << "a virtual NIC has no place";
  EXPECT_EQ(D("0000:1a:00.0", "no-such-nic"), Distance::kUnknown);
  EXPECT_EQ(D("0000:99:00.0", "ens1f0"), Distance::kUnknown) << "no such device";
  EXPECT_STREQ(DistanceName(Distance::kBridge), "PXB");
  EXPECT_STREQ(DistanceName(Distance::kSystem), "SYS");
}

TEST_F(TwoSocketServer, NicsRankNearestFirst) {
  const auto ranked = RankNics(sysfs(), "0000:1a:00.0", {"veth0", "ens3f0", "ens2f0", "ens1f0"});
  ASSERT_EQ(ranked.size(), 4u);
  EXPECT_EQ(ranked[0].name, "ens1f0");
  EXPECT_EQ(ranked[1].name, "ens2f0");
  EXPECT_EQ(ranked[2].name, "ens3f0");
  EXPECT_EQ(ranked[3].name, "veth0");
  // The GPU as CUDA (upper case) and nvidia-smi (8-digit domain) print its bus id.
  EXPECT_EQ(RankNics(sysfs(), "0000:1A:00.0", {"ens3f0", "ens1f0"})[0].name, "ens1f0");
  EXPECT_EQ(RankNics(sysfs(), "00000000:1A:00.0", {"ens3f0", "ens1f0"})[0].name, "ens1f0");
}

TEST_F(TwoSocketServer, ANumaNodeIsFoundAboveTheFunction) {
  // (A NIC's device may be a child of its PCI function, as virtio's is; the node is the
  // function's.)
  Net("eth9", "pci0000:b0/0000:b0:00.0/0000:b1:00.0/virtio3");
  EXPECT_EQ(PlaceOfNic(sysfs(), "eth9").numa_node, 1);
  EXPECT_EQ(PlaceOfNic(sysfs(), "eth9").path.back(), "0000:b1:00.0");
  EXPECT_EQ(D("0000:1a:00.0", "eth9"), Distance::kSystem);
}

TEST_F(FakeSysfs, TheTreeMayStartBelowAPlatformDevice) {
  // (Hyper-V's virtual PCI, device-tree hosts: the host bridge is not right below devices/.)
  Pci("LNXSYSTM:00/VMBUS:00/5620e0c7-8062-4dce-aeb7-520c7ef76171/pci5620:00/5620:00:00.0", 0);
  Net("eth1", "LNXSYSTM:00/VMBUS:00/5620e0c7-8062-4dce-aeb7-520c7ef76171/pci5620:00/5620:00:00.0");
  Pci("pci0000:00/0000:00:02.0", 0);
  const Place nic = PlaceOfNic(sysfs(), "eth1");
  ASSERT_EQ(nic.path.size(), 2u);
  EXPECT_EQ(nic.path[0], "pci5620:00");
  EXPECT_EQ(Between(PlaceOfPciDevice(sysfs(), "0000:00:02.0"), nic), Distance::kNumaNode);
  Pci("pci10000:00/10000:00:02.0/10000:01:00.0", 0);  // behind VMD
  EXPECT_EQ(PlaceOfPciDevice(sysfs(), "10000:01:00.0").path.size(), 3u);
}

TEST(PciBusId, IsNormalizedOrRefused) {
  EXPECT_EQ(NormalizeBusId("0000:3B:00.0"), "0000:3b:00.0");
  EXPECT_EQ(NormalizeBusId("3b:00.1"), "0000:3b:00.1");
  EXPECT_EQ(NormalizeBusId("00000000:3B:00.0"), "0000:3b:00.0");
  EXPECT_EQ(NormalizeBusId("0001:3b:00.0"), "0001:3b:00.0");
  EXPECT_EQ(NormalizeBusId("10000:01:00.0"), "10000:01:00.0") << "a VMD domain";
  for (const char* bad : {"", "3b", "3b:00", "zz:00.0", "0000:3b:00.8", "0000:3b:000.0", "../../etc:00.0",
                          "1:3b:00.0", "123456789:3b:00.0"}) {
    EXPECT_EQ(NormalizeBusId(bad), "") << bad;
  }
  EXPECT_TRUE(PlaceOfPciDevice("/nonexistent-sysfs", "0000:3b:00.0").path.empty());
  EXPECT_TRUE(PlaceOfNic("/sys", "../../etc").path.empty());
}

// tcp.nics "near:BUS_ID" picks, among this host's usable interfaces, those nearest the device:
// here a fake tree that puts this host's first usable interface next to a fake GPU.
class NearEntries : public FakeSysfs {
 protected:
  void SetUp() override {
    FakeSysfs::SetUp();
    for (const auto& n : net::LocalNics()) {
      if (n.up && !n.loopback) {
        nic_ = n.name;
        break;
      }
    }
    if (nic_.empty()) GTEST_SKIP() << "no interface here is up with an IPv4 address (besides loopback)";
    Pci("pci0000:00/0000:00:02.0", 0);  // GPU
    Pci("pci0000:00/0000:00:03.0", 0);
  }
  std::string nic_;
};

TEST_F(NearEntries, NearAGpuNamesTheNearestInterfaces) {
  Net(nic_, "pci0000:00/0000:00:03.0/virtio2");
  std::vector<net::Nic> nics;
  Status s = net::ResolveNics({"near:0000:00:02.0"}, &nics, sysfs());
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(nics.size(), 1u);
  EXPECT_EQ(nics[0].name, nic_);
  // Named as well, by name or by address, or chosen twice: once.
  for (const std::vector<std::string>& list : {std::vector<std::string>{nic_, "near:0000:00:02.0"},
                                               {nics[0].address, "near:0000:00:02.0"},
                                               {"near:0000:00:02.0", "near:0000:00:02.0"}}) {
    s = net::ResolveNics(list, &nics, sysfs());
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(nics.size(), 1u);
  }
}

TEST_F(NearEntries, NearWithoutAnAnswerIsRefusedWithTheReason) {
  VirtualNet(nic_);
  std::vector<net::Nic> nics;
  Status s = net::ResolveNics({"near:0000:00:02.0"}, &nics, sysfs());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("sits on the PCI tree"), std::string::npos) << s.message();
  s = net::ResolveNics({"near:0000:42:00.0"}, &nics, sysfs());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("no PCI device 0000:42:00.0"), std::string::npos) << s.message();
  s = net::ResolveNics({"near:gpu0"}, &nics, sysfs());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
}

// On this host's own /sys: "near:" the bus id of an interface's PCI function names that
// interface (or one as near), and an engine starts with it.
TEST(NearOnThisHost, AnInterfaceIsNearItsOwnPciFunction) {
  std::string nic, bus_id;
  for (const auto& n : net::LocalNics()) {
    const Place at = PlaceOfNic("/sys", n.name);
    if (n.up && !n.loopback && !at.path.empty()) {
      nic = n.name;
      bus_id = at.path.back();
      break;
    }
  }
  if (nic.empty()) GTEST_SKIP() << "no interface here sits on the PCI tree (virtual ones only)";
  std::vector<net::Nic> nics;
  Status s = net::ResolveNics({"near:" + bus_id}, &nics);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_FALSE(nics.empty());
  for (const auto& n : nics) {
    EXPECT_EQ(Between(PlaceOfPciDevice("/sys", bus_id), PlaceOfNic("/sys", n.name)), Distance::kBridge)
        << n.name;
  }
  EngineOptions o;
  o.transport = "tcp";
  o.tcp.nics = {"near:" + bus_id};
  Engine e;
  s = e.Initialize("127.0.0.1:0", o);
  EXPECT_TRUE(s.ok()) << s.ToString();
  e.Finalize();
}

}  // namespace
}  // namespace xfer::pci
