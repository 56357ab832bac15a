// Resolver: opens paths of the sandbox strictly inside one root directory.
//
// Promise: no path given to a Resolver can reach a file outside its root,
// whatever `..` components, absolute or relative symlinks, or /proc magic
// links (/proc/self/root, /proc/<pid>/fd/N) it contains: `..` stops at the
// root, absolute symlinks restart at the root, magic links are refused
// (ELOOP -> invalid_argument). It uses openat2(RESOLVE_IN_ROOT |
// RESOLVE_NO_MAGICLINKS) when the kernel has it, else (and for a path whose openat2
// concurrent renames keep spoiling: kOpenat2Retries) a component-wise walk
// over directory fds that opens every component with O_NOFOLLOW and expands
// symlinks itself (same semantics; a component swapped for a symlink between
// the walk and the final open fails with ELOOP rather than being followed).
//
// Paths given to it must be absolute, non-empty and NUL-free (check_path).
// Errors are Result values whose context names the call and path and whose
// sys_errno is the failing errno.
//
// Thread rules: const methods may run concurrently; the agent uses one thread.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>
#include <utility>

#include "common/result.h"
#include "sys/fd.h"  // header-only, libc only: fine for the static agent

namespace tp::agent {

class Resolver {
 public:
  enum class Mode { kAuto, kOpenat2, kWalk };

  // Opens `root_dir` (O_PATH) as the root. kAuto probes openat2 once and falls
  // back to kWalk when the kernel (or a seccomp filter) refuses it.
  static Result<Resolver> open_root(const std::string& root_dir, Mode mode = Mode::kAuto);

  // invalid_argument unless `path` is absolute, non-empty and has no NUL byte.
  static Result<void> check_path(std::string_view path);

  // Splits an absolute path lexically into (directory, last name). Trailing
  // slashes are ignored. The name is empty when the path has no last name that
  // could be created or removed: "/" itself, or a last component "." or "..".
  static std::pair<std::string, std::string> split_last(std::string_view path);

  // Opens `path` following symlinks inside the root; O_CLOEXEC is always added.
  // With O_CREAT, `mode` applies to a new file.
  Result<sys::UniqueFd> open(std::string_view path, int flags, mode_t mode = 0) const;

  // The directory that holds the last name of `path` (O_PATH fd) and that
  // name, for *at() calls that must not follow the last component. `name` is
  // empty in the cases split_last describes; `dir` is then the path itself.
  struct Parent {
    sys::UniqueFd dir;
    std::string name;
  };
  Result<Parent> parent(std::string_view path) const;

  int root_fd() const { return root_.get(); }
  // openat2 tries that a concurrent rename may spoil (EAGAIN) before open() falls
  // back to the walk.
  static constexpr int kOpenat2Retries = 16;
  bool uses_openat2() const { return use_openat2_; }

 private:
  Resolver(sys::UniqueFd root, bool use_openat2)
      : root_(std::move(root)), use_openat2_(use_openat2) {}
  Result<sys::UniqueFd> open_openat2(std::string_view path, int flags, mode_t mode) const;
  Result<sys::UniqueFd> open_walk(std::string_view path, int flags, mode_t mode) const;

  sys::UniqueFd root_;
  bool use_openat2_ = true;
};

}  // namespace tp::agent
