/* Hostile probe: tries privileged and escape-prone system calls from inside a
 * sandbox and prints one line per attempt:
 *
 *     <probe> rc=<return value> errno=<errno>       (call returned)
 *     <probe> status=<wait status>                   (probe ran in a child that died)
 *
 * tests/hostile/test_escape.py parses the lines and asserts each outcome
 * (refused by seccomp, by the kernel's namespace checks, or harmless).
 * `hostile_syscalls NAME...` runs only the named probes.
 *
 * Safety: several probes would change host state if they ever succeeded on
 * the host (reboot, settimeofday, module loading), so the program refuses to
 * run unless it is in a user namespace that does not map host root. Even then
 * the arguments are chosen to be harmless on success (the time is set to the
 * current time, reboot is only the pid-namespace form, module images are
 * garbage). Static, libc only. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/reboot.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/time.h>
#include <sys/timex.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "host_root_ns.h"

static int g_argc;
static char** g_argv;

static int wanted(const char* name) {
  if (g_argc <= 1) return 1;
  for (int i = 1; i < g_argc; i++)
    if (strcmp(g_argv[i], name) == 0) return 1;
  return 0;
}

static void report(const char* name, long rc) {
  printf("%s rc=%ld errno=%d\n", name, rc, rc < 0 ? errno : 0);
  fflush(stdout);
}

/* Runs fn in a child; prints its wait status (for probes that may be killed, e.g. SIGSYS). */
static void in_child(const char* name, void (*fn)(void)) {
  if (!wanted(name)) return;
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) {
    fn();
    _exit(0);
  }
  int st = 0;
  waitpid(p, &st, 0);
  printf("%s status=%d\n", name, st);
  fflush(stdout);
}

#define PROBE(name, expr)      \
  do {                         \
    if (wanted(name)) {        \
      errno = 0;               \
      long rc_ = (long)(expr); \
      report(name, rc_);       \
    }                          \
  } while (0)

/* x32 ABI: the same syscall numbers with bit 30 set; the filter must not let them through. */
static void x32_unshare(void) {
  long r = syscall(0x40000000 | SYS_unshare, CLONE_NEWUSER);
  _exit(r == 0 ? 0 : 3);
}

/* 32-bit entry (int 0x80): i386 unshare is 310. A filter that only checks the
 * native numbers would let CLONE_NEWUSER through here. */
static void i386_unshare(void) {
#if defined(__x86_64__)
  long r;
  __asm__ volatile("int $0x80" : "=a"(r) : "a"(310), "b"(CLONE_NEWUSER) : "memory");
  _exit(r == 0 ? 0 : 3);
#else
  _exit(4);
#endif
}

static void raw_clone_newuser(void) {
  long r = syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0);
  if (r == 0) _exit(0);
  if (r > 0) {
    waitpid((pid_t)r, NULL, 0);
    _exit(0);
  }
  _exit(3);
}

