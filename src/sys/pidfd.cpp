#include "sys/pidfd.h"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

namespace tp::sys {

Result<void> Pidfd::signal(int sig) {
  if (reaped_ || !fd_) return {};
  if (::syscall(SYS_pidfd_send_signal, fd_.get(), sig, nullptr, 0) != 0 && errno != ESRCH)
    return sys_fail("pidfd_send_signal(pid " + std::to_string(pid_) + ", " + std::to_string(sig) +
                    ")");
  return {};
}

bool Pidfd::exited() {
  if (reaped_ || !fd_) return true;
  pollfd p{fd_.get(), POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

Result<bool> Pidfd::reap(bool nohang) {
  if (reaped_) return true;
  if (!fd_) return fail(Code::kInternal, "reap without a pidfd");
  for (;;) {
    siginfo_t si{};
    int rc = ::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(fd_.get()), &si,
                      WEXITED | (nohang ? WNOHANG : 0));
    if (rc == 0) {
      if (si.si_pid == 0) return false;  // WNOHANG, still running
      reaped_ = true;
      return true;
    }
    if (errno == EINTR) continue;
    if (errno == ECHILD) {  // somebody else reaped it (e.g. SIGCHLD ignored)
      reaped_ = true;
      return true;
    }
    return sys_fail("waitid(P_PIDFD, pid " + std::to_string(pid_) + ")");
  }
}

}  // namespace tp::sys
