// Pidfd: owner of a child process handle. Waiting goes through waitid(P_PIDFD)
// so that the daemon never reaps a child it does not own.
// Thread rules: one owner at a time.
#pragma once

#include <sys/types.h>

#include "common/result.h"
#include "sys/fd.h"

namespace tp::sys {

class Pidfd {
 public:
  Pidfd() = default;
  Pidfd(int fd, pid_t pid) : fd_(fd), pid_(pid) {}
  bool valid() const { return fd_.valid(); }
  int fd() const { return fd_.get(); }
  pid_t pid() const { return pid_; }
  // pidfd_send_signal; ESRCH (already exited) counts as success.
  Result<void> signal(int sig);
  // True if the process has exited (zombie or reaped). Non-blocking.
  bool exited();
  // Reaps the process (blocking unless `nohang`); returns true once reaped.
  // Idempotent: after a successful reap it returns true without a syscall.
  Result<bool> reap(bool nohang = false);
  bool reaped() const { return reaped_; }
  void close() { fd_.reset(); }

 private:
  UniqueFd fd_;
  pid_t pid_ = -1;
  bool reaped_ = false;
};

}  // namespace tp::sys
