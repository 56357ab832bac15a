// forkbomb [MAX]: forks children that just sleep until fork fails (the pids limit)
// or MAX children exist, prints "forks=N errno=E" and then sleeps forever so the
// caller's timeout has to kill the whole tree.
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char** argv) {
  long max = argc > 1 ? atol(argv[1]) : 100000;
  long forks = 0;
  int err = 0;
  setvbuf(stdout, NULL, _IONBF, 0);
  while (forks < max) {
    pid_t p = fork();
    if (p < 0) {
      err = errno;
      break;
    }
    if (p == 0) {
      for (;;) pause();
    }
    forks++;
  }
  printf("forks=%ld errno=%d (%s)\n", forks, err, err ? strerror(err) : "none");
  for (;;) pause();
}
