// Command line of tp-agent.
//
//   tp-agent [--fd N] [--listen-fd N] [--orphan-timeout S] [--root DIR] [--cgroup-fd N]
//            [--serial] [--oom-fd N] [--resolve auto|openat2|walk]
//
//   --fd N        the control stream (default 3)
//   --listen-fd N a listening unix stream socket: when the control stream ends
//                 the agent keeps its commands and waits for the node to
//                 connect again there (a new connection also replaces a live
//                 one). Without it, the end of the control stream ends the agent.
//   --orphan-timeout S  with --listen-fd: after S seconds without a node
//                 (default 3600) the agent kills every command and exits
//   --root DIR    resolve file paths under DIR instead of "/" (tests; commands
//                 still run in the agent's own root and cwd)
//   --cgroup-fd N a directory fd of the sandbox's delegated cgroup (v2, or the
//                 v1 freezer hierarchy): each command gets a cgroup under it
//                 (command_cgroup.h). Without it (a plain host process, unit
//                 tests) commands run under command inits (command.h, fallback)
//   --serial      the control stream is a virtio-serial port (the microvm tier):
//                 it is never closed, EOF means "no host connected", and a
//                 session starts whenever a host connects (src/protocol/README.md,
//                 "VM clones"). No --orphan-timeout. Excludes --listen-fd.
//   --oom-fd N    the agent's own /proc/<pid>/oom_score_adj opened read-write (by the
//                 spawner, as host root): commands are then born above the agent's
//                 score (command.h, set_oom_score_fd)
//   --resolve M   test-only: force the path resolver (default auto)
//
// Thread rules: pure function.
#pragma once

#include <string>

#include "agent/resolver.h"
#include "common/result.h"

namespace tp::agent {

struct Options {
  int fd = 3;
  int listen_fd = -1;
  unsigned orphan_timeout_s = 3600;
  std::string root = "/";
  int cgroup_fd = -1;  // -1: none
  bool serial = false;
  int oom_fd = -1;  // -1: none
  Resolver::Mode resolve = Resolver::Mode::kAuto;
};

Result<Options> parse_options(int argc, char** argv);

}  // namespace tp::agent
