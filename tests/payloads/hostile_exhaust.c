/* Hostile probe: exhausts per-process and per-user kernel resources and
 * reports how far it got, so that tests can assert where the limit bit and
 * that nothing outside the sandbox noticed.
 *
 *     hostile_exhaust fds               open /dev/null until it fails
 *     hostile_exhaust threads           create sleeping threads until it fails
 *     hostile_exhaust inotify [HOLD_S]  inotify instances, then watches on one
 *                                       instance, until each fails; keeps them
 *                                       HOLD_S seconds (default 0), creating
 *                                       /tmp/tp-inotify.holding when they are held
 *
 * Prints "<what>=<count> errno=<errno of the failure>" lines and "holding"
 * before the hold. Bounded: stops at 1,000,000 of anything. Static. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#define kCap 1000000

static void* sleeper(void* arg) {
  (void)arg;
  for (;;) pause();
  return NULL;
}

int main(int argc, char** argv) {
  const char* what = argc > 1 ? argv[1] : "";
  if (strcmp(what, "fds") == 0) {
    long n = 0;
    int err = 0;
    while (n < kCap) {
      if (open("/dev/null", O_RDONLY) < 0) {
        err = errno;
        break;
      }
      n++;
    }
    printf("fds=%ld errno=%d\n", n, err);
    return 0;
  }
  if (strcmp(what, "threads") == 0) {
    long n = 0;
    int err = 0;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setstacksize(&a, 64 * 1024);
    while (n < kCap) {
      pthread_t t;
      int rc = pthread_create(&t, &a, sleeper, NULL);
      if (rc != 0) {
        err = rc;
        break;
      }
      n++;
    }
    printf("threads=%ld errno=%d\n", n, err);
    fflush(stdout);
    _exit(0);
  }
  if (strcmp(what, "inotify") == 0) {
    int hold = argc > 2 ? atoi(argv[2]) : 0;
    long inst = 0;
    int err = 0, first = -1;
    while (inst < kCap) {
      int fd = inotify_init1(IN_CLOEXEC);
      if (fd < 0) {
        err = errno;
        break;
      }
      if (first < 0) first = fd;
      inst++;
    }
    printf("instances=%ld errno=%d\n", inst, err);
    long watches = 0;
    err = 0;
    if (first >= 0) {
      char dir[64];
      mkdir("/tmp/tp-inotify", 0755);
      while (watches < kCap) {
        snprintf(dir, sizeof dir, "/tmp/tp-inotify/%ld", watches);
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
          err = errno;
          break;
        }
        if (inotify_add_watch(first, dir, IN_ALL_EVENTS) < 0) {
          err = errno;
          break;
        }
        watches++;
      }
    }
    printf("watches=%ld errno=%d\n", watches, err);
    printf("holding\n");
    fflush(stdout);
    close(open("/tmp/tp-inotify.holding", O_WRONLY | O_CREAT | O_CLOEXEC,
               0644)); /* for the test to poll */
    if (hold > 0) sleep((unsigned)hold);
    return 0;
  }
  fprintf(stderr, "usage: hostile_exhaust fds|threads|inotify [HOLD_S]\n");
  return 2;
}
