#include "runtime/microvm/qemu_args.h"

#include <fmt/format.h>

namespace tp::runtime::microvm {

std::string kernel_cmdline(const VmConfig& c) {
  // quiet: the console is a slow UART under TCG. panic=-1: a panic that the
  // pvpanic device missed still ends the guest (reboot=shutdown below).
  std::string s = "console=ttyS0 quiet panic=-1 rdinit=/init";
  if (c.accel == Accel::kTcg && c.tsc_khz)
    s += fmt::format(" tsc_early_khz={} tsc=reliable", c.tsc_khz);
  s += fmt::format(" tp.layers={} tp.disk_kb={} tp.tmp_kb={} tp.pids={}", c.disks.size(), c.disk_kb,
                   c.tmp_kb, c.pids);
  return s;
}

std::vector<std::string> qemu_args(const VmConfig& c) {
  std::vector<std::string> a = {"qemu-system-x86_64", "-nodefaults", "-no-user-config",
                                "-nographic",         "-msg",        "timestamp=off"};
  std::string machine = "microvm,pit=on,rtc=on";
  if (c.memory != MemoryMode::kPlain) machine += ",memory-backend=mem";
  a.insert(a.end(), {"-machine", machine});
  if (c.accel == Accel::kKvm) {
    a.insert(a.end(), {"-accel", "kvm", "-cpu", "host"});
  } else {
    a.insert(a.end(), {"-accel", fmt::format("tcg,tb-size={}", c.tb_size_mb)});
  }
  a.insert(a.end(), {"-smp", std::to_string(c.vcpus), "-m", fmt::format("{}M", c.memory_mb)});
  if (c.memory != MemoryMode::kPlain) {
    a.insert(a.end(), {"-object",
                       fmt::format("memory-backend-file,id=mem,size={}M,mem-path=/proc/"
                                   "self/fd/3,share={}",
                                   c.memory_mb, c.memory == MemoryMode::kTemplate ? "on" : "off")});
  }
  a.insert(a.end(), {"-kernel", c.kernel, "-initrd", c.initrd, "-append", kernel_cmdline(c)});
  a.insert(a.end(), {"-chardev", fmt::format("file,id=con,path={}/console.log", c.vm_dir),
                     "-serial", "chardev:con"});
  a.insert(a.end(), {"-device", "virtio-serial-device,id=vser", "-chardev",
                     fmt::format("socket,id=agent,path={}/agent.sock,server=on,wait=off", c.vm_dir),
                     "-device", "virtserialport,id=agentport,chardev=agent,name=tp.agent"});
  for (size_t i = 0; i < c.disks.size(); ++i) {
    a.insert(a.end(),
             {"-drive", fmt::format("if=none,id=l{},file={},format=raw,readonly=on", i, c.disks[i]),
              "-device", fmt::format("virtio-blk-device,drive=l{},serial=tp-l{}", i, i)});
  }
  a.insert(a.end(),
           {"-device", "pvpanic", "-action", "panic=exit-failure", "-action", "reboot=shutdown"});
  a.insert(a.end(), {"-qmp", fmt::format("unix:{}/qmp.sock,server=on,wait=off", c.vm_dir)});
  a.insert(a.end(),
           {"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"});
  if (c.memory == MemoryMode::kClone)
    a.insert(a.end(), {"-incoming", "defer"});  // then x-ignore-shared and fd:4 over QMP
  return a;
}

}  // namespace tp::runtime::microvm
