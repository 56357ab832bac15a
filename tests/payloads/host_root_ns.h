/* Shared by the hostile payloads (a header: each tests/payloads .c file is its own program). */
#pragma once

#include <stdio.h>

/* Whether this process runs in a user namespace that maps uid 0 to host root (or the
   map cannot be read): then a "refused" result would prove nothing about the sandbox. */
static int in_host_root_ns(void) {
  FILE* f = fopen("/proc/self/uid_map", "r");
  if (!f) return 1;
  unsigned long inside, outside, count;
  int n = fscanf(f, "%lu %lu %lu", &inside, &outside, &count);
  fclose(f);
  return n != 3 || outside == 0;
}
