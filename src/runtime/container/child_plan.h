// The plan a sandbox's first process executes between its clone and the agent.
//
// The daemon builds a ChildPlan (all strings, flags, argv/envp) with normal C++
// and turns it into the spawner's request (to_request(), spawn/wire.h); the
// spawner's child walks the ops (spawn/plan.h, run_child) using only raw syscalls.
// Each op carries the index of a human description ("mount(overlay, /x/root,
// lowerdir=...)") that the daemon turns into an Error when the child reports
// {step, errno} on the error pipe. The microVM tier's jails (QEMU, mkfs.erofs) run
// the same plan in a clone the daemon makes itself (in_process(), run_in_clone()):
// they exec another program, which pays its own start-up in any case.
// Thread rules: a plan is built by one thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/result.h"
#include "spawn/plan.h"
#include "spawn/wire.h"
#include "sys/seccomp.h"

namespace tp::runtime::container {

using spawn::ChildFailure;
using spawn::Op;
using spawn::OpKind;

struct ChildPlan {
  std::vector<Op> ops;
  // setrlimit ops, applied after the descriptors are moved, just before exec: a
  // low RLIMIT_NOFILE would fail the moves, since the daemon's descriptors may
  // take every number below it.
  std::vector<Op> limits;
  std::vector<std::string> steps;   // descriptions, indexed by Op::step and the exec steps below
  std::deque<std::string> strings;  // storage for the op strings (stable addresses)
  std::vector<const char*> argv, envp;  // without the terminating NULL
  const sys::SeccompProgram* seccomp = nullptr;
  // fds (numbers in the daemon's table, sent to the spawner with the request)
  int agent_child = -1;
  int exe_fd = -1;        // the agent to exec; -1: the child continues as the spawner's binary
  int cgroup_fd = -1;     // the sandbox's delegated cgroup directory, placed at fd 4 (-1: none)
  int agent_listen = -1;  // live restore: the agent's listening socket, placed at fd 5 (-1: none)
  int log_fd = -1;        // stdout and stderr of the program (-1: /dev/null, like stdin)
  uint32_t exec_steps_base = 0;  // first of the fixed exec-sequence step descriptions

