// cpuspin SECONDS: spins on the CPU for SECONDS of wall time, then prints
// "wall=<s> cpu=<s>" where cpu is this process's CPU time. Under a CPU quota of q
// cores, cpu/wall stays near q.
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char** argv) {
  double secs = argc > 1 ? atof(argv[1]) : 2.0;
  double w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
  volatile unsigned long x = 0;
  while (now(CLOCK_MONOTONIC) - w0 < secs) {
    for (int i = 0; i < 100000; i++) x += (unsigned long)i;
  }
  printf("wall=%.6f cpu=%.6f\n", now(CLOCK_MONOTONIC) - w0, now(CLOCK_PROCESS_CPUTIME_ID) - c0);
  return 0;
}
