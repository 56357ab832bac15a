#include "sys/seccomp.h"

#include <linux/fs.h>
#include <linux/netlink.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <string>

#include "sys/fd.h"
#include "sys/raw_syscall.h"

namespace tp::sys {

namespace {

Result<void> add_rule(scmp_filter_ctx ctx, uint32_t action, int nr, const std::string& what,
                      std::initializer_list<scmp_arg_cmp> args) {
  int rc = seccomp_rule_add_array(ctx, action, nr, static_cast<unsigned>(args.size()),
                                  args.size() ? args.begin() : nullptr);
  if (rc < 0 && rc != -EDOM)
    return std::unexpected(Error{Code::kInternal, -rc, "seccomp_rule_add(" + what + ")"});
  return {};
}

// An int argument as the kernel reads it: the low 32 bits (the caller may set the
// high ones to slip past a plain 64-bit comparison).
scmp_arg_cmp int_arg_eq(unsigned arg, uint32_t v) {
  return scmp_arg_cmp{arg, SCMP_CMP_MASKED_EQ, 0xffffffffULL, v};
}

Result<void> add_host_wide_rules(scmp_filter_ctx ctx) {
  // Socket families: a sandbox has loopback only (and its own network namespace);
  // every other family is kernel surface it has no use for (vsock ports are
  // host-wide; AF_ALG, AF_KEY, AF_TIPC, AF_RDS, ... have a history of bugs).
  // Refused as a kernel without them would (EAFNOSUPPORT).
  for (uint32_t family = 0; family < AF_MAX; ++family) {
    if (family == AF_UNIX || family == AF_INET || family == AF_INET6 || family == AF_NETLINK ||
        family == AF_PACKET)
      continue;
    TP_TRY(add_rule(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), SCMP_SYS(socket),
                    "socket(" + std::to_string(family) + ")", {int_arg_eq(0, family)}));
  }
  // Netlink: the routing family (ip, getaddrinfo) and socket diagnostics (ss) only;
  // nf_tables and the rest of netfilter, xfrm, audit, generic netlink, uevents ... no.
  for (uint32_t proto = 0; proto < 32; ++proto) {
    if (proto == NETLINK_ROUTE || proto == NETLINK_SOCK_DIAG) continue;
    TP_TRY(add_rule(ctx, SCMP_ACT_ERRNO(EPROTONOSUPPORT), SCMP_SYS(socket),
                    "socket(AF_NETLINK, " + std::to_string(proto) + ")",
                    {int_arg_eq(0, AF_NETLINK), int_arg_eq(2, proto)}));
  }
  // Kernel AIO contexts count against the host-wide fs.aio-max-nr, with no per-user
  // or per-cgroup share: ENOSYS, as on a kernel without AIO (libaio users fall back to
  // threads; io_uring is refused above).
  TP_TRY(add_rule(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(io_setup), "io_setup", {}));
  // The agent (the sandbox's pid 1) is out of reach: no tracing it, no reading or
  // writing its memory. Other processes of the sandbox can be traced as usual.
  TP_TRY(
      add_rule(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ptrace), "ptrace(pid 1)", {int_arg_eq(1, 1)}));
  for (int nr : {SCMP_SYS(process_vm_readv), SCMP_SYS(process_vm_writev)})
    TP_TRY(add_rule(ctx, SCMP_ACT_ERRNO(EPERM), nr, "process_vm(pid 1)", {int_arg_eq(0, 1)}));
  return {};
}

}  // namespace

