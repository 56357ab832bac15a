#include "runtime/container/child_plan.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "sys/raw_syscall.h"

namespace tp::runtime::container {

namespace raw = tp::sys::raw;

// Same lists as docker/crun's defaults, plus kallsyms: with kptr_restrict=0 and
// perf_event_paranoid<=1 it shows kernel addresses (a KASLR bypass) to anyone.
const char* const kMaskedProcFiles[] = {
    "kcore", "keys", "latency_stats", "timer_list", "timer_stats", "sched_debug", "kpagecgroup",
    "kpageflags", "kpagecount", "sysrq-trigger", "config.gz", "kallsyms",
    // The agent (pid 1): its OOM score stays out of the sandbox's reach (its memory is
    // already: it is not dumpable and commands have no CAP_SYS_PTRACE).
    "1/oom_score_adj", "1/oom_adj", "1/task/1/oom_score_adj", "1/task/1/oom_adj", nullptr};
const DeviceNode kDevices[] = {{"null", 1, 3},    {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8},
                               {"urandom", 1, 9}, {"tty", 5, 0},  {nullptr, 0, 0}};
const char* const kDevSymlinks[][2] = {{"ptmx", "pts/ptmx"},          {"fd", "/proc/self/fd"},
                                       {"stdin", "/proc/self/fd/0"},  {"stdout", "/proc/self/fd/1"},
                                       {"stderr", "/proc/self/fd/2"}, {nullptr, nullptr}};
const UserNsLimit kUserNsLimits[] = {{"max_inotify_instances", "32"},
                                     {"max_inotify_watches", "16384"},
                                     {"max_user_namespaces", "0"},
                                     {nullptr, nullptr}};
// Pseudo-terminals per sandbox: every devpts instance draws on the host-wide
// kernel.pty.max (kernel.pty.reserve keeps a share for the host's own instance).
const int kPtyMax = 64;
const char* const kMaskedProcDirs[] = {"acpi", "scsi", "asound", "firmware", nullptr};
const char* const kReadOnlyProcDirs[] = {"bus", "fs", "irq", "sys", nullptr};

namespace {

std::string flag_names(unsigned long f) {
  std::string s;
  auto add = [&](unsigned long bit, const char* n) {
    if (f & bit) s += std::string(s.empty() ? "" : "|") + n;
  };
  add(MS_BIND, "MS_BIND");
  add(MS_REC, "MS_REC");
  add(MS_REMOUNT, "MS_REMOUNT");
  add(MS_PRIVATE, "MS_PRIVATE");
  add(MS_RDONLY, "MS_RDONLY");
  add(MS_NOSUID, "MS_NOSUID");
  add(MS_NODEV, "MS_NODEV");
  add(MS_NOEXEC, "MS_NOEXEC");
  return s.empty() ? "0" : s;
}

// Exec-sequence step offsets from exec_steps_base.
enum ExecStep : uint32_t {
  kDupFds,
  kStdio,
  kAgentFd,
  kCloseRange,
  kSeccomp,
  kExec,
  kCgroupFd,
  kExecStepCount
};

}  // namespace

void ChildPlan::mount(const std::string& src, const std::string& target, const std::string& fstype,
                      unsigned long flags, const std::string& data, bool ignore_missing) {
  Op op{OpKind::kMount};
  op.ignore_missing = ignore_missing;
  op.flags = flags;
  op.a = src.empty() ? nullptr : keep(src);
  op.b = keep(target);
  op.c = fstype.empty() ? nullptr : keep(fstype);
  op.d = data.empty() ? nullptr : keep(data);
  op.step = step("mount(" + (src.empty() ? std::string("none") : src) + ", " + target + ", " +
                 (fstype.empty() ? std::string("none") : fstype) + ", " + flag_names(flags) +
                 (data.empty() ? std::string() : ", " + data) + ")");
  ops.push_back(op);
}

void ChildPlan::bind_ro(const std::string& src, const std::string& target, unsigned long extra,
                        bool ignore_missing) {
  mount(src, target, "", MS_BIND | MS_REC, "", ignore_missing);
  // The remount must repeat flags the kernel locked on the source (e.g. nosuid, atime).
  mount("", target, "", MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | extra, "",
        ignore_missing);
}

void ChildPlan::mkdir(const std::string& path, uint32_t mode) {
  Op op{OpKind::kMkdir};
  op.a = keep(path);
  op.mode = mode;
  op.step = step("mkdir(" + path + ")");
  ops.push_back(op);
}

void ChildPlan::touch(const std::string& path) {
  Op op{OpKind::kTouch};
  op.a = keep(path);
  op.step = step("open(" + path + ", O_CREAT)");
  ops.push_back(op);
}

void ChildPlan::symlink(const std::string& target, const std::string& path) {
  Op op{OpKind::kSymlink};
  op.a = keep(target);
  op.b = keep(path);
  op.step = step("symlink(" + target + ", " + path + ")");
  ops.push_back(op);
}

void ChildPlan::write_file(const std::string& path, const std::string& data, bool ignore_missing) {
  Op op{OpKind::kWriteFile};
  op.ignore_missing = ignore_missing;
  op.a = keep(path);
  op.b = keep(data);
  op.step = step("write(" + path + ", \"" + data + "\")");
  ops.push_back(op);
}

void ChildPlan::set_rlimit(int resource, const std::string& name, uint64_t value) {
  Op op{OpKind::kSetRlimit};
  op.mode = static_cast<uint32_t>(resource);
  op.flags = value;
  op.step = step("setrlimit(" + name + ", " + std::to_string(value) + ")");
  limits.push_back(op);
}

void ChildPlan::sched_idle() {
  Op op{OpKind::kSchedIdle};
  op.step = step("sched_setscheduler(0, SCHED_IDLE)");
  limits.push_back(op);
}

void ChildPlan::move_mount(int fd, const std::string& what, const std::string& target) {
  Op op{OpKind::kMoveMount};
  op.fd = fd;
  op.a = keep(target);
  op.step = step("move_mount(" + what + ", " + target + ")");
  ops.push_back(op);
}

void ChildPlan::simple(OpKind k, const std::string& desc, const std::string& a,
                       unsigned long flags) {
  Op op{k};
  op.a = a.empty() ? nullptr : keep(a);
  op.flags = flags;
  op.step = step(desc);
  ops.push_back(op);
}

void ChildPlan::set_ids(uint32_t uid, uint32_t gid) {
  Op op{OpKind::kSetIds};
  op.flags = uid;
  op.mode = gid;
  op.step = step("setresgid/setgroups/setresuid(" + std::to_string(uid) + ")");
  ops.push_back(op);
}

void ChildPlan::finish() {
  exec_steps_base = static_cast<uint32_t>(steps.size());
  steps.push_back("fcntl(F_DUPFD_CLOEXEC)");
  steps.push_back("open(/dev/null) for stdio");
  steps.push_back("dup3(agent socket, 3) / dup3(agent listening socket, 4)");
  steps.push_back("close_range(4 or 5, ~0, CLOSE_RANGE_CLOEXEC)");
  steps.push_back("prctl(PR_SET_NO_NEW_PRIVS) + seccomp(SECCOMP_SET_MODE_FILTER)");
  steps.push_back("execveat(tp-agent, \"\", AT_EMPTY_PATH)");
  steps.push_back("dup3(cgroup directory, 4)");
}

void build_root_ops(const RootRecipe& r, ChildPlan* p) {
  const std::string& m = r.mnt_dir;
  const std::string root = m + "/root";
  p->simple(OpKind::kWaitSync, "read(sync pipe)");
  p->simple(OpKind::kBecomeRoot, "setresgid/setgroups/setresuid(0) in the user namespace");
  // /proc/sys/user resolves to the writer's user namespace: these are the sandbox's own.
  // Missing on older kernels (e.g. no inotify limits there before 5.11): skipped.
  for (int i = 0; kUserNsLimits[i].name; ++i)
    p->write_file(std::string("/proc/sys/user/") + kUserNsLimits[i].name, kUserNsLimits[i].value,
                  true);
  // After the parent moved us into the sandbox cgroup, so that it is the cgroup ns root.
  p->simple(OpKind::kUnshare, "unshare(CLONE_NEWCGROUP)", "", CLONE_NEWCGROUP);
  p->simple(OpKind::kSethostname, "sethostname(" + r.id + ")", r.id);
  p->simple(OpKind::kLoopbackUp, "ioctl(lo, SIOCSIFFLAGS, IFF_UP)");
  p->mount("", "/", "", MS_REC | MS_PRIVATE, "");
  p->mount("tmpfs", m, "tmpfs", MS_NOSUID | MS_NODEV,
           "size=" + std::to_string(r.disk_bytes) + ",mode=0755");
  p->mkdir(m + "/upper", 0755);
  p->mkdir(m + "/work", 0700);
  p->mkdir(root, 0755);
  std::string lower;
  if (!r.lower_fds.empty()) {
    // Idmapped layers: files stored as ids uid_base.. appear as the sandbox's own
    // range (so as 0.. inside) without a copy per sandbox.
    p->mkdir(m + "/lower", 0700);
    for (size_t i = 0; i < r.lower_fds.size(); ++i) {
      const std::string at = m + "/lower/" + std::to_string(i);
      p->mkdir(at, 0700);
      p->move_mount(r.lower_fds[i], "idmapped " + r.lowers[i], at);
      lower += (lower.empty() ? "" : ":") + at;
    }
  } else {
    for (const auto& l : r.lowers) lower += (lower.empty() ? "" : ":") + l;
  }
  // userxattr: in a user namespace overlayfs cannot read trusted.overlay.*, so
  // opaque directories in image layers are marked with user.overlay.opaque
  // (src/image/layer_unpack.h); whiteouts are 0/0 character devices either way.
  p->mount("overlay", root, "overlay", 0,
           "lowerdir=" + lower + ",upperdir=" + m + "/upper,workdir=" + m + "/work,userxattr");
  for (const auto& [src, locked] : r.ro_binds) p->bind_ro(src, root + src, locked);
  // Layer images may lack the mount points; on the host image they exist (no copy-up then).
  for (const char* d : {"/proc", "/dev", "/tmp"}) p->mkdir(root + d, 0755);

  // /proc, with what would reveal or change host state masked or read-only.
  const std::string proc = root + "/proc";
  const std::string dev = root + "/dev";
  const std::string null_dev = r.dev_dir.empty() ? "/dev/null" : r.dev_dir + "/null";
  p->mount("proc", proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "");
  for (int i = 0; kReadOnlyProcDirs[i]; ++i)
    p->bind_ro(proc + "/" + kReadOnlyProcDirs[i], proc + "/" + kReadOnlyProcDirs[i], MS_NOEXEC,
               true);
  for (const auto& f : r.masked_proc_files)
    p->mount(null_dev, proc + "/" + f, "", MS_BIND, "", true);
  for (const auto& d : r.masked_proc_dirs)
    p->bind_ro(r.empty_dir, proc + "/" + d, MS_NOEXEC | r.prep_locked, true);

  if (!r.dev_dir.empty()) {
    // /dev: one read-only bind of the prepared directory (not nodev: its nodes must work).
    p->mount(r.dev_dir, dev, "", MS_BIND, "");
    p->mount("", dev, "", MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC | r.dev_locked,
             "");
  } else {
    p->mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=65536,mode=0755");
    for (int i = 0; kDevices[i].name; ++i) {
      const std::string d = kDevices[i].name;
      p->touch(dev + "/" + d);
      p->mount("/dev/" + d, dev + "/" + d, "", MS_BIND, "");
    }
    p->mkdir(dev + "/pts", 0755);
    p->mkdir(dev + "/shm", 01777);
    for (int i = 0; kDevSymlinks[i][0]; ++i)
      p->symlink(kDevSymlinks[i][1], dev + "/" + kDevSymlinks[i][0]);
  }
  p->mount("devpts", dev + "/pts", "devpts", MS_NOSUID | MS_NOEXEC,
           "newinstance,ptmxmode=0666,mode=0620,gid=5,max=" + std::to_string(kPtyMax));
  p->mount("shm", dev + "/shm", "tmpfs", MS_NOSUID | MS_NODEV,
           "size=" + std::to_string(r.tmp_bytes) + ",mode=1777");
  p->mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
           "size=" + std::to_string(r.tmp_bytes) + ",mode=1777");

