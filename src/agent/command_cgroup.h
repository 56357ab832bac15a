// The cgroup of one command: how the agent tracks and kills a command's whole
// process tree while every command shares the sandbox's pid namespace.
//
// The container backend delegates the sandbox's cgroup directory (cgroup v2:
// the unified one; v1: the freezer hierarchy's) to the sandbox's root and
// passes the agent an O_DIRECTORY fd of it (--cgroup-fd). For each command the
// agent makes a child cgroup c<N> there (mkdirat); the command's process moves
// itself into it before execve (join_file(), "0" = the writer), so everything
// it ever starts, daemons and setsid escapes included, is born inside. The
// agent kills through it (v2: cgroup.kill; v2 before 5.14 and v1: freeze,
// SIGKILL every member, thaw) and removes it once it is empty.
//
// The command cgroups carry no controllers: memory, cpu and pids limits stay on
// the sandbox's cgroup, which contains them.
//
// Thread rules: the agent is single-threaded; CgroupRoot is read-only after
// probe(). join_file() and the fds are used by the command's vfork child
// before its execve (no allocation there).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"
#include "sys/fd.h"

namespace tp::agent {

enum class CgroupKind : uint8_t {
  kV1Freezer,  // cgroup v1, freezer hierarchy
  kV2,         // cgroup v2 with cgroup.kill (Linux >= 5.14)
  kV2Freeze,   // cgroup v2 without cgroup.kill: freeze, kill each, thaw
};

// The delegated sandbox cgroup directory, as the agent got it.
struct CgroupRoot {
  int fd = -1;  // borrowed: the agent keeps it open (CLOEXEC) for its whole life
  CgroupKind kind = CgroupKind::kV2;
};

// Checks that `fd` is a directory of a cgroup v2 file system, or of a v1
// freezer hierarchy, and which kill method it offers.
Result<CgroupRoot> probe_cgroup_root(int fd);

class CommandCgroup {
 public:
  CommandCgroup() = default;
  CommandCgroup(CommandCgroup&& o) noexcept;
  CommandCgroup& operator=(CommandCgroup&& o) noexcept;
  CommandCgroup(const CommandCgroup&) = delete;
  CommandCgroup& operator=(const CommandCgroup&) = delete;
  // Removes the directory if still there (it must be empty by then).
  ~CommandCgroup();

  // mkdirat(root, "c<seq>") and opens it. EEXIST (a leftover of an earlier
  // agent) is emptied and reused.
  static Result<CommandCgroup> make(const CgroupRoot& root, uint64_t seq);

  bool valid() const { return dir_.valid(); }
  int dir_fd() const { return dir_.get(); }
  const std::string& name() const { return name_; }
  // The file the command's process writes "0" to, relative to dir_fd(): v1
  // "tasks" (moves only the writer, without the global threadgroup lock, and a
  // vfork child is a one-thread process), v2 "cgroup.procs".
  const char* join_file() const;

  // Member pids (in the reader's pid namespace) into `out`; false when the
  // member list could not be read.
  bool read_pids(std::vector<pid_t>* out) const;
  std::vector<pid_t> pids() const;
  // No member left (zombies are not members). A read error counts as not empty.
  bool empty() const;
  // SIGKILL to every member, atomically with respect to forks where the kernel
  // allows (cgroup.kill, freezer). Does not wait.
  void kill_all() const;
  // `sig` to every member (one read of the member list).
  void signal_all(int sig) const;
  // rmdir; retries EBUSY briefly (a member still leaving). Idempotent.
  Result<void> remove();

 private:
  void set_frozen(bool frozen) const;

  int root_fd_ = -1;
  CgroupKind kind_ = CgroupKind::kV2;
  std::string name_;
  sys::UniqueFd dir_;
};

}  // namespace tp::agent
