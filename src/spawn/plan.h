// What a sandbox's first process executes between its clone and the agent.
//
// The daemon builds the plan (runtime/container/child_plan.h: every string, flag,
// argv/envp), sends it to the spawner (spawn/wire.h, spawn/spawner.h), and the
// spawner's fork child walks it with run_child(): raw syscalls only, no allocation,
// no errno, so the same code is correct in any child. Each op carries the index of
// a human description ("mount(overlay, /x/root, lowerdir=...)") that the daemon
// turns into an Error when the child reports {step, errno} on the error pipe.
//
// The error pipe is the record of a start (ChildFailure records, then EOF):
//   {kStepHello, host pid}   the child's first act: it exists, this is its pid
//   {kStepSpawned, 0}        the spawner's last act: maps written, child released
//   {step >= 0, errno}       the plan's step that failed (the child exits)
//   {kStep* < 0, errno}      a step of the spawner's that failed (the child is killed)
//   EOF                      every writer closed it: the child finished its setup
//                            (it closes its end last) or died.
//
// Thread rules: a plan is built by one thread and read by one child.
#pragma once

#include <linux/filter.h>
#include <stdint.h>
#include <sys/types.h>

namespace tp::spawn {

enum class OpKind : uint8_t {
  kHello,         // write {kStepHello, host pid} on the error pipe (pid read from /proc/self)
  kRecvSetup,     // read the daemon's setup message from the agent socket (SetupMessage below)
  kWaitSync,      // block until the spawner wrote the id maps: one byte on the sync socket,
                  // maybe with the agent's oom_score_adj descriptor (wire.h kRequestOomFd)
  kBecomeRoot,    // setresgid(0), setgroups(0), setresuid(0) inside the new user ns
  kUnshare,       // unshare(flags)
  kSethostname,   // a
  kLoopbackUp,    // ioctl(SIOCSIFFLAGS, lo, IFF_UP)
  kMount,         // mount(a=source, b=target, c=fstype, flags, d=data)
  kMkdir,         // mkdir(a, mode) and chmod(a, mode) past the umask; EEXIST is fine (left as is)
  kTouch,         // create empty file a (mount point for a file bind), EEXIST is fine
  kSymlink,       // symlink(a=target, b=linkpath)
  kChdir,         // chdir(a)
  kPivotRoot,     // pivot_root(".", ".")
  kUmountDetach,  // umount2(a, MNT_DETACH)
  kWriteFile,     // open(a, O_WRONLY) and write the string b (sysctls of the sandbox's namespaces)
  kSetRlimit,     // prlimit64(0, resource=mode, {flags, flags}): soft = hard = flags
  kMoveMount,  // move_mount(fd, "", AT_FDCWD, a, MOVE_MOUNT_F_EMPTY_PATH): attach a detached mount
  kSchedIdle,  // sched_setscheduler(0, SCHED_IDLE): inherited by every process of the sandbox
  kSetIds,     // setresgid(mode), setgroups(0), setresuid(flags): drop to an unprivileged id
  kCount
};

struct Op {
  OpKind kind;
  bool ignore_missing = false;  // ENOENT is not an error (optional masks)
  uint32_t mode = 0;
  unsigned long flags = 0;
  const char* a = nullptr;
  const char* b = nullptr;
  const char* c = nullptr;
  const char* d = nullptr;
  uint32_t step = 0;  // index into the daemon's step descriptions
  int fd = -1;        // kMoveMount: an fd the child inherited
};

// kRecvSetup: what the daemon makes while the spawner clones (so that its work and
// the clone overlap) arrives as the first bytes on the agent socket: kSetupMagic,
// with descriptors attached (SCM_RIGHTS): Op::mode cgroup files the child writes
// "0" to, to move itself in (v1 each hierarchy's `tasks`, v2 `cgroup.procs`;
// opened by the daemon as root: the kernel checks the opener) and closes; then,
// when Op::flags has kSetupCgroupDir, the delegated cgroup directory (the agent's
// fd 4); then, with kSetupListen, the agent's listening socket (its fd 5). A failed
// write of entry i is reported as step Op::step + 1 + i. EOF instead of the message:
// the daemon gave up; the child exits.
inline constexpr char kSetupMagic[4] = {'T', 'P', 'S', 'U'};
inline constexpr unsigned long kSetupCgroupDir = 1, kSetupListen = 2;
inline constexpr uint32_t kMaxSetupFds = 16;

// A record on the error pipe (see above).
struct ChildFailure {
  int32_t step;
  int32_t err;
};

// Steps outside the plan, named by the daemon (runtime/container/spawner_client.cpp).
enum SpecialStep : int32_t {
  kStepHello = -1,     // err = the child's host pid
  kStepSpawned = -2,   // err = 0
  kStepRejected = -3,  // the spawner refused the request (malformed or over a limit)
  kStepSetEuid = -4,   // setresuid(-1, owner, -1) before the clone
  kStepClone = -5,     // clone3
  kStepUidMap = -6,    // write /proc/<pid>/uid_map
  kStepGidMap = -7,    // write /proc/<pid>/gid_map
  kStepSync = -8,      // the sync socket, or the message that releases the child
};

// Offsets from ExecPlan::exec_steps_base of the fixed steps after the ops.
enum ExecStep : uint32_t {
  kDupFds,
  kStdio,
  kAgentFd,
  kCloseRange,
  kSeccomp,
  kExec,
  kCgroupFd,
  kExecStepCount
};

// How the child ends once its ops ran.
using AgentMain = int (*)(int argc, char** argv);

// The child's view of its plan: fd numbers are the child's own.
struct ExecPlan {
  const Op* ops = nullptr;
  uint32_t n_ops = 0;
  // setrlimit (and sched_setscheduler) ops, applied after the descriptors are moved,
  // just before the agent starts: a low RLIMIT_NOFILE would fail the moves.
  const Op* limits = nullptr;
  uint32_t n_limits = 0;
  char* const* argv = nullptr;                      // NULL-terminated
  char* const* envp = nullptr;                      // NULL-terminated
  sock_fprog seccomp{};                             // len 0: no filter (no_new_privs still set)
  int sync_rd = -1, err_wr = -1, agent_child = -1;  // sync_rd: a SOCK_SEQPACKET socket
  int cgroup_fd = -1;     // the sandbox's delegated cgroup directory, placed at fd 4 (-1: none)
  int agent_listen = -1;  // live restore: the agent's listening socket, placed at fd 5 (-1: none)
  int log_fd = -1;        // stdout and stderr (-1: /dev/null, like stdin)
  // (The agent's oom_score_adj, when the spawner sends one with the release, goes to fd 6.)
  // The agent: exe_fd (an O_PATH fd, exec'd with execveat) or, when exe_fd is -1,
  // `agent_main` called in this process (the spawner is the agent binary).
  int exe_fd = -1;
  AgentMain agent_main = nullptr;
  uint32_t exec_steps_base = 0;
  // The spawner's own argv strings (what /proc/<pid>/cmdline shows): the agent
  // overwrites them with its name, so that it is not listed as a second spawner.
  char* cmdline = nullptr;
  size_t cmdline_len = 0;
  // Descriptors of the spawner the child must drop first (its socket, the sync
  // pipe's write end): holding them would hide the spawner's EOFs.
  int drop_first[2] = {-1, -1};
};

// The sandbox child: runs the plan and becomes the agent. Reports a failed step on
// the error pipe and exits 127.
[[noreturn]] void run_child(const ExecPlan& p);

}  // namespace tp::spawn
