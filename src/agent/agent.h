// tp-agent: PID 1 inside every sandbox (docs/architecture.md).
//
// What it promises:
//  - Serves the wire protocol (src/protocol/wire.h, src/protocol/README.md) on
//    one control stream at a time (--fd, default 3, then connections accepted
//    on --listen-fd), from one single-threaded poll loop
//    that never blocks on a command: pipes are non-blocking, answers go through
//    a writer queue, and a command whose unacknowledged output reaches a cap is
//    not read again until the node has acknowledged it (the pipe then
//    back-pressures it).
//  - Sends kReady (VERSION, PID, HIGH_ID, SESSION...) at the start of every session.
//  - Is not dumpable (commands cannot ptrace it or open /proc/1/fd/*); the
//    control fd is CLOEXEC and never reaches a command.
//  - Reaps every zombie reparented to it (SIGCHLD via signalfd).
//  - Runs every kExec in the agent's own pid namespace (one process world per
//    sandbox: $$, /proc/<pid>, ps and pgrep work across execs), tracked by a
//    cgroup of its own under the delegated sandbox cgroup (--cgroup-fd,
//    command_cgroup.h; without it, a command init's process group and
//    subreaper sweep, command.h): a timeout, kSignal SIGKILL, or the command's
//    main process exiting kills every process the command started, daemons
//    included. The cgroup fd is CLOEXEC and never reaches a command.
//  - Resolves file paths strictly inside its root (see resolver.h, file_ops.h).
//  - Outlives its node when given --listen-fd: when the control stream ends,
//    every command keeps running and the agent waits for a new connection on
//    the listening socket (which also replaces a live session). Answers of
//    commands are kept until the node acknowledges them and sent again to the
//    next session (session.h), so no output is lost and none is duplicated
//    for a node that acknowledges. Without a node for --orphan-timeout it kills
//    every command and exits.
//  - A malformed frame, or (without --listen-fd) the end of the control stream,
//    kills every command and ends the agent (and so the sandbox, when it is PID 1).
// Works as PID 1 of a sandbox and as a plain host process (unit tests).
//
// Thread rules: single-threaded; main() runs the agent until it ends.
#pragma once

namespace tp::agent {

// Entry point of the tp-agent binary. Returns the process exit status:
// 0 after EOF on the control stream (or --orphan-timeout), 1 after a protocol error, 2 on bad usage
// or a failed start.
int main(int argc, char** argv);

}  // namespace tp::agent
