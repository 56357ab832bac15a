// Starting one command of a kExec.
//
// Every command shares the sandbox's pid namespace (the agent's): `$$`,
// /proc/<pid>, ps, pgrep and kill behave as on any Linux machine, across
// execs too. A command's process tree is tracked by a cgroup instead
// (command_cgroup.h), in one of two modes:
//
// Cgroup mode (the agent got --cgroup-fd; every sandbox): the agent starts
// the command directly with clone(CLONE_VM | CLONE_VFORK) on a stack of its
// own: no copy of the agent's page tables, and the agent resumes only once the
// child has called execve or given up. The child moves itself into the
// command's cgroup first, and a failure before execve is written to memory the
// agent shares with it (CLONE_VM) before _exit(127), so spawn_command() knows
// synchronously whether the command started. The agent (PID 1, which reaps
// everything) waits for the main pid itself; peak RSS comes from wait4's rusage.
//
// Fallback mode (no cgroup fd: unit tests running the agent as a plain host
// process): a tiny "command init" forked by the agent is a child subreaper,
// the command (vforked by the init) leads its own session/process group, and
// "kill everything" is SIGKILL to that group plus a top-down sweep of the
// init's children (orphans are reparented to the init) until none is left.
// Signals are forwarded to the group and to reparented orphans. Channels
// (SOCK_SEQPACKET socketpairs, internal to the agent):
//   exec channel: the command sends ExecHello (with SCM_CREDENTIALS, so the
//     agent learns its pid) right after the vfork and an ExecFailure when a
//     step before execve fails. The command's end is CLOEXEC, so EOF without
//     a failure means execve succeeded.
//   init channel: agent -> init InitRequest (forward a signal, kill all);
//     init -> agent InitReport once the command is over. EOF on the init's side
//     (agent gone) makes the init kill everything and exit.
//
// The command's process, in both modes: (cgroup mode: joins its cgroup) new
// session, stdin/stdout/stderr on pipes, every other fd closed at exec, signal
// mask and dispositions reset, umask 022, CAP_SYS_PTRACE dropped from the
// bounding, effective, permitted and inheritable sets, supplementary groups
// cleared, setresgid/setresuid to the requested ids (an agent that is not root
// cannot switch: it runs commands as itself when the default ids 0 are asked
// for), PR_SET_PDEATHSIG SIGKILL (the command dies with its parent, the agent
// or the fallback's init: what matters for an agent that is not PID 1),
// no_new_privs, chdir(cwd), execve (PATH search of the command's own
// environment when argv[0] has no '/').
//
// Thread rules: spawn_command must be called from a single-threaded process
// (it vforks and forks); the agent is one.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "agent/command_cgroup.h"
#include "common/result.h"
#include "sys/fd.h"  // header-only, libc only: fine for the static agent

namespace tp::agent {

inline constexpr const char* kDefaultPath =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

struct ExecSpec {
  std::vector<std::string> argv;
  std::vector<std::string> env;  // final environment, see build_env
  std::string cwd = "/";
  uint32_t uid = 0;
  uint32_t gid = 0;
};

// The environment of a command: `given` ("K=V" entries) when non-empty, else
// PATH=kDefaultPath, LANG=C.UTF-8; HOME is added when missing (/root for uid
// 0, / otherwise).
std::vector<std::string> build_env(const std::vector<std::string>& given, uint32_t uid);

// Paths to try for execve: argv0 itself when it contains '/', else each
// directory of `path_var` (an empty entry means the current directory).
std::vector<std::string> exec_candidates(std::string_view argv0, std::string_view path_var);

// The value of PATH in an environment, or kDefaultPath when absent.
std::string path_of_env(const std::vector<std::string>& env);

// Messages on the internal channels.
struct ExecHello {
  char op = 'P';
};
struct ExecFailure {
  char op = 'E';
  int32_t err = 0;
  char what[120] = {};  // "chdir /x", "execve sh", ...
};
struct InitRequest {
  char op = 'S';  // 'S' forward signal, 'K' kill everything
  int32_t signo = 0;
};
struct InitReport {
  char op = 'X';
  int32_t wait_status = 0;  // as from waitpid()
  uint64_t max_rss_kb = 0;
  uint64_t wall_us = 0;
};

struct Spawned {
  // Cgroup mode: the command's main pid. Fallback: the command init's pid
  // (the command's own pid arrives on the exec channel).
  pid_t pid = -1;
  bool via_init = false;   // fallback mode
  sys::UniqueFd stdin_w;   // non-blocking
  sys::UniqueFd stdout_r;  // non-blocking
  sys::UniqueFd stderr_r;  // non-blocking
  // Cgroup mode.
  CommandCgroup cgroup;
  bool failed = false;  // the child gave up before execve: `failure` says why
  ExecFailure failure;
  // Fallback mode.
  sys::UniqueFd exec_chan;  // agent end, SO_PASSCRED set
  sys::UniqueFd init_chan;  // agent end
};

// Starts the command: in its own cgroup under `cgroup_root` (cgroup mode) or,
// when `cgroup_root` is null, under a command init (fallback). The cgroup is
// `spare` when that is a valid, empty cgroup of an earlier command (moved from;
// see CommandCgroup), else a new one named c<seq>, unique for the agent's life.
// Errors are failures of the agent's own calls (pipe, mkdir, clone); a failure
// inside the command is Spawned::failed (cgroup mode) or arrives later as
// ExecFailure (fallback).
Result<Spawned> spawn_command(const ExecSpec& spec, const CgroupRoot* cgroup_root, uint64_t seq,
                              CommandCgroup* spare = nullptr);

// Commands start at oom_score_adj 500, above the agent, so that the OOM killer picks
// them and not the agent. A command raises its own score before its exec, which works
// when the agent was exec'd in the sandbox's user namespace. A forked agent (the
// spawner's child) owns a memory of the host's user namespace, so before its exec a
// child's /proc files are host root's and that write fails: such an agent is given
// `fd`, its own oom_score_adj opened for reading and writing by the spawner (host root), and
// spawn_command raises the agent to 500 for the clone (the command is born at 500)
// and puts it back after (lowering to its own earlier value needs no privilege).
// Reads the agent's current score through `fd`. Call once, before any spawn_command.
void set_oom_score_fd(int fd);

}  // namespace tp::agent
