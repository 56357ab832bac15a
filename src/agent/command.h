// Starting one command of a kExec, and the tiny "command init" that owns it.
//
// Layout of a running command (pid-namespace mode, the default):
//
//   tp-agent ──fork after unshare(CLONE_NEWPID)──> command init (PID 1 of a new
//   pid namespace) ──vfork──> the command (PID 2) ──> its children, daemons...
//
// The command init reaps everything in its namespace and reports the command's
// wait status, peak RSS (getrusage RUSAGE_CHILDREN) and wall time to the agent.
// When the command's main process exits, the init kills the rest of its
// namespace and exits; the kernel then guarantees no process of the command
// survives (setsid/double-fork cannot escape a pid namespace). So background
// work must be started as its own exec. Killing the init with SIGKILL (agent
// shutdown, PDEATHSIG when the agent dies) also kills the whole namespace.
//
// Fallback mode, when unshare(CLONE_NEWPID) is not permitted (unprivileged
// unit tests): the init is a child subreaper, the command leads its own
// session/process group, and "kill everything" is SIGKILL to that group plus a
// top-down sweep of the init's children (orphans are reparented to the init)
// until none is left. Signals are forwarded to the group and to reparented
// orphans.
//
// Channels (internal to the agent, not part of the wire protocol), both
// SOCK_SEQPACKET socketpairs created by the agent:
//   exec channel: the command sends ExecHello (with SCM_CREDENTIALS, so the
//     agent learns its pid in the agent's own namespace) right after fork and
//     an ExecFailure when a step before execve fails. The command's end is
//     CLOEXEC, so EOF without a failure means execve succeeded.
//   init channel: agent -> init InitRequest (forward a signal, kill all);
//     init -> agent InitReport once the command is over. EOF on the init's side
//     (agent gone) makes the init kill everything and exit.
//
// The command's process: new session, stdin/stdout/stderr on pipes, every
// other fd closed at exec, signal mask and dispositions reset, umask 022,
// CAP_SYS_PTRACE dropped from the bounding, effective, permitted and
// inheritable sets, supplementary groups cleared, setresgid/setresuid to the
// requested ids (an agent that is not root cannot switch: it runs commands as
// itself when the default ids 0 are asked for), no_new_privs, chdir(cwd), execve (PATH search of the
// command's own environment when argv[0] has no '/').
//
// Thread rules: spawn_command must be called from a single-threaded process
// (it forks); the agent is one.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

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
  char op = 'S';        // 'S' forward signal, 'K' kill everything
  int32_t signo = 0;
};
struct InitReport {
  char op = 'X';
  int32_t wait_status = 0;  // as from waitpid()
  uint64_t max_rss_kb = 0;
  uint64_t wall_us = 0;
};

struct Spawned {
  pid_t init_pid = -1;  // in the agent's pid namespace
  bool pid_ns = false;  // the init leads its own pid namespace
  sys::UniqueFd stdin_w;    // non-blocking
  sys::UniqueFd stdout_r;   // non-blocking
  sys::UniqueFd stderr_r;   // non-blocking
  sys::UniqueFd exec_chan;  // agent end, SO_PASSCRED set
  sys::UniqueFd init_chan;  // agent end
};

// Starts the command init and the command. `try_pid_ns` false forces the
// fallback mode. Errors are failures of the agent's own calls (pipe, fork);
// failures inside the command arrive later as ExecFailure.
Result<Spawned> spawn_command(const ExecSpec& spec, bool try_pid_ns);

}  // namespace tp::agent
