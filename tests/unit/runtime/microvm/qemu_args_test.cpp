// The QEMU command line of the microvm tier (qemu_args.h): TCG versus KVM, the
// three memory modes, disks by serial, and what must never be on it.
#include "runtime/microvm/qemu_args.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace tp::runtime::microvm {
namespace {

bool has(const std::vector<std::string>& a, const std::string& s) {
  return std::find(a.begin(), a.end(), s) != a.end();
}
// The value after flag `f` (the first occurrence), "" if none.
std::string after(const std::vector<std::string>& a, const std::string& f) {
  auto it = std::find(a.begin(), a.end(), f);
  return it == a.end() || it + 1 == a.end() ? std::string() : *(it + 1);
}
bool any_contains(const std::vector<std::string>& a, const std::string& s) {
  return std::any_of(a.begin(), a.end(),
                     [&](const std::string& x) { return x.find(s) != std::string::npos; });
}

VmConfig base() {
  VmConfig c;
  c.tsc_khz = 2600000;
  c.vcpus = 2;
  c.memory_mb = 512;
  c.disks = {"/images/top.erofs", "/images/base.erofs"};
  c.disk_kb = 1 << 20;
  c.tmp_kb = 1 << 18;
  c.pids = 100;
  return c;
}

TEST(QemuArgs, TcgNeedsThePitAndTheHostTsc) {
  VmConfig c = base();
  auto a = qemu_args(c);
  EXPECT_EQ(a[0], "qemu-system-x86_64");
  EXPECT_NE(after(a, "-machine").find("microvm,pit=on"), std::string::npos);
  EXPECT_EQ(after(a, "-accel").rfind("tcg", 0), 0u);
  EXPECT_FALSE(has(a, "-cpu"));
  const std::string cmd = kernel_cmdline(c);
  EXPECT_NE(cmd.find("tsc_early_khz=2600000 tsc=reliable"), std::string::npos);
  EXPECT_EQ(after(a, "-append"), cmd);
  EXPECT_EQ(after(a, "-smp"), "2");
  EXPECT_EQ(after(a, "-m"), "512M");
}

TEST(QemuArgs, KvmUsesTheHostCpuAndKvmclock) {
  VmConfig c = base();
  c.accel = Accel::kKvm;
  auto a = qemu_args(c);
  EXPECT_EQ(after(a, "-accel"), "kvm");
  EXPECT_EQ(after(a, "-cpu"), "host");
  EXPECT_EQ(kernel_cmdline(c).find("tsc_early_khz"), std::string::npos);
}

TEST(QemuArgs, GuestInitParametersAndDisksBySerial) {
  VmConfig c = base();
  const std::string cmd = kernel_cmdline(c);
  for (const char* p : {"tp.layers=2", "tp.disk_kb=1048576", "tp.tmp_kb=262144", "tp.pids=100",
                        "rdinit=/init", "panic=-1", "console=ttyS0"})
    EXPECT_NE(cmd.find(p), std::string::npos) << p;
  auto a = qemu_args(c);
  EXPECT_TRUE(has(a, "if=none,id=l0,file=/images/top.erofs,format=raw,readonly=on"));
  EXPECT_TRUE(has(a, "virtio-blk-device,drive=l0,serial=tp-l0"));
  EXPECT_TRUE(has(a, "virtio-blk-device,drive=l1,serial=tp-l1"));
}

TEST(QemuArgs, ConfinedAndWithoutNetworkOrDisplay) {
  auto a = qemu_args(base());
  EXPECT_EQ(after(a, "-sandbox"),
            "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny");
  EXPECT_TRUE(has(a, "-nodefaults"));
  EXPECT_TRUE(has(a, "-nographic"));
  EXPECT_FALSE(any_contains(a, "netdev"));
  EXPECT_FALSE(any_contains(a, "-nic"));
  EXPECT_TRUE(has(a, "virtserialport,id=agentport,chardev=agent,name=tp.agent"));
  EXPECT_TRUE(has(a, "socket,id=agent,path=/vm/agent.sock,server=on,wait=off"));
  EXPECT_TRUE(has(a, "unix:/vm/qmp.sock,server=on,wait=off"));
  EXPECT_TRUE(has(a, "panic=exit-failure"));
  EXPECT_TRUE(has(a, "reboot=shutdown"));
}

TEST(QemuArgs, MemoryModes) {
  VmConfig c = base();
  auto plain = qemu_args(c);
  EXPECT_FALSE(any_contains(plain, "memory-backend"));
  EXPECT_FALSE(has(plain, "-incoming"));

  c.memory = MemoryMode::kTemplate;
  auto tpl = qemu_args(c);
  EXPECT_TRUE(
      any_contains(tpl, "memory-backend-file,id=mem,size=512M,mem-path=/proc/self/fd/3,share=on"));
  EXPECT_NE(after(tpl, "-machine").find("memory-backend=mem"), std::string::npos);
  EXPECT_FALSE(has(tpl, "-incoming"));

  c.memory = MemoryMode::kClone;
  auto clone = qemu_args(c);
  EXPECT_TRUE(any_contains(clone, "mem-path=/proc/self/fd/3,share=off"));
  EXPECT_EQ(after(clone, "-incoming"), "defer");
  // Apart from the memory and the incoming state, a clone's machine is its template's.
  auto strip = [](std::vector<std::string> v) {
    std::vector<std::string> out;
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i] == "-incoming") {
        ++i;
        continue;
      }
      if (v[i].find("memory-backend-file") != std::string::npos) continue;
      out.push_back(v[i]);
    }
    return out;
  };
  EXPECT_EQ(strip(tpl), strip(clone));
}

}  // namespace
}  // namespace tp::runtime::microvm
