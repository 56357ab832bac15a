// The spawner: tp-agent started once per daemon as `tp-agent --spawner --fd N`
// (docs/architecture.md, "A sandbox is a chain of owned resources"). It starts every
// container sandbox's first process, so that the agent binary's start-up (static
// glibc probes the CPU's caches with ~90 cpuid instructions, each a VM exit on a
// guest) is paid once per daemon and not once per sandbox, and so that the
// daemon, a large threaded process, never forks.
//
// What it promises:
//  - Root in the daemon's (init) namespaces, single-threaded, not dumpable; named
//    tp-spawner. It serves requests (spawn/wire.h) on fd N, a SOCK_SEQPACKET socket
//    whose other end only the daemon holds, one at a time, and exits at EOF (the
//    daemon went away, e.g. `kill -9`): its sandboxes are not its children and keep
//    running.
//  - Per request: it clones with CLONE_PARENT (the sandbox's init is the daemon's
//    child, reaped by the daemon through its pidfd), the request's namespaces and
//    its effective uid switched to the request's owner (so the user namespace is
//    owned by the sandbox's root, not by host root), writes the child's uid_map and
//    gid_map, releases it and writes {kStepSpawned} on the request's error pipe;
//    any failure is a record on that pipe ({kStep*, errno}) after which the child
//    (if any) is killed. It then closes every descriptor of the request and drops
//    the pages the request was read into, so it holds nothing of one sandbox when
//    it starts the next.
//  - The child (spawn/plan.h, run_child) first drops the spawner's descriptors,
//    reports its pid, runs its plan and either execs the agent the request names or,
//    when the request names none, calls `agent_main` with the request's argv: the
//    agent is then this very binary with its libc initialised.
//  - It is oom_score_adj -999 (when root may lower it), which every child inherits:
//    the agent is never the OOM victim of its own sandbox's limit.
//  - A malformed request (spawn/wire.h decode) is refused with {kStepRejected, EINVAL}
//    when its error pipe is known, and logged; the spawner goes on serving.
//
// Thread rules: single-threaded; main() runs until EOF on its socket.
#pragma once

#include "spawn/plan.h"

namespace tp::spawn {

// `argv`: tp-agent --spawner [--fd N] (default 3). Writes one byte ('R') on the
// socket once it is ready to serve. Returns the exit status.
int spawner_main(int argc, char** argv, AgentMain agent_main);

}  // namespace tp::spawn
