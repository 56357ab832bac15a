// HostReader: who asks the daemon to read a host path (an image directory, an
// archive, a build spec's files), and the one way such paths are read.
//
// The daemon runs as root; its clients do not. A host path named in a request
// is therefore never opened by the daemon itself: a child process reads it,
// running with the client's uid, gid and groups (SO_PEERCRED on the unix
// socket), no capabilities and no_new_privs, so it sees exactly what the
// client could. An admin key over TCP has no host identity: it may read paths
// under the configured import roots only (as root: the roots are the
// operator's choice). Every other caller is refused.
//
// Thread rules: HostReader is a plain value. The functions may run on any
// thread; they block until the child is started (not until it ends).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "common/result.h"
#include "sys/fd.h"

namespace tp::sys {

struct HostReader {
  // Set: read as this client (unix-socket peer). Unset: only under `roots`.
  std::optional<uid_t> uid;
  gid_t gid = 0;
  std::vector<gid_t> groups;
  std::vector<std::string> roots;  // absolute, canonical import roots (admin over TCP)
  std::string refused;             // non-empty: every host path is refused with this reason

  static HostReader refuse(std::string why) {
    HostReader r;
    r.refused = std::move(why);
    return r;
  }
  static HostReader peer(uid_t u, gid_t g, std::vector<gid_t> gs) {
    HostReader r;
    r.uid = u;
    r.gid = g;
    r.groups = std::move(gs);
    return r;
  }
  static HostReader under(std::vector<std::string> import_roots) {
    HostReader r;
    r.roots = std::move(import_roots);
    if (r.roots.empty()) r.refused = "no import roots are configured for API keys (--import-root)";
    return r;
  }
};

// A child reading a host path for the daemon: its stdout, and its pid to reap.
class HostRead {
 public:
  HostRead() = default;
  HostRead(pid_t pid, UniqueFd out, UniqueFd err, std::string what)
      : pid_(pid), out_(std::move(out)), err_(std::move(err)), what_(std::move(what)) {}
  HostRead(HostRead&& o) noexcept;
  HostRead& operator=(HostRead&& o) noexcept;
  ~HostRead();  // kills and reaps a child still running
  int fd() const { return out_.get(); }
  // Waits for the child; an error names the path and carries the child's stderr
  // (e.g. "Permission denied"): kPermissionDenied, kNotFound or kInvalidArgument.
  Result<void> finish();

 private:
  pid_t pid_ = -1;
  UniqueFd out_, err_;
  std::string what_;  // the path, for errors
};

// Checks the reader may name `path` at all: an absolute path, the reader not
// refused, and for import roots the canonical path under one of them. Returns
// the path to read (canonical for roots). Errors: kInvalidArgument (not
// absolute), kPermissionDenied (refused or outside the roots), kNotFound.
Result<std::string> check_host_path(const HostReader& who, const std::string& path);

// A tar stream (POSIX format, owners kept numerically, symlinks archived as
// links and never followed, mount points below `path` not entered) of the
// file or directory tree at `path`, members named relative to it ("./..."). Read fd() to the end,
// then finish().
Result<HostRead> read_host_tar(const HostReader& who, const std::string& path);
// The bytes of the regular file at `path`, read as `who`.
Result<HostRead> read_host_file(const HostReader& who, const std::string& path);

}  // namespace tp::sys
