// Cgroups for sandboxes, v2 and v1 (docs/architecture.md).
//
// Layout: every sandbox gets <root>/<parent>/<id> (v2: one directory under the
// unified mount; v1: one directory per controller mount: memory, cpu, pids,
// plus cpuacct and freezer when they are mounted). Limits:
//   memory hard limit without swap (v1: memory.memsw.limit_in_bytes when it
//   exists, else memory.swappiness = 0; v2: memory.swap.max = 0), cpu quota
//   (v1 cpu.cfs_quota_us/cfs_period_us, v2 cpu.max), pids.max.
// Delegation: the sandbox's cgroup directory of one hierarchy (v2: its only
// one; v1: the freezer's) is handed to the sandbox's root (delegated_dir(),
// delegated_files(): the container backend chowns them), whose agent makes one
// cgroup per command under it (src/agent/command_cgroup.h). So a sandbox's
// cgroup may have sub-cgroups: kill_all(), procs(), remove() cover them.
// Every file operation goes through the SysApi seam, so the logic is tested
// with a fake. Paths are computed from a CgroupLayout, which detect_layout()
// reads from /proc/self/mountinfo (parse_layout() is the pure part).
//
// Thread rules: a CgroupManager holds no mutable state after construction;
// calls for different ids may run concurrently from any thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "sys/sys_api.h"

namespace tp::sys {

enum class CgroupVersion { kV1, kV2 };

struct CgroupLayout {
  CgroupVersion version = CgroupVersion::kV2;
  std::string v2_root;                           // v2: mount point of the unified hierarchy
  std::map<std::string, std::string> v1_mounts;  // v1: controller -> mount point
};

// Chooses the layout from mountinfo text: a cgroup2 mount at /sys/fs/cgroup
// (pure v2) wins; else v1 when memory, cpu and pids are mounted as v1; else a
// cgroup2 mount elsewhere (e.g. /sys/fs/cgroup/unified) whose
// cgroup.controllers (read through `sys`) offers memory and pids.
Result<CgroupLayout> parse_layout(std::string_view mountinfo, SysApi& sys);
Result<CgroupLayout> detect_layout(SysApi& sys);

struct CgroupLimits {
  uint64_t memory_bytes = 0;       // 0 = no limit
  double cpus = 0;                 // cores; <= 0 = no limit
  uint32_t pids_max = 0;           // 0 = no limit
  bool lowest_cpu_weight = false;  // best effort: v2 cpu.weight 1, v1 cpu.shares 2; cpu.idle 1
};

struct CgroupStats {
  uint64_t memory_bytes = 0;
  uint64_t memory_peak_bytes = 0;
  uint64_t cpu_usage_us = 0;
  uint64_t pids = 0;
  uint64_t oom_kills = 0;
};

inline constexpr uint64_t kCpuPeriodUs = 100000;

class CgroupManager {
 public:
  CgroupManager(SysApi& sys, CgroupLayout layout, std::string parent);

