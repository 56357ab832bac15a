/* Hostile probe for image builds (tests/hostile/test_build_escape.py): a static program
 * that a build spec's `files` copy into the image and its `run` step executes, as the
 * escape of issue 11 (finding 1) did.
 *
 *     build_escape_probe TARGET SECRET TOKEN
 *
 * TARGET is a host path that must not exist, SECRET a root-only host file (0600) whose
 * content must stay unread. The probe tries to reach both through every route at hand
 * (/proc/1/root, /proc/self/root/.., /proc/1/cwd/.., the classic chroot escape) and
 * calls that need host capabilities (settimeofday, swapoff, mknod of a block device,
 * open_by_handle_at) or would give it new ones (unshare of a user namespace). It writes
 * one line per attempt, and what it is (ids, maps, capability and seccomp lines), to
 * /etc/tp-escape-report and stdout, then creates /tmp/tp-escape-ready-TOKEN and waits
 * (at most 10 minutes) for /tmp/tp-escape-go-TOKEN: meanwhile the test inspects the
 * running process from the host (its host uid, user namespace, seccomp mode, root).
 *
 * Report lines: "NAME ok", "NAME fail errno=E", "NAME rc=R errno=E", "seen NAME", and
 * "read NAME ok CONTENT" when a secret was read. Compiled by the test (gcc -static). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/swap.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static FILE* report;

static void say(const char* fmt, ...) {
  va_list a, b;
  va_start(a, fmt);
  va_copy(b, a);
  vfprintf(report, fmt, a);
  vprintf(fmt, b);
  va_end(b);
  va_end(a);
  fflush(report);
  fflush(stdout);
}

static void copy_lines(const char* path, const char* prefix, const char* const* keys) {
  FILE* f = fopen(path, "r");
  if (!f) {
    say("%s unreadable errno=%d\n", prefix, errno);
    return;
  }
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (!keys) {
      say("%s %s", prefix, line);
      continue;
    }
    for (const char* const* k = keys; *k; ++k)
      if (strncmp(line, *k, strlen(*k)) == 0) say("%s", line);
  }
  fclose(f);
}

/* Writes `path` (a would-be host file) and reports whether the write went through. */
static void try_write(const char* name, const char* path) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    say("write_%s fail errno=%d\n", name, errno);
    return;
  }
  (void)!write(fd, "pwned\n", 6);
  close(fd);
  say("write_%s ok\n", name);
}

/* Reads `path` (a would-be view of the host's secret) and reports what it got. */
static void try_read(const char* name, const char* path) {
  struct stat st;
  if (stat(path, &st) == 0) say("seen %s\n", name);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    say("read_%s fail errno=%d\n", name, errno);
    return;
  }
  char buf[256];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n < 0) {
    say("read_%s fail errno=%d\n", name, errno);
    return;
  }
  buf[n] = 0;
  for (ssize_t i = 0; i < n; ++i)
    if (buf[i] == '\n') buf[i] = ' ';
  say("read_%s ok %s\n", name, buf);
}

static void via(const char* name, const char* prefix, const char* target, const char* secret) {
  char p[4096];
  snprintf(p, sizeof p, "%s%s", prefix, target);
  try_write(name, p);
  snprintf(p, sizeof p, "%s%s", prefix, secret);
  try_read(name, p);
}

/* The classic chroot escape, in a child (it changes its root for good). */
static void chroot_escape(const char* target, const char* secret) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    mkdir("/tp-escape-x", 0700);
    if (chroot("/tp-escape-x") != 0) {
      say("chroot fail errno=%d\n", errno);
      _exit(0);
    }
    for (int i = 0; i < 64; ++i) (void)!chdir("..");
    if (chroot(".") != 0) say("chroot_back fail errno=%d\n", errno);
    via("chroot", "", target, secret);
    _exit(0);
  }
  if (pid > 0) waitpid(pid, NULL, 0);
  rmdir("/tp-escape-x");
  /* TARGET is left where it landed (inside the build's root, in the image's /tmp): an
     escape's host file must stay for the test to find. */
}

static void probe(const char* name, long rc) {
  say("%s rc=%ld errno=%d\n", name, rc, rc < 0 ? errno : 0);
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s TARGET SECRET TOKEN\n", argv[0]);
    return 2;
  }
  const char *target = argv[1], *secret = argv[2], *token = argv[3];
  report = fopen("/etc/tp-escape-report", "w");
  if (!report) {
    perror("/etc/tp-escape-report");
    return 3;
  }
  uid_t r, e, s;
  getresuid(&r, &e, &s);
  say("ids uid=%u euid=%u\n", (unsigned)r, (unsigned)e);
  copy_lines("/proc/self/uid_map", "uid_map", NULL);
  copy_lines("/proc/self/gid_map", "gid_map", NULL);
  static const char* const status_keys[] = {"CapEff", "NoNewPrivs", "Seccomp:", NULL};
  copy_lines("/proc/self/status", "status", status_keys);

  via("proc1_root", "/proc/1/root", target, secret);
  via("proc_self_root_up", "/proc/self/root/../../../../../..", target, secret);
  via("proc1_cwd_up", "/proc/1/cwd/../../../../../../../..", target, secret);
  chroot_escape(target, secret);

  /* Host capabilities: each call needs one in the host's user namespace. */
  probe("settimeofday", syscall(SYS_settimeofday, NULL, NULL));
  probe("swapoff", swapoff("/tp-no-such-swap"));
  probe("mknod_block", mknod("/tp-escape-sda", S_IFBLK | 0600, makedev(8, 0)));
  unlink("/tp-escape-sda");
  struct {
    unsigned int bytes;
    int type;
    unsigned char h[8];
  } handle = {8, 1, {2, 0, 0, 0, 0, 0, 0, 0}}; /* inode 2 of a file system: its root */
  probe("open_by_handle_at", syscall(SYS_open_by_handle_at, AT_FDCWD, &handle, O_RDONLY));
  probe("unshare_user", unshare(CLONE_NEWUSER));
  say("done\n");
  fclose(report);

  char ready[256], go[256];
  snprintf(ready, sizeof ready, "/tmp/tp-escape-ready-%s", token);
  snprintf(go, sizeof go, "/tmp/tp-escape-go-%s", token);
  int fd = open(ready, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd >= 0) close(fd);
  for (int i = 0; i < 12000 && access(go, F_OK) != 0; ++i) {
    struct timespec t = {0, 50 * 1000 * 1000};
    nanosleep(&t, NULL);
  }
  unlink(ready);
  unlink(go);
  return 0;
}
