// The QEMU command line of a microVM (pure; unit-tested).
//
// One machine shape: `-M microvm` with direct kernel boot, virtio-mmio devices
// only: the image's layers as read-only virtio-blk disks (serial tp-l<i>, 0 =
// top: the guest's init finds them by serial), one virtio-serial port named
// tp.agent on a unix socket (the agent's channel, QEMU the server), the
// console in <vm_dir>/console.log (bounded by QEMU's RLIMIT_FSIZE, qemu_jail.h:
// a guest cannot fill the host's disk through it), a pvpanic device (a guest kernel
// panic makes QEMU exit with status 1: -action panic=exit-failure), QMP on a
// unix socket, no network, no display, `-sandbox on` with every option denied.
//
// Accelerator: KVM when /dev/kvm opens (-cpu host); else TCG, which needs
// `pit=on` (microvm enables the PIT only with KVM, and without HPET or ACPI PM
// timer the kernel cannot calibrate and hangs) and the host TSC frequency on
// the kernel command line (tsc_early_khz, tsc=reliable: calibration against
// the PIT fails on a loaded host).
//
// Memory: kPlain is anonymous RAM (a cold-booted sandbox); kTemplate maps a
// shared file at fd 3 (/proc/self/fd/3, share=on: the booted guest's RAM ends
// up in it); kClone maps the same file privately (share=off: copy on write)
// and waits for its device state (-incoming defer: the backend then sets
// x-ignore-shared, so that the RAM is not expected in the stream, and starts
// migrate-incoming from fd 4 over QMP; QEMU 7.2 has no -global for it). A clone's command line
// is its template's apart from those two: the machine must match the saved
// state.
//
// Paths are as QEMU sees them inside its jail (qemu_jail.h): /assets, /images, /vm.
// Thread rules: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tp::runtime::microvm {

enum class Accel { kTcg, kKvm };
enum class MemoryMode { kPlain, kTemplate, kClone };

struct VmConfig {
  Accel accel = Accel::kTcg;
  uint64_t tsc_khz = 0;  // TCG: the host TSC frequency (0 = let the kernel calibrate)
  uint32_t vcpus = 1;
  uint64_t memory_mb = 512;
  std::vector<std::string> disks;  // erofs images, top layer first
  uint64_t disk_kb = 1 << 20;      // writable layer (the guest's zram upper)
  uint64_t tmp_kb = 256 << 10;     // guest /tmp
  uint32_t pids = 512;             // pids.max of the guest's sandbox cgroup
  MemoryMode memory = MemoryMode::kPlain;
  std::string kernel = "/assets/vmlinuz";
  std::string initrd = "/assets/initrd.img";
  std::string vm_dir = "/vm";  // qmp.sock and agent.sock
  uint32_t tb_size_mb = 64;    // TCG translation cache bound (host memory per VM)
};

// The guest kernel's command line (the guest init reads tp.*).
std::string kernel_cmdline(const VmConfig& c);
// argv, argv[0] = "qemu-system-x86_64".
std::vector<std::string> qemu_args(const VmConfig& c);

}  // namespace tp::runtime::microvm