Result<std::unique_ptr<SeccompProgram>> build_sandbox_filter(const FilterOptions& opts) {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (!ctx) return fail(Code::kInternal, "seccomp_init(SCMP_ACT_ALLOW) failed");
  std::unique_ptr<void, void (*)(void*)> guard(ctx, [](void* c) { seccomp_release(c); });
  // A binary tree over syscall numbers instead of a linear list: every syscall in a
  // sandbox runs fewer BPF instructions, and attaching the filter (whose per-syscall
  // cache the kernel builds by emulating it for every syscall number) went from
  // ~125 to ~75 us here, once per sandbox. Older libseccomp without the attribute
  // keeps the linear list.
  (void)seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, 2);

  static const char* kDenied[] = {
      "kexec_load",
      "kexec_file_load",
      "init_module",
      "finit_module",
      "delete_module",
      "bpf",
      "perf_event_open",
      "keyctl",
      "add_key",
      "request_key",
      "userfaultfd",
      "open_by_handle_at",
      "name_to_handle_at",
      "swapon",
      "swapoff",
      "reboot",
      "acct",
      "quotactl",
      "quotactl_fd",
      "lookup_dcookie",
      "iopl",
      "ioperm",
      "vm86",
      "vm86old",
      // io_uring: a large kernel attack surface whose operations are not seen by
      // this filter (docker's default profile blocks it too).
      "io_uring_setup",
      "io_uring_enter",
      "io_uring_register",
      // The host's kernel log (other sandboxes' OOM reports, kernel addresses) on
      // hosts with kernel.dmesg_restrict=0.
      "syslog",
      // Host clock: the kernel refuses without CAP_SYS_TIME in the initial user
      // namespace; refused here as well so a kernel bug is not the only line.
      "settimeofday",
      "clock_settime",
      "stime",
      "uselib",
      // fanotify groups are counted per host uid (shared by every sandbox mapped
      // to it) and few workloads watch whole file systems.
      "fanotify_init",
      // Another process's file descriptors (the agent's control socket among them).
      "pidfd_getfd",
  };
  // The mount API: a sandbox's root needs none of it after setup.
  static const char* kMountCalls[] = {
      "mount",  "umount",  "umount2",  "pivot_root", "move_mount",    "open_tree",
      "fsopen", "fsmount", "fsconfig", "fspick",     "mount_setattr",
  };
  auto deny = [&](const char* name) -> Result<void> {
    int nr = seccomp_syscall_resolve_name(name);
    if (nr == __NR_SCMP_ERROR) return {};  // not on this architecture
    int rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0);
    if (rc < 0 && rc != -EDOM)
      return std::unexpected(
          Error{Code::kInternal, -rc, std::string("seccomp_rule_add(") + name + ")"});
    return {};
  };
  for (const char* name : kDenied)
    if (auto r = deny(name); !r) return std::unexpected(r.error());
  if (!opts.allow_setns)
    if (auto r = deny("setns"); !r) return std::unexpected(r.error());
  if (!opts.allow_mounts)
    for (const char* name : kMountCalls)
      if (auto r = deny(name); !r) return std::unexpected(r.error());
  if (auto r = add_host_wide_rules(ctx); !r) return std::unexpected(r.error());
  // New user namespaces would give the sandbox a fresh set of capabilities.
  int rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(unshare), 1,
                            SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER));
  if (rc < 0)
    return std::unexpected(Error{Code::kInternal, -rc, "seccomp_rule_add(unshare, CLONE_NEWUSER)"});
  // clone's flags are argument 0 on x86_64 and arm64 (the CLONE_BACKWARDS variants differ only in
  // later args).
  rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                        SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER));
  if (rc < 0)
    return std::unexpected(Error{Code::kInternal, -rc, "seccomp_rule_add(clone, CLONE_NEWUSER)"});
  // Freezing a file system stops every writer on the host that shares it; the
  // kernel demands CAP_SYS_ADMIN over the superblock's user namespace, which a
  // sandbox has for its own tmpfs mounts. Only the low 32 bits of the request
  // count (the kernel truncates it), hence the mask.
  for (unsigned long req :
       {static_cast<unsigned long>(FIFREEZE), static_cast<unsigned long>(FITHAW)}) {
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
                          SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffUL, req));
    if (rc < 0)
      return std::unexpected(
          Error{Code::kInternal, -rc, "seccomp_rule_add(ioctl, FIFREEZE/FITHAW)"});
  }
  // clone3 passes flags in memory, which BPF cannot read: ENOSYS makes glibc fall back to clone.
  rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
  if (rc < 0 && rc != -EDOM)
    return std::unexpected(Error{Code::kInternal, -rc, "seccomp_rule_add(clone3)"});

  UniqueFd mfd(::memfd_create("tp-seccomp", MFD_CLOEXEC));
  if (!mfd) return sys_fail("memfd_create(tp-seccomp)");
  rc = seccomp_export_bpf(ctx, mfd.get());
  if (rc < 0) return std::unexpected(Error{Code::kInternal, -rc, "seccomp_export_bpf"});
  off_t size = ::lseek(mfd.get(), 0, SEEK_END);
  if (size <= 0 || size % sizeof(sock_filter) != 0)
    return fail(Code::kInternal, "seccomp_export_bpf: bad program size " + std::to_string(size));
  auto prog = std::make_unique<SeccompProgram>();
  prog->insns.resize(static_cast<size_t>(size) / sizeof(sock_filter));
  if (::pread(mfd.get(), prog->insns.data(), static_cast<size_t>(size), 0) != size)
    return sys_fail("pread(seccomp memfd)");
  prog->fprog.len = static_cast<unsigned short>(prog->insns.size());
  prog->fprog.filter = prog->insns.data();
  return prog;
}

long load_filter_raw(const SeccompProgram& p) {
  long r = raw::call(SYS_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
  if (r < 0) return r;
  return raw::call(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &p.fprog);
}

}  // namespace tp::sys
