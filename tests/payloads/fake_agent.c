/* Stand-in for tp-agent in the container runtime's tests and benchmarks.
 *
 * Invoked as `fake_agent --fd 3`: writes one kReady frame (src/protocol/wire.h:
 * u32 length, u8 type=100, u8 flags, u16 reserved, u32 id=0, fields VERSION
 * and PID) on fd 3, then serves a trivial line protocol on the same fd until
 * EOF: each line received is run with /bin/sh -c and its exit status is
 * answered as "exit N\n". `fake_agent --exit` exits at once (for the floor
 * benchmark). Like tp-agent, with `--listen-fd N` it outlives its first
 * connection: at EOF it waits (reaping) until killed, so a released sandbox
 * stays up for adoption. Static, libc only. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void put_u16(unsigned char* p, uint16_t v) {
  p[0] = v & 0xff;
  p[1] = v >> 8;
}
static void put_u32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (v >> (8 * i)) & 0xff;
}
static void put_u64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (v >> (8 * i)) & 0xff;
}

static int write_all(int fd, const void* buf, size_t n) {
  const char* p = buf;
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

int main(int argc, char** argv) {
  int fd = 3;
  int listens = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--exit") == 0) return 0;
    if (strcmp(argv[i], "--fd") == 0 && i + 1 < argc) fd = atoi(argv[++i]);
    if (strcmp(argv[i], "--listen-fd") == 0) listens = 1;
  }
  unsigned char f[12 + 2 * 14];
  put_u32(f, 8 + 2 * 14);
  f[4] = 100; /* kReady */
  f[5] = 0;
  put_u16(f + 6, 0);
  put_u32(f + 8, 0);
  unsigned char* q = f + 12;
  put_u16(q, 25);
  put_u32(q + 2, 8);
  put_u64(q + 6, 1);
  q += 14; /* VERSION */
  put_u16(q, 24);
  put_u32(q + 2, 8);
  put_u64(q + 6, (uint64_t)getpid()); /* PID */
  if (write_all(fd, f, sizeof f) != 0) return 1;

  char line[4096];
  size_t len = 0;
  for (;;) {
    ssize_t n = read(fd, line + len, sizeof line - 1 - len);
    if (n <= 0) {
      if (!listens) return 0;
      for (;;) /* PID 1: reap until the sandbox is killed */
        if (wait(NULL) < 0) pause();
    }
    len += (size_t)n;
    char* nl;
    while ((nl = memchr(line, '\n', len)) != NULL) {
      *nl = 0;
      pid_t pid = fork();
      if (pid == 0) {
        execl("/bin/sh", "sh", "-c", line, (char*)NULL);
        _exit(127);
      }
      int st = 0;
      /* PID 1 duty: reap everything, answer for our command. */
      for (;;) {
        pid_t w = wait(&st);
        if (w == pid || w < 0) break;
      }
      char out[64];
      int m = snprintf(out, sizeof out, "exit %d\n",
                       WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
      if (write_all(fd, out, (size_t)m) != 0) return 0;
      size_t used = (size_t)(nl + 1 - line);
      memmove(line, nl + 1, len - used);
      len -= used;
    }
    if (len == sizeof line - 1) len = 0;
  }
}
