/* Hostile probe: file-system ioctls on every kind of file system a sandbox
 * sees (the overlay root, its /tmp tmpfs, the read-only host binds such as
 * /usr). Operators have seen agents corrupt host file systems this way.
 *
 * Prints `<probe> rc=<rc> errno=<errno>` lines; tests/hostile/test_escape.py
 * asserts that freezing, trimming and making files immutable or append-only
 * are refused and that cloning blocks from host files is refused or only
 * produces a private copy.
 *
 * Safety: if a freeze ever succeeded it is thawed at once. Refuses to run
 * outside a user namespace that maps host root elsewhere. Static, libc only. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host_root_ns.h"

static void report(const char* name, const char* path, long rc) {
  printf("%s:%s rc=%ld errno=%d\n", name, path, rc, rc < 0 ? errno : 0);
  fflush(stdout);
}

static void freeze(const char* dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd < 0) {
    report("open", dir, -1);
    return;
  }
  errno = 0;
  long rc = ioctl(fd, FIFREEZE, 0);
  int e = errno;
  if (rc == 0) ioctl(fd, FITHAW, 0); /* never leave anything frozen */
  errno = e;
  report("FIFREEZE", dir, rc);
  errno = 0;
  report("FITHAW", dir, ioctl(fd, FITHAW, 0));
  struct fstrim_range range = {0, (unsigned long long)-1, 0};
  errno = 0;
  report("FITRIM", dir, ioctl(fd, FITRIM, &range));
  close(fd);
}

static void set_flags(const char* path, int flags, const char* name) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) {
    report("open", path, -1);
    return;
  }
  int cur = 0;
  ioctl(fd, FS_IOC_GETFLAGS, &cur);
  int want = cur | flags;
  errno = 0;
  report(name, path, ioctl(fd, FS_IOC_SETFLAGS, &want));
  close(fd);
}

static void clone_from(const char* src, const char* dst) {
  int in = open(src, O_RDONLY);
  int out = open(dst, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (in < 0 || out < 0) {
    report("open", in < 0 ? src : dst, -1);
  } else {
    errno = 0;
    report("FICLONE", dst, ioctl(out, FICLONE, in));
    struct file_clone_range r = {in, 0, 0, 0};
    errno = 0;
    report("FICLONERANGE", dst, ioctl(out, FICLONERANGE, &r));
  }
  if (in >= 0) close(in);
  if (out >= 0) close(out);
}

int main(void) {
  if (in_host_root_ns()) {
    fprintf(stderr, "hostile_ioctls: refusing to run outside a sandbox\n");
    return 2;
  }
  const char* dirs[] = {"/", "/tmp", "/usr", "/dev/shm"};
  for (unsigned i = 0; i < sizeof dirs / sizeof *dirs; i++) freeze(dirs[i]);

  const char* files[] = {"/root/tp-ioctl", "/tmp/tp-ioctl"};
  for (unsigned i = 0; i < sizeof files / sizeof *files; i++) {
    int fd = open(files[i], O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      (void)!write(fd, "x\n", 2);
      close(fd);
    }
    set_flags(files[i], FS_IMMUTABLE_FL, "SETFLAGS_IMMUTABLE");
    set_flags(files[i], FS_APPEND_FL, "SETFLAGS_APPEND");
  }
  set_flags("/usr/bin/env", FS_IMMUTABLE_FL, "SETFLAGS_IMMUTABLE");
  set_flags("/usr", FS_IMMUTABLE_FL, "SETFLAGS_IMMUTABLE");
  /* fsxattr with the immutable flag (FS_IOC_FSSETXATTR path). */
  {
    int fd = open("/root/tp-ioctl", O_RDONLY);
    struct fsxattr fa;
    memset(&fa, 0, sizeof fa);
    if (fd >= 0 && ioctl(fd, FS_IOC_FSGETXATTR, &fa) == 0) {
      fa.fsx_xflags |= FS_XFLAG_IMMUTABLE;
      errno = 0;
      report("FSSETXATTR_IMMUTABLE", "/root/tp-ioctl", ioctl(fd, FS_IOC_FSSETXATTR, &fa));
    } else {
      report("FSGETXATTR", "/root/tp-ioctl", -1);
    }
    if (fd >= 0) close(fd);
  }
  clone_from("/usr/bin/env", "/tmp/tp-clone");
  clone_from("/usr/bin/env", "/root/tp-clone");
  return 0;
}