int main(int argc, char** argv) {
  g_argc = argc;
  g_argv = argv;
  if (in_host_root_ns()) {
    fprintf(stderr, "hostile_syscalls: refusing to run outside a sandbox\n");
    return 2;
  }
  char garbage[64] = {0};

  /* Kernel modules. */
  PROBE("init_module", syscall(SYS_init_module, garbage, sizeof garbage, ""));
  PROBE("finit_module", syscall(SYS_finit_module, 0, "", 0));
  PROBE("delete_module", syscall(SYS_delete_module, "loop", O_NONBLOCK));
  /* Reboot: in a pid namespace RESTART would kill the namespace's init. */
  PROBE("reboot",
        syscall(SYS_reboot, LINUX_REBOOT_MAGIC1, LINUX_REBOOT_MAGIC2, LINUX_REBOOT_CMD_RESTART, 0));
  PROBE("kexec_load", syscall(SYS_kexec_load, 0, 0, 0, 0));
  /* Time: set to what it is now, so even a success would change nothing. */
  {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    PROBE("settimeofday", settimeofday(&tv, NULL));
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    PROBE("clock_settime", clock_settime(CLOCK_REALTIME, &ts));
    struct timex tx;
    memset(&tx, 0, sizeof tx);
    tx.modes = ADJ_TICK;
    tx.tick = 10000;
    PROBE("adjtimex", adjtimex(&tx));
  }
  /* Keyrings. */
  PROBE("add_key",
        syscall(SYS_add_key, "user", "tp-hostile", "x", 1, -2 /* KEY_SPEC_PROCESS_KEYRING */));
  PROBE("keyctl", syscall(SYS_keyctl, 0 /* KEYCTL_GET_KEYRING_ID */, -3 /* session */, 1));
  PROBE("request_key", syscall(SYS_request_key, "user", "tp-hostile", NULL, 0));
  /* Mounts and namespaces. */
  PROBE("mount_tmpfs", mount("none", "/mnt", "tmpfs", 0, NULL));
  PROBE("mount_bind", mount("/", "/mnt", NULL, MS_BIND, NULL));
  PROBE("umount_proc", umount2("/proc", MNT_DETACH));
  PROBE("pivot_root", syscall(SYS_pivot_root, "/tmp", "/tmp"));
  PROBE("open_tree", syscall(SYS_open_tree, AT_FDCWD, "/", 1 /* OPEN_TREE_CLONE */));
  PROBE("fsopen", syscall(SYS_fsopen, "tmpfs", 0));
  PROBE("unshare_newuser", unshare(CLONE_NEWUSER));
  PROBE("setns", syscall(SYS_setns, -1, 0));
  PROBE("clone3", syscall(SYS_clone3, NULL, 0));
  in_child("clone_newuser", raw_clone_newuser);
  in_child("x32_unshare_newuser", x32_unshare);
  in_child("i386_unshare_newuser", i386_unshare);
  /* Devices. */
  PROBE("mknod_block", mknod("/tmp/tp-sda", S_IFBLK | 0600, makedev(8, 0)));
  PROBE("mknod_char_mem", mknod("/tmp/tp-mem", S_IFCHR | 0600, makedev(1, 1)));
  PROBE("open_dev_mem", open("/dev/mem", O_RDONLY));
  PROBE("ioperm", syscall(SYS_ioperm, 0x60, 1, 1));
  PROBE("iopl", syscall(SYS_iopl, 3));
  /* Kernel attack surface. */
  PROBE("bpf", syscall(SYS_bpf, 0, garbage, 16));
  PROBE("perf_event_open", syscall(SYS_perf_event_open, garbage, 0, -1, -1, 0));
  PROBE("userfaultfd", syscall(SYS_userfaultfd, 0));
  PROBE("io_uring_setup", syscall(SYS_io_uring_setup, 4, garbage));
  PROBE("open_by_handle_at", syscall(SYS_open_by_handle_at, AT_FDCWD, garbage, O_RDONLY));
  PROBE("swapon", syscall(SYS_swapon, "/tmp/none", 0));
  PROBE("acct", syscall(SYS_acct, "/tmp/acct"));
  PROBE("syslog_read",
        syscall(SYS_syslog, 3 /* SYSLOG_ACTION_READ_ALL */, garbage, sizeof garbage));
  /* Limits and priorities owned by the host. */
  {
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    struct rlimit more = {rl.rlim_max + 1024, rl.rlim_max + 1024};
    PROBE("raise_nofile_hard", setrlimit(RLIMIT_NOFILE, &more));
  }
  PROBE("nice_minus_20", setpriority(PRIO_PROCESS, 0, -20));
  /* ptrace and memory of PID 1 (the agent; outside this command's pid namespace)
   * and of this command's own init (pid 1 here). */
  PROBE("ptrace_attach_ns_init", ptrace(PTRACE_ATTACH, 1, 0, 0));
  {
    char buf[16];
    struct iovec l = {buf, sizeof buf}, r = {(void*)0x400000, sizeof buf};
    PROBE("process_vm_readv_init", syscall(SYS_process_vm_readv, 1, &l, 1, &r, 1, 0));
  }
  PROBE("open_proc1_mem", open("/proc/1/mem", O_RDWR));
  PROBE("open_proc1_environ", open("/proc/1/environ", O_RDONLY));
  {
    /* Opening the directory may work; listing it must not. */
    char dents[4096];
    int dfd = open("/proc/1/fd", O_RDONLY | O_DIRECTORY);
    PROBE("list_proc1_fd", dfd < 0 ? -1 : syscall(SYS_getdents64, dfd, dents, sizeof dents));
    if (dfd >= 0) close(dfd);
  }
  PROBE("open_proc1_fd3", open("/proc/1/fd/3", O_RDWR));
  PROBE("open_proc1_exe_write", open("/proc/1/exe", O_WRONLY));
  PROBE("open_proc1_exe_read", open("/proc/1/exe", O_RDONLY));
  {
    char link[256];
    PROBE("readlink_proc1_exe", readlink("/proc/1/exe", link, sizeof link));
    PROBE("readlink_proc1_root", readlink("/proc/1/root", link, sizeof link));
  }
  {
    int dfd = open("/proc/1", O_RDONLY | O_DIRECTORY);
    PROBE("pidfd_send_signal_proc1", syscall(SYS_pidfd_send_signal, dfd, SIGKILL, NULL, 0));
    PROBE("pidfd_getfd_proc1", syscall(SYS_pidfd_getfd, dfd, 3, 0));
    if (dfd >= 0) close(dfd);
  }
  return 0;
}