  p->simple(OpKind::kChdir, "chdir(" + root + ")", root);
  p->simple(OpKind::kPivotRoot, "pivot_root(., .)");
  p->simple(OpKind::kUmountDetach, "umount2(old root, MNT_DETACH)", ".");
  p->simple(OpKind::kChdir, "chdir(/)", "/");
}

namespace {

// Kernel layout of struct sigaction for rt_sigaction (not glibc's).
struct KernelSigaction {
  void* handler;
  unsigned long flags;
  void* restorer;
  unsigned long mask;
};

[[noreturn]] void die(int err_fd, uint32_t step, long neg_errno) {
  ChildFailure f{static_cast<int32_t>(step), static_cast<int32_t>(-neg_errno)};
  raw::call(SYS_write, err_fd, &f, sizeof f);
  raw::exit_now(127);
}

long loopback_up() {
  long s = raw::call(SYS_socket, AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return s;
  ifreq ifr{};
  ifr.ifr_name[0] = 'l';
  ifr.ifr_name[1] = 'o';
  long r = raw::call(SYS_ioctl, s, SIOCGIFFLAGS, &ifr);
  if (r == 0) {
    ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP);
    r = raw::call(SYS_ioctl, s, SIOCSIFFLAGS, &ifr);
  }
  raw::call(SYS_close, s);
  return r;
}

long run_op(const Op& op, const ChildPlan& p) {
  switch (op.kind) {
    case OpKind::kWaitSync: {
      char b;
      long n;
      do n = raw::call(SYS_read, p.sync_rd, &b, 1);
      while (n == -EINTR);
      if (n < 0) return n;
      if (n == 0) raw::exit_now(126);  // parent gave up; it reaps us
      return 0;
    }
    case OpKind::kSetIds: {
      long r = raw::call(SYS_setresgid, op.mode, op.mode, op.mode);
      if (r == 0) r = raw::call(SYS_setgroups, 0, nullptr);
      if (r == 0) r = raw::call(SYS_setresuid, op.flags, op.flags, op.flags);
      return r;
    }
    case OpKind::kBecomeRoot: {
      long r = raw::call(SYS_setresgid, 0, 0, 0);
      if (r == 0) r = raw::call(SYS_setgroups, 0, nullptr);
      if (r == 0) r = raw::call(SYS_setresuid, 0, 0, 0);
      return r;
    }
    case OpKind::kUnshare:
      return raw::call(SYS_unshare, op.flags);
    case OpKind::kSethostname: {
      size_t n = 0;
      while (op.a[n]) ++n;
      return raw::call(SYS_sethostname, op.a, n);
    }
    case OpKind::kLoopbackUp:
      return loopback_up();
    case OpKind::kMount:
      return raw::call(SYS_mount, op.a, op.b, op.c, op.flags, op.d);
    case OpKind::kMkdir: {
      long r = raw::call(SYS_mkdirat, AT_FDCWD, op.a, op.mode);
      return r == -EEXIST ? 0 : r;
    }
    case OpKind::kTouch: {
      long fd =
          raw::call(SYS_openat, AT_FDCWD, op.a, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
      if (fd < 0) return fd == -EEXIST ? 0 : fd;
      raw::call(SYS_close, fd);
      return 0;
    }
    case OpKind::kSymlink:
      return raw::call(SYS_symlinkat, op.a, AT_FDCWD, op.b);
    case OpKind::kChdir:
      return raw::call(SYS_chdir, op.a);
    case OpKind::kPivotRoot:
      return raw::call(SYS_pivot_root, ".", ".");
    case OpKind::kUmountDetach:
      return raw::call(SYS_umount2, op.a, MNT_DETACH);
    case OpKind::kSetRlimit: {
      struct {
        uint64_t cur, max;
      } lim{op.flags, op.flags};
      return raw::call(SYS_prlimit64, 0, op.mode, &lim, nullptr);
    }
    case OpKind::kMoveMount:
      return raw::call(SYS_move_mount, op.fd, "", AT_FDCWD, op.a, MOVE_MOUNT_F_EMPTY_PATH);
    case OpKind::kSchedIdle: {
      struct sched_param sp {};
      return raw::call(SYS_sched_setscheduler, 0, SCHED_IDLE, &sp);
    }
    case OpKind::kWriteFile: {
      long fd = raw::call(SYS_openat, AT_FDCWD, op.a, O_WRONLY | O_CLOEXEC);
      if (fd < 0) return fd;
      size_t n = 0;
      while (op.b[n]) ++n;
      long w = raw::call(SYS_write, fd, op.b, n);
      raw::call(SYS_close, fd);
      return w < 0 ? w : (static_cast<size_t>(w) == n ? 0 : -EIO);
    }
  }
  return -EINVAL;
}

}  // namespace

int run_child(void* arg) {
  const ChildPlan& p = *static_cast<const ChildPlan*>(arg);
  int err_fd = p.err_wr;
  // Our copies of the parent's ends: holding them would hide the parent's EOFs.
  raw::call(SYS_close, p.sync_wr);
  raw::call(SYS_close, p.err_rd);
  for (const Op& op : p.ops) {
    long r = run_op(op, p);
    if (r < 0 && !(op.ignore_missing && r == -ENOENT)) die(err_fd, op.step, r);
  }
  const uint32_t e = p.exec_steps_base;
  // Move what exec needs above the stdio and fd-3 slots (any of them may sit there).
  long exe = raw::call(SYS_fcntl, p.exe_fd, F_DUPFD_CLOEXEC, 10);
  long err = raw::call(SYS_fcntl, err_fd, F_DUPFD_CLOEXEC, 10);
  long agent = raw::call(SYS_fcntl, p.agent_child, F_DUPFD_CLOEXEC, 10);
  long cg = p.cgroup_fd >= 0 ? raw::call(SYS_fcntl, p.cgroup_fd, F_DUPFD_CLOEXEC, 10) : 0;
  long listen =
      p.agent_listen >= 0 ? raw::call(SYS_fcntl, p.agent_listen, F_DUPFD_CLOEXEC, 10) : -1;
  if (p.agent_listen >= 0 && listen < 0) die(err_fd, e + kDupFds, listen);
  long log = p.log_fd >= 0 ? raw::call(SYS_fcntl, p.log_fd, F_DUPFD_CLOEXEC, 10) : -1;
  if (p.log_fd >= 0 && log < 0) die(err_fd, e + kDupFds, log);
  if (err >= 0) err_fd = static_cast<int>(err);
  if (exe < 0 || err < 0 || agent < 0 || cg < 0)
    die(err_fd, e + kDupFds, exe < 0 ? exe : err < 0 ? err : agent < 0 ? agent : cg);
  long null_fd = raw::call(SYS_openat, AT_FDCWD, "/dev/null", O_RDWR);
  if (null_fd < 0) die(err_fd, e + kStdio, null_fd);
  for (int i = 0; i < 3; ++i) {
    if (null_fd == i) continue;
    long r = raw::call(SYS_dup3, null_fd, i, 0);
    if (r < 0) die(err_fd, e + kStdio, r);
  }
  if (null_fd > 2) raw::call(SYS_close, null_fd);
  for (int i = 1; log >= 0 && i < 3; ++i) {
    long d = raw::call(SYS_dup3, log, i, 0);
    if (d < 0) die(err_fd, e + kStdio, d);
  }
  long r = raw::call(SYS_dup3, agent, 3, 0);
  if (r < 0) die(err_fd, e + kAgentFd, r);
  if (p.cgroup_fd >= 0) {
    // The agent makes it CLOEXEC at once, so no command ever gets it.
    r = raw::call(SYS_dup3, cg, 4, 0);
    if (r < 0) die(err_fd, e + kCgroupFd, r);
  }
  if (listen >= 0) {
    r = raw::call(SYS_dup3, listen, 5, 0);
    if (r < 0) die(err_fd, e + kAgentFd, r);
  }
  // Anything the daemon left without CLOEXEC must not reach the sandbox.
  r = raw::call(SYS_close_range,
                listen >= 0        ? 6
                : p.cgroup_fd >= 0 ? 5
                                   : 4,
                ~0U, CLOSE_RANGE_CLOEXEC);
  if (r < 0) die(err_fd, e + kCloseRange, r);
  for (const Op& op : p.limits) {
    r = run_op(op, p);
    if (r < 0) die(err_fd, op.step, r);
  }
  // Default dispositions, then unblock (the parent blocked everything around clone).
  KernelSigaction dfl{};
  for (int sig = 1; sig < 65; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    raw::call(SYS_rt_sigaction, sig, &dfl, nullptr, 8);
  }
  unsigned long empty_mask = 0;
  raw::call(SYS_rt_sigprocmask, SIG_SETMASK, &empty_mask, nullptr, 8);
  if (p.seccomp) {
    r = sys::load_filter_raw(*p.seccomp);
    if (r < 0) die(err_fd, e + kSeccomp, r);
  } else {
    r = raw::call(SYS_prctl, 38 /* PR_SET_NO_NEW_PRIVS */, 1, 0, 0, 0);
    if (r < 0) die(err_fd, e + kSeccomp, r);
  }
  r = raw::call(SYS_execveat, exe, "", p.argv.data(), p.envp.data(), AT_EMPTY_PATH);
  die(err_fd, e + kExec, r);
}

std::optional<Error> read_child_failure(int err_rd, const ChildPlan& plan,
                                        const std::string& prefix, const char* unnamed) {
  ChildFailure f{};
  ssize_t n;
  do n = ::read(err_rd, &f, sizeof f);
  while (n < 0 && errno == EINTR);
  if (n < 0) return Error{code_from_errno(errno), errno, prefix + "read(error pipe)"};
  if (n == 0) return std::nullopt;
  std::string step =
      (n == sizeof f && f.step >= 0 && static_cast<size_t>(f.step) < plan.steps.size())
          ? plan.steps[static_cast<size_t>(f.step)]
          : unnamed;
  return Error{code_from_errno(f.err), f.err, prefix + step};
}

}  // namespace tp::runtime::container
