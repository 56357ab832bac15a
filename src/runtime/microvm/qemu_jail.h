// Starts QEMU unprivileged, in namespaces of its own, seeing only what it needs.
//
// The process is cloned (CLONE_VM, from the calling thread: the daemon never
// forks) into new user, mount, pid, net, ipc and uts namespaces. Its user
// namespace maps two host ids: uid_base (root inside, for the setup only) and
// uid_base + 1, which QEMU runs as with no capabilities at all (setresuid
// after the mounts, then no_new_privs; QEMU adds its own seccomp filter with
// `-sandbox on`). Its cgroup (created here, limits written before it runs) is
// the sandbox's. Its root is a tmpfs with:
//   /usr (and the host's merged-/usr links)  read-only: QEMU and its libraries
//   /dev/null, /dev/zero, /dev/urandom (and /dev/kvm when used)
//   /proc                                    its own pid namespace's
//   /assets  read-only: kernel, initrd, host image
//   /images  read-only: the erofs layer images
//   /vm      read-write, owned by uid_base + 1: its sockets
// and nothing else of the host. Descriptors: 3 and 4 as given (the template
// memory and the saved device state), stdout/stderr on log_fd (QEMU's own
// error messages), everything else closed. RLIMIT_FSIZE bounds what QEMU may
// write to a file (a guest cannot grow its log without bound), no core dumps.
// QEMU is PID 1 of its pid namespace: killing it ends everything in there.
//
// Thread rules: spawn() may be called from several threads at once.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/result.h"
#include "runtime/container/child_plan.h"
#include "sys/cgroup.h"
#include "sys/pidfd.h"

namespace tp::runtime::microvm {

struct JailSpec {
  std::string name;        // for messages
  std::string mnt_dir;     // an empty host directory: the jail's root is mounted there, in its ns
  std::string vm_dir;      // host directory bound at /vm (made and chowned by the caller)
  std::string assets_dir;  // bound read-only at /assets
  std::string images_dir;  // bound read-only at /images
  bool kvm = false;        // bind /dev/kvm
  uint32_t uid_base = 0;   // host ids uid_base (setup) and uid_base + 1 (QEMU)
  int qemu_exe = -1;       // O_PATH descriptor of the QEMU binary
  int fd3 = -1, fd4 = -1;  // become 3 and 4 in QEMU (-1: /dev/null there)
  int log_fd = -1;         // QEMU's stdout and stderr (-1: /dev/null)
  std::vector<std::string> argv;
  std::string cgroup_id;     // the cgroup to make under the manager's parent
  sys::CgroupLimits limits;  // written before QEMU starts
  uint64_t fsize_limit = 16ull << 20;
};

// Starts it; on failure nothing of it remains (the cgroup is removed again).
Result<sys::Pidfd> spawn_jailed(const JailSpec& spec, sys::CgroupManager& cgroups);

// Runs `plan` (its first op a kWaitSync) in a clone(CLONE_VM | CLONE_PIDFD |
// `flags`) child on a stack of its own: `setup(pid)` (id maps, cgroups) runs
// while the child waits, and the call returns once the child exec'd; a failed
// step comes back as an error naming it (`what`: a prefix), the child reaped.
Result<sys::Pidfd> run_plan(container::ChildPlan& plan, int flags,
                            const std::function<Result<void>(pid_t)>& setup,
                            const std::string& what);

}  // namespace tp::runtime::microvm