  const char* keep(std::string s) { return strings.emplace_back(std::move(s)).c_str(); }
  uint32_t step(std::string desc) {
    steps.push_back(std::move(desc));
    return static_cast<uint32_t>(steps.size() - 1);
  }
  // Convenience builders; each records a description.
  void mount(const std::string& src, const std::string& target, const std::string& fstype,
             unsigned long flags, const std::string& data, bool ignore_missing = false);
  void bind_ro(const std::string& src, const std::string& target, unsigned long extra_flags,
               bool ignore_missing = false);
  void mkdir(const std::string& path, uint32_t mode);
  void touch(const std::string& path);
  void symlink(const std::string& target, const std::string& path);
  void write_file(const std::string& path, const std::string& data, bool ignore_missing);
  // Into `limits`: applied after every op and the fd moves, just before exec.
  void set_rlimit(int resource, const std::string& name, uint64_t value);
  // Into `limits`: the sandbox runs under SCHED_IDLE (best effort).
  void sched_idle();
  void move_mount(int fd, const std::string& what, const std::string& target);
  // Drops every capability: the ids of the current user namespace the program runs as.
  void set_ids(uint32_t uid, uint32_t gid);
  void simple(OpKind k, const std::string& desc, const std::string& a = {},
              unsigned long flags = 0);
  // Appends the fixed step descriptions of the exec sequence; call last.
  void finish();
  // The spawner's request for this plan: descriptors become slots of the request
  // (the caller adds the error pipe, the namespaces and the id maps).
  spawn::Request to_request() const;
  // The child's view of this plan for a clone the daemon makes itself (CLONE_VM: the
  // child uses the daemon's descriptor numbers and memory until it execs, so exe_fd
  // must be set). `sync_rd` and `err_wr` are the child's ends of its sync socket and
  // error pipe, `sync_wr` and `err_rd` the daemon's (the child closes its copies).
  // Points into this plan and into `*args` (argv and envp, NULL-terminated): keep both.
  spawn::ExecPlan in_process(int sync_rd, int sync_wr, int err_rd, int err_wr,
                             std::vector<char*>* args) const;
};

// Entry point for clone(CLONE_VM) with a spawn::ExecPlan* from ChildPlan::in_process():
// runs the plan and execs. Never returns.
int run_in_clone(void* exec_plan);

// Waits on the error pipe (`err_rd`) until the child exec'd or finished its setup
// (EOF: nothing to report) or reported a failed step: that step's description
// (`unnamed` for an unknown step), `prefix` first, as an Error.
std::optional<Error> read_child_failure(int err_rd, const ChildPlan& plan,
                                        const std::string& prefix, const char* unnamed);

// Inputs for the standard sandbox recipe.
struct RootRecipe {
  std::string id;  // hostname
  // The sandbox's cgroups: the files the child writes "0" to, to move itself in
  // (v1: each hierarchy's tasks file, which moves only the writer without the global
  // threadgroup lock a pid write takes; v2: cgroup.procs), in the order the daemon's
  // setup message (spawn/plan.h, kRecvSetup) carries them; paths for messages.
  std::vector<std::string> cgroup_entries;
  // The setup message also carries the delegated cgroup directory / the listening socket.
  bool setup_cgroup_dir = false, setup_listen = false;
  std::string mnt_dir;  // empty host dir the sandbox tmpfs is mounted on (inside the child's ns)
  std::vector<std::string> lowers;  // overlay lower dirs, top first
  // When not empty (one per lower): detached idmapped mounts of the lowers
  // (made by the parent, which alone may idmap them), attached by the child
  // at <mnt_dir>/lower/<i> and used as the overlay's lower layers instead.
  std::vector<int> lower_fds;
  std::vector<std::pair<std::string, unsigned long>>
      ro_binds;  // host path (bound at same path), locked flags to keep
  // Size of the sandbox tmpfs: the writable layer, /tmp and /dev/shm.
  uint64_t disk_bytes = 0;
  // Host directory holding /dev's nodes, symlinks and mount points (made once by
  // the backend: a user namespace cannot mknod), bound read-only as the
  // sandbox's /dev; `dev_locked`: the flags locked on its mount. Empty when the
  // data dir's file system is nodev: then /dev is a tmpfs with each host node bound.
  std::string dev_dir;
  unsigned long dev_locked = 0;
  // Empty host directory bound read-only over the masked /proc directories;
  // `prep_locked`: the flags locked on its mount.
  std::string empty_dir;
  unsigned long prep_locked = 0;
  // The entries of kMaskedProcFiles / kMaskedProcDirs this kernel has (a mount on
  // an absent one would only fail with ENOENT).
  std::vector<std::string> masked_proc_files, masked_proc_dirs;
};

// Per-sandbox limits written into the sandbox's own user namespace
// (/proc/sys/user/*, which the kernel also enforces up the namespace tree).
// inotify: a quota of the sandbox's own, below the host's per-user limit that
// its namespace's owner (the sandbox's own root uid) is also held to. No nested user namespaces,
// even through a path seccomp does not know about.
struct UserNsLimit {
  const char* name;
  const char* value;
};
extern const UserNsLimit kUserNsLimits[];

// Fills `plan->ops` with the container recipe (see container_backend.h).
void build_root_ops(const RootRecipe& r, ChildPlan* plan);

// The character devices of every sandbox's /dev (null, zero, ...), each with the
// node's fixed device number. The only device nodes a sandbox sees.
struct DeviceNode {
  const char* name;
  unsigned major, minor;
};
extern const DeviceNode kDevices[];
// /dev's symlinks: {name, target}.
extern const char* const kDevSymlinks[][2];

// Paths in /proc masked with the null device and directories masked with an empty read-only
// directory.
extern const char* const kMaskedProcFiles[];
extern const int kPtyMax;  // devpts max= of each sandbox
extern const char* const kMaskedProcDirs[];
extern const char* const kReadOnlyProcDirs[];

}  // namespace tp::runtime::container
