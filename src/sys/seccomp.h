// Seccomp policy of container sandboxes.
//
// build_sandbox_filter() compiles the policy with libseccomp once, in the
// parent, into a classic-BPF program; a child started with clone(CLONE_VM)
// loads it with load_filter_raw(), which makes only raw syscalls (no malloc,
// no errno: async-signal-safe). Policy: allow by default; EPERM for kernel,
// module, bpf, perf, keyring, userfaultfd, handle, swap, reboot, accounting,
// quota, port I/O and mount-API calls, fanotify_init, pidfd_getfd, and for
// clone/unshare with CLONE_NEWUSER; ENOSYS for clone3 so that glibc falls back
// to clone, whose flags the filter can inspect. Host-wide resources without a
// per-sandbox share: socket families other than unix, inet, inet6, packet and
// netlink get EAFNOSUPPORT, netlink protocols other than route and sock_diag
// EPROTONOSUPPORT (nf_tables among them), io_setup ENOSYS (fs.aio-max-nr is
// host-wide). The agent (pid 1) cannot be traced or its memory read or written
// (ptrace, process_vm_readv/writev on pid 1: EPERM). Int arguments are compared
// on their low 32 bits, as the kernel reads them.
// Thread rules: a SeccompProgram is immutable after build; share it freely.
#pragma once

#include <linux/filter.h>

#include <memory>
#include <vector>

#include "common/result.h"

namespace tp::sys {

struct SeccompProgram {
  std::vector<sock_filter> insns;
  sock_fprog fprog{};  // points into insns; valid while the program lives and is not moved
};

struct FilterOptions {
  // Leave the mount API allowed: image builds mount in the namespaces they own.
  bool allow_mounts = false;
  // Leave setns allowed: a function worker moves its calls' children into network
  // namespaces it made. The kernel lets a process enter only namespaces over whose
  // user namespace it has CAP_SYS_ADMIN: a sandbox's root reaches its own ones only.
  bool allow_setns = false;
};

// The filter for sandbox processes (and, with allow_mounts, for image builds).
// The returned pointer is stable.
Result<std::unique_ptr<SeccompProgram>> build_sandbox_filter(const FilterOptions& opts = {});

// In the child: PR_SET_NO_NEW_PRIVS then seccomp(SET_MODE_FILTER). Returns 0 or -errno.
long load_filter_raw(const SeccompProgram& p);

}  // namespace tp::sys
