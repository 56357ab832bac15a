/* Hostile probe: a set-uid-root program. Installed in a sandbox (or in an
 * image) owned by root with mode 4755 and run by an unprivileged user, it
 * reports whether exec granted it root:
 *
 *     hostile_setuid           prints "ruid=R euid=E suid=S nnp=N"
 *     hostile_setuid drop UID  becomes UID (setresuid), then execs itself
 *                              (argv[0] must be an absolute path) to print
 *
 * With no_new_privs set on every sandbox process the set-uid bit is ignored,
 * so euid stays the caller's. Static, libc only. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

int main(int argc, char** argv) {
  if (argc >= 3 && strcmp(argv[1], "drop") == 0) {
    uid_t u = (uid_t)atoi(argv[2]);
    if (setresgid(u, u, u) != 0 || setresuid(u, u, u) != 0) {
      perror("setresuid");
      return 3;
    }
    char* args[] = {argv[0], NULL};
    execv(argv[0], args);
    perror("execv");
    return 4;
  }
  uid_t r, e, s;
  getresuid(&r, &e, &s);
  printf("ruid=%u euid=%u suid=%u nnp=%d\n", r, e, s, prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0));
  return 0;
}
