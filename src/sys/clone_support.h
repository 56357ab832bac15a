// Helpers of the backends that clone a sandbox's first process (container, microvm):
// locked_flags(), the mount flags the kernel locks on a bind of a path made inside a
// user namespace (nosuid, nodev, noexec, atime flags of the source mount), which a
// read-only remount of that bind must repeat or fail with EPERM; and SignalBlock.
// Thread rules: locked_flags() from any thread; a SignalBlock acts on its own thread.
#pragma once

#include <pthread.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/statvfs.h>

#include <string>

namespace tp::sys {

inline unsigned long locked_flags(const std::string& path) {
  struct statvfs sv {};
  if (::statvfs(path.c_str(), &sv) != 0) return 0;
  unsigned long f = 0;
  if (sv.f_flag & ST_NOSUID) f |= MS_NOSUID;
  if (sv.f_flag & ST_NODEV) f |= MS_NODEV;
  if (sv.f_flag & ST_NOEXEC) f |= MS_NOEXEC;
  if (sv.f_flag & ST_NOATIME) f |= MS_NOATIME;
  if (sv.f_flag & ST_NODIRATIME) f |= MS_NODIRATIME;
  if (sv.f_flag & ST_RELATIME) f |= MS_RELATIME;
  return f;
}

// Blocks every signal in the calling thread for its lifetime (a clone child
// starts with this mask and sets its own dispositions before unblocking).
class SignalBlock {
 public:
  SignalBlock() {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old_);
  }
  ~SignalBlock() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  SignalBlock(const SignalBlock&) = delete;
  SignalBlock& operator=(const SignalBlock&) = delete;

 private:
  sigset_t old_;
};

}  // namespace tp::sys