  const CgroupLayout& layout() const { return layout_; }
  // Creates the parent cgroup(s) (and, on v2, enables the controllers for them). Idempotent.
  Result<void> init();
  // Directories of sandbox `id`, one per v1 hierarchy or the single v2 one.
  std::vector<std::string> dirs(const std::string& id) const;
  // Makes the cgroup(s) of `id` and writes the limits. On failure removes what it made.
  Result<void> create(const std::string& id, const CgroupLimits& limits);
  // The two halves of create(), for a caller that writes the limits while its child
  // sets itself up (it must not run untrusted code before they are written).
  // make_dirs() removes what it made on failure; write_limits() leaves the dirs.
  Result<void> make_dirs(const std::string& id);
  Result<void> write_limits(const std::string& id, const CgroupLimits& limits);
  // Moves `pid` into every cgroup of `id`.
  Result<void> attach(const std::string& id, pid_t pid);
  // The files through which a process moves itself into every cgroup of `id` by
  // writing "0": v1 each hierarchy's `tasks` (the kernel then migrates only the
  // writer, without the global threadgroup lock whose writer waits for an RCU grace
  // period: a pid written to cgroup.procs took up to 17 ms under load here, "0" to
  // tasks stays under 0.1 ms); v2 the one cgroup.procs.
  std::vector<std::string> entry_files(const std::string& id) const;
  // v1 only (a v2 domain cgroup takes whole processes, never one thread of one):
  // whether enter_thread() can be used instead of attach().
  bool can_enter_thread() const { return layout_.version == CgroupVersion::kV1; }
  // Moves the calling thread, and only it, into every cgroup of `id`, so that a
  // child it clones is born there. It writes "0" to each `tasks` file: the kernel
  // migrates only `current` then, without the global threadgroup lock whose
  // writer waits for an RCU grace period (measured here: a pid written to
  // cgroup.procs took up to 17 ms under load; "0" to tasks stays under 0.1 ms).
  // Returns the thread's previous cgroup directories, for leave_thread(). On
  // failure the thread is back where it was.
  Result<std::vector<std::string>> enter_thread(const std::string& id);
  // Moves the calling thread back into `previous` (from enter_thread). Where that
  // fails it falls back to the hierarchy's root cgroup (logged), so that the
  // thread does not stay in a sandbox's cgroup, whose kill would kill the daemon.
  // An error means the thread may still be in there.
  Result<void> leave_thread(const std::vector<std::string>& previous);
  Result<CgroupStats> stats(const std::string& id);
  // Pushes as much of `id`'s memory out as the host allows (a paused sandbox):
  // v2 memory.reclaim (page cache; anonymous and tmpfs pages only where there
  // is swap), v1 memory.force_empty (the same, from a cgroup with tasks). Best
  // effort: a partial reclaim is not an error. Answers the bytes charged after.
  Result<uint64_t> reclaim_memory(const std::string& id);
  // OOM kills in the sandbox so far: one file read (the exec path asks around every command).
  Result<uint64_t> oom_kills(const std::string& id);
  // The directory delegated to sandbox `id`'s root: v2 the sandbox's cgroup, v1
  // its freezer cgroup; empty when v1 has no freezer hierarchy (the agent then
  // falls back to process groups).
  std::string delegated_dir(const std::string& id) const;
  // Files of delegated_dir() its owner needs (besides the directory itself):
  // v2 cgroup.procs, cgroup.subtree_control, cgroup.threads, cgroup.kill; v1
  // cgroup.procs, tasks, freezer.state. Some may not exist on older kernels.
  std::vector<std::string> delegated_files() const;
  // The sandbox's memory and pids cgroup directories (v1; v2: its one directory), for
  // delegating them too (SandboxSpec::nested_isolation).
  std::vector<std::string> limit_dirs(const std::string& id) const;
  // v1: thaws every cgroup under the sandbox's freezer cgroup, so that tasks of
  // a command cgroup its agent froze (and was killed before thawing) can die.
  // No-op on v2, whose frozen tasks die of SIGKILL.
  void thaw_subtree(const std::string& id);
  // Pids in the sandbox's cgroup and its sub-cgroups (host pids).
  Result<std::vector<pid_t>> procs(const std::string& id);
  // Kills every process of `id` (v2 cgroup.kill; else freeze, SIGKILL each, thaw) and
  // waits until the cgroup is empty (bounded: kUnavailable if processes remain).
  Result<void> kill_all(const std::string& id);
  // Removes the cgroup(s) of `id`, sub-cgroups first. Idempotent (missing dirs are fine). Retries
  // EBUSY (tasks still exiting) up to `busy_polls` times, 0.5 ms apart.
  Result<void> remove(const std::string& id, int busy_polls = 2000);
  // Ids that have a cgroup under the parent in any hierarchy.
  std::vector<std::string> list();
  // Removes the parent cgroup(s) when no sandbox cgroup is left under them
  // (called when the backend shuts down, so that nothing of it remains).
  void remove_parent_if_empty();

 private:
  std::vector<std::string> hierarchy_roots() const;  // unique mount points in use
  std::string controller_dir(const std::string& ctrl, const std::string& id) const;
  Result<bool> empty(const std::string& id);
  // `dir` and every cgroup below it, parents first.
  std::vector<std::string> subtree(const std::string& dir);

  SysApi& sys_;
  CgroupLayout layout_;
  std::string parent_;
};

// Parses "key value" lines (memory.events, cpu.stat, memory.oom_control); 0 if absent.
uint64_t keyed_value(std::string_view text, std::string_view key);

}  // namespace tp::sys

// Freezing a sandbox's processes (live restore: a consistent pause; the
// daemon's freeze/thaw of an instance). v2: <cgroup>/cgroup.freeze, settled
// when cgroup.events says "frozen 1"/"frozen 0"; v1: the freezer hierarchy's
// freezer.state (FROZEN / THAWED; FREEZING while in progress).
namespace tp::sys {
// The directory whose files freeze `id`; "" when v1 has no freezer mounted.
std::string freezer_dir(const CgroupManager& m, const std::string& id);
// Freezes (true) or thaws (false) every process of `id` and waits until the
// kernel reports it done (bounded: kUnavailable after about 5 s, then the
// request stays written). kInvalidArgument without a freezer; kNotFound when
// the cgroup does not exist.
Result<void> set_frozen(SysApi& sys, const CgroupManager& m, const std::string& id, bool frozen);
// Whether `id` is frozen now (a v1 FREEZING counts as not frozen).
Result<bool> is_frozen(SysApi& sys, const CgroupManager& m, const std::string& id);
// Whether a freeze of `id` was asked for and not undone, done or still under way (v1
// FROZEN or FREEZING, v2 cgroup.freeze 1). A daemon killed during set_frozen leaves
// the latter: on v1 a task that went to sleep unfreezable just after the freeze began
// (a vfork parent) keeps the cgroup FREEZING until FROZEN or THAWED is written again.
Result<bool> freeze_requested(SysApi& sys, const CgroupManager& m, const std::string& id);
}  // namespace tp::sys
