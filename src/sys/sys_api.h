// The syscall seam: file-system and process calls that the runtime's testable
// logic (cgroup management, orphan cleanup) makes, behind an interface with a
// real implementation and a fake (tests/unit/sys/fake_sys_api.h), so that logic
// is unit-tested without root (docs/architecture.md).
//
// Every failing call returns an Error whose context names the call and its
// arguments, e.g. "write(/sys/fs/cgroup/memory/x/memory.limit_in_bytes, \"1\")".
// Thread rules: the real implementation is stateless and safe from any thread.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/result.h"

namespace tp::sys {

class SysApi {
 public:
  virtual ~SysApi() = default;
  // Writes `data` to an existing file (no O_CREAT, no truncation semantics beyond the kernel's).
  virtual Result<void> write_file(const std::string& path, const std::string& data) = 0;
  virtual Result<std::string> read_file(const std::string& path) = 0;
  virtual Result<void> mkdir(const std::string& path, mode_t mode) = 0;
  virtual Result<void> rmdir(const std::string& path) = 0;
  virtual bool exists(const std::string& path) = 0;
  // Names of the sub-directories of `path` (not recursive).
  virtual Result<std::vector<std::string>> list_dirs(const std::string& path) = 0;
  virtual Result<void> kill(pid_t pid, int sig) = 0;
  // Sleeps a little between polls (a fake returns at once).
  virtual void pause_us(unsigned us) = 0;
};

// The process-wide real implementation.
SysApi& real_sys();

// The whole of the file at `path`, opened with O_RDONLY | O_CLOEXEC | `extra_flags`
// (e.g. O_NOFOLLOW). A failed open keeps its errno in the Error (ENOENT: missing).
Result<std::string> read_whole_file(const std::string& path, int extra_flags = 0);

}  // namespace tp::sys
