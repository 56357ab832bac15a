// memhog MIB: allocates MIB mebibytes one at a time, touching every page so the
// memory is really charged, and reports progress on stdout. Exits 0 if it got all
// of it; inside a sandbox with a smaller memory limit it is OOM-killed instead.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// Every block escapes through here: otherwise clang drops the unused malloc+memset
// pairs and nothing is ever charged.
static char* volatile g_last;

int main(int argc, char** argv) {
  long mib = argc > 1 ? atol(argv[1]) : 1024;
  setvbuf(stdout, NULL, _IONBF, 0);
  for (long i = 0; i < mib; i++) {
    char* p = malloc(1 << 20);
    if (p == NULL) {
      printf("malloc failed after %ld MiB\n", i);
      return 2;
    }
    memset(p, (int)(i & 0xff) | 1, 1 << 20);
    g_last = p;
    if ((i + 1) % 16 == 0) printf("%ld MiB\n", i + 1);
  }
  printf("got %ld MiB\n", mib);
  return 0;
}
