#include <errno.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "spawn/plan.h"
#include "sys/raw_syscall.h"

namespace tp::spawn {
namespace {

namespace raw = tp::sys::raw;

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

size_t length(const char* s) {
  size_t n = 0;
  while (s[n]) ++n;
  return n;
}

// Our host pid, from the host's /proc (not yet replaced by the sandbox's own): the
// daemon needs it even when the spawner dies before it could say.
long host_pid() {
  char buf[16];
  long n = raw::call(SYS_readlinkat, AT_FDCWD, "/proc/self", buf, sizeof buf);
  if (n <= 0) return n < 0 ? n : -ENOENT;
  long pid = 0;
  for (long i = 0; i < n; ++i) {
    if (buf[i] < '0' || buf[i] > '9') return -EINVAL;
    pid = pid * 10 + (buf[i] - '0');
  }
  return pid;
}

long run_op(const Op& op, const ExecPlan& p) {
  switch (op.kind) {
    case OpKind::kHello: {
      long pid = host_pid();
      if (pid < 0) return pid;
      ChildFailure hello{kStepHello, static_cast<int32_t>(pid)};
      long w = raw::call(SYS_write, p.err_wr, &hello, sizeof hello);
      return w < 0 ? w : 0;
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
    case OpKind::kSethostname:
      return raw::call(SYS_sethostname, op.a, length(op.a));
    case OpKind::kLoopbackUp:
      return loopback_up();
    case OpKind::kMount:
      return raw::call(SYS_mount, op.a, op.b, op.c, op.flags, op.d);
    case OpKind::kMkdir: {
      long r = raw::call(SYS_mkdirat, AT_FDCWD, op.a, op.mode);
      if (r == -EEXIST) return 0;
      // The mode asked for, whatever the umask took away (a sticky 01777 /tmp).
      return r == 0 ? raw::call(SYS_fchmodat, AT_FDCWD, op.a, op.mode) : r;
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
      size_t n = length(op.b);
      long w = raw::call(SYS_write, fd, op.b, n);
      raw::call(SYS_close, fd);
      return w < 0 ? w : (static_cast<size_t>(w) == n ? 0 : -EIO);
    }
    case OpKind::kWaitSync:  // run_child's own (they keep descriptors)
    case OpKind::kRecvSetup:
    case OpKind::kCount:
      break;
  }
  return -EINVAL;
}

// One message of `len` bytes with up to kMaxSetupFds descriptors attached; returns
// the bytes read (*got descriptors in fds, *truncated if some were dropped) or
// -errno. EOF instead (the spawner or the daemon gave up on this sandbox): the
// child exits, and the daemon reaps it.
long recv_with_fds(int sock, void* buf, size_t len, int flags, int* fds, uint32_t* got,
                   bool* truncated) {
  alignas(cmsghdr) char control[CMSG_SPACE(kMaxSetupFds * sizeof(int))];
  iovec iov{buf, len};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control;
  mh.msg_controllen = sizeof control;
  long n;
  do n = raw::call(SYS_recvmsg, sock, &mh, MSG_CMSG_CLOEXEC | flags);
  while (n == -EINTR);
  if (n < 0) return n;
  if (n == 0) raw::exit_now(126);
  *got = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k && *got < kMaxSetupFds; ++i)
      __builtin_memcpy(&fds[(*got)++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
  }
  *truncated = (mh.msg_flags & MSG_CTRUNC) != 0;
  return n;
}

// kWaitSync: the spawner's release, with the agent's oom_score_adj descriptor when
// the request asked for it (kept in *oom_fd).
long wait_sync(int sock, int* oom_fd) {
  char b;
  int fds[kMaxSetupFds];
  uint32_t got = 0;
  bool truncated = false;
  long n = recv_with_fds(sock, &b, 1, 0, fds, &got, &truncated);
  if (n < 0) return n;
  if (got >= 1) *oom_fd = fds[0];
  for (uint32_t i = 1; i < got; ++i) raw::call(SYS_close, fds[i]);
  return 0;
}

// kRecvSetup (plan.h): reads the daemon's setup message, joins the cgroups it names
// and keeps the descriptors meant for the agent in *cgroup_fd and *listen_fd.
// Returns 0, or -errno with *failed_step set.
long recv_setup(const Op& op, int sock, int* cgroup_fd, int* listen_fd, uint32_t* failed_step) {
  *failed_step = op.step;
  const uint32_t entries = op.mode;
  const uint32_t want =
      entries + ((op.flags & kSetupCgroupDir) ? 1 : 0) + ((op.flags & kSetupListen) ? 1 : 0);
  if (want > kMaxSetupFds) return -E2BIG;
  char magic[sizeof kSetupMagic];
  int fds[kMaxSetupFds];
  uint32_t got = 0;
  bool truncated = false;
  long n = recv_with_fds(sock, magic, sizeof magic, MSG_WAITALL, fds, &got, &truncated);
  if (n < 0) return n;
  bool same = n == sizeof magic && got == want && !truncated;
  for (size_t i = 0; same && i < sizeof magic; ++i) same = magic[i] == kSetupMagic[i];
  if (!same) return -EPROTO;
  for (uint32_t i = 0; i < entries; ++i) {
    long w = raw::call(SYS_write, fds[i], "0", 1);
    raw::call(SYS_close, fds[i]);
    if (w != 1) {
      *failed_step = op.step + 1 + i;
      return w < 0 ? w : -EIO;
    }
  }
  uint32_t next = entries;
  if (op.flags & kSetupCgroupDir) *cgroup_fd = fds[next++];
  if (op.flags & kSetupListen) *listen_fd = fds[next++];
  return 0;
}

// A fresh stack-protector canary for this sandbox's agent: a forked child would
// otherwise share the spawner's (and every other agent's). Frames entered before
// this point keep the old value in their slots, so nothing below here may return
// into them: run_child never returns. x86-64 keeps it at %fs:0x28 (the ABI GCC and
// glibc agree on); elsewhere the inherited canary stays.
void refresh_canary() {
#if defined(__x86_64__)
  unsigned long c = 0;
  if (raw::call(SYS_getrandom, &c, sizeof c, 0) == static_cast<long>(sizeof c)) {
    c &= ~0xffUL;  // glibc's canaries start with a NUL byte (stops string overreads)
    asm volatile("movq %0, %%fs:0x28" : : "r"(c) : "memory");
  }
#endif
}

}  // namespace

void run_child(const ExecPlan& p) {
  int err_fd = p.err_wr;
  for (int fd : p.drop_first)
    if (fd >= 0) raw::call(SYS_close, fd);
  // The sandbox's init from its first instruction on, not a second tp-spawner (a
  // daemon's own clone, ChildPlan::in_process, keeps its name until it execs).
  if (p.agent_main) raw::call(SYS_prctl, PR_SET_NAME, "tp-agent", 0, 0, 0);
  // The agent's fd 4 and 5: named by the request or, later, by the setup message.
  int cgroup_fd = p.cgroup_fd, listen_fd = p.agent_listen, oom_fd = -1;
  for (uint32_t i = 0; i < p.n_ops; ++i) {
    const Op& op = p.ops[i];
    if (op.kind == OpKind::kWaitSync) {
      long r = wait_sync(p.sync_rd, &oom_fd);
      if (r < 0) die(err_fd, op.step, r);
      continue;
    }
    if (op.kind == OpKind::kRecvSetup) {
      uint32_t step = op.step;
      long r = recv_setup(op, p.agent_child, &cgroup_fd, &listen_fd, &step);
      if (r < 0) die(err_fd, step, r);
      continue;
    }
    long r = run_op(op, p);
    if (r < 0 && !(op.ignore_missing && r == -ENOENT)) die(err_fd, op.step, r);
  }
  const uint32_t e = p.exec_steps_base;
  const bool exec = p.exe_fd >= 0;
  // Move what is still needed above the stdio and fd 3..5 slots (any of them may sit there).
  long exe = exec ? raw::call(SYS_fcntl, p.exe_fd, F_DUPFD_CLOEXEC, 10) : 0;
  long err = raw::call(SYS_fcntl, err_fd, F_DUPFD_CLOEXEC, 10);
  long agent = raw::call(SYS_fcntl, p.agent_child, F_DUPFD_CLOEXEC, 10);
  long cg = cgroup_fd >= 0 ? raw::call(SYS_fcntl, cgroup_fd, F_DUPFD_CLOEXEC, 10) : 0;
  long listen = listen_fd >= 0 ? raw::call(SYS_fcntl, listen_fd, F_DUPFD_CLOEXEC, 10) : -1;
  if (listen_fd >= 0 && listen < 0) die(err_fd, e + kDupFds, listen);
  long log = p.log_fd >= 0 ? raw::call(SYS_fcntl, p.log_fd, F_DUPFD_CLOEXEC, 10) : -1;
  if (p.log_fd >= 0 && log < 0) die(err_fd, e + kDupFds, log);
  long oom = oom_fd >= 0 ? raw::call(SYS_fcntl, oom_fd, F_DUPFD_CLOEXEC, 10) : -1;
  if (oom_fd >= 0 && oom < 0) die(err_fd, e + kDupFds, oom);
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
  // The agent makes 4 and 5 CLOEXEC at once, so no command ever gets them.
  r = cgroup_fd >= 0 ? raw::call(SYS_dup3, cg, 4, 0) : raw::call(SYS_close, 4);
  if (r < 0 && cgroup_fd >= 0) die(err_fd, e + kCgroupFd, r);
  r = listen >= 0 ? raw::call(SYS_dup3, listen, 5, 0) : raw::call(SYS_close, 5);
  if (r < 0 && listen >= 0) die(err_fd, e + kAgentFd, r);
  r = oom >= 0 ? raw::call(SYS_dup3, oom, 6, 0) : raw::call(SYS_close, 6);
  if (r < 0 && oom >= 0) die(err_fd, e + kAgentFd, r);
  if (exec) {
    // Anything else goes at the exec (the error pipe too: EOF there = exec'd).
    r = raw::call(SYS_close_range, 7, ~0U, CLOSE_RANGE_CLOEXEC);
  } else {
    // No exec to close them: everything of the spawner and of the plan but the
    // agent's 0..6 and the error pipe (at 7 until the setup is complete) goes now.
    r = raw::call(SYS_dup3, err_fd, 7, O_CLOEXEC);
    if (r >= 0) {
      err_fd = 7;
      r = raw::call(SYS_close_range, 8, ~0U, 0);
    }
  }
  if (r < 0) die(err_fd, e + kCloseRange, r);
  for (uint32_t i = 0; i < p.n_limits; ++i) {
    r = run_op(p.limits[i], p);
    if (r < 0) die(err_fd, p.limits[i].step, r);
  }
  // Default dispositions, then unblock (the spawner may have blocked or ignored some).
  KernelSigaction dfl{};
  for (int sig = 1; sig < 65; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    raw::call(SYS_rt_sigaction, sig, &dfl, nullptr, 8);
  }
  unsigned long empty_mask = 0;
  raw::call(SYS_rt_sigprocmask, SIG_SETMASK, &empty_mask, nullptr, 8);
  r = raw::call(SYS_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
  if (r == 0 && p.seccomp.len > 0)
    r = raw::call(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &p.seccomp);
  if (r < 0) die(err_fd, e + kSeccomp, r);
  if (exec) {
    r = raw::call(SYS_execveat, exe, "", p.argv, p.envp, AT_EMPTY_PATH);
    die(err_fd, e + kExec, r);
  }
  // Setup complete: EOF on the error pipe tells the daemon so.
  raw::call(SYS_close, err_fd);
  // The agent is this same binary, its libc already initialised by the spawner:
  // only its own start-up is left.
  if (p.cmdline && p.cmdline_len > 0) {
    static constexpr char kName[] = "tp-agent";
    for (size_t i = 0; i < p.cmdline_len; ++i) p.cmdline[i] = i < sizeof kName ? kName[i] : '\0';
  }
  refresh_canary();
  environ = const_cast<char**>(p.envp);
  int argc = 0;
  while (p.argv[argc]) ++argc;
  exit(p.agent_main(argc, const_cast<char**>(p.argv)));
}

}  // namespace tp::spawn
