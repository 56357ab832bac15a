// The container tier (docs/architecture.md): native Linux namespaces (user,
// mount, pid, uts, ipc, net with loopback only, cgroup), cgroups v2 or v1,
// an overlayfs root over read-only layers, seccomp, no_new_privs.
//
// How a sandbox starts: the daemon never forks. create() precomputes every
// string, the id maps and the seccomp program into a plan (child_plan.h) and
// sends it to the spawner (spawner_client.h, src/spawn/spawner.h), a
// single-threaded tp-agent started once per backend, root in the daemon's
// namespaces. The spawner clones the sandbox's init with CLONE_PARENT (so it is
// the daemon's child, reaped through its pidfd) and the new namespaces, with its
// own effective uid switched to the sandbox's root for the clone (the user
// namespace's owner: see below). The child reports its pid, reads the daemon's
// setup message from the agent socket (the cgroups and the agent's listening socket,
// made while the spawner cloned), moves itself into its cgroups (writing "0" to
// files the daemon opened) and waits on a pipe while the
// spawner writes uid_map/gid_map (sandbox root = the first id of the sandbox's own
// 65536-id host range, SandboxSpec::uid_base; see "Ids" below); the daemon writes
// the cgroup limits meanwhile. Then the child builds the root inside its own
// mount namespace (setting, through the sandbox's own /proc once mounted, the
// limits of its user namespace: /proc/sys/user, inotify quota, no nested user
// namespaces), so nothing is ever mounted on the host and every
// mount vanishes with the namespace:
//   / made rprivate; a tmpfs of spec.disk_bytes on <data_dir>/containers/mnt
//   (one empty host dir serves every sandbox, each mounts it in its own ns)
//   holding upper/, work/, lower/<i> and root/; the lower layers (spec.layers
//   are digests, resolved to directories through opts.layers) attached at
//   lower/<i> as idmapped mounts; overlay(lower/<i>..., upper) on root/;
//   read-only binds of host /usr for the `host` image; /proc with /proc/sys
//   read-only and sensitive files masked (binds of the null device and of an
//   empty read-only directory); a minimal /dev: one read-only bind of
//   <data_dir>/containers/dev, which the backend fills once with root-owned
//   nodes (null, zero, full, random, urandom, tty), symlinks and mount points,
//   plus devpts newinstance (a data dir on a nodev file system cannot hold
//   working nodes: then /dev is a tmpfs with each host node bound); /tmp and
//   /dev/shm binds of tmp/ and shm/ of the sandbox tmpfs, so within disk_bytes
//   (spec.tmp_bytes is the microvm tier's); pivot_root; old root detached.
// NOTE: the writable layer (and /tmp, /dev/shm) lives in memory and is charged
// to the sandbox's memory cgroup. Writes beyond disk_bytes fail with ENOSPC.
// The agent is not inside the sandbox's tree and cannot be overwritten from
// inside: when it is the spawner's own binary the child, once its root is built,
// closes every descriptor but its own, loads seccomp and simply goes on as the
// agent (no exec: the binary's libc start-up was paid once, by the spawner);
// another agent_path (tests' stand-in agents) is opened O_PATH by the backend
// and exec'd with execveat(AT_EMPTY_PATH). It runs as PID 1 with argv
// `tp-agent --fd 3 --cgroup-fd 4 --listen-fd 5 --oom-fd 6` (fd 6: its own
// oom_score_adj, opened by the spawner; only for the spawner's own binary), fd 3 being its end of a
// socketpair (agent_fd() is ours), fd 5 a unix socket listening at
// <run_dir>/<id>.sock (a root-only directory, ContainerOptions::run_dir; the
// socket's xattr holds the init's pid and start time for adopt(): run_state.h) where a restarted
// daemon connects again (agent_address()), stdin/stdout/stderr on /dev/null, environment = spec.env
// plus PATH and HOME defaults. Setup failures in the child come back through a CLOEXEC pipe as
// (step, errno), so create() returns e.g. "mount(overlay, .../root, lowerdir=...): ..." after
// unwinding everything. Cgroup delegation: the sandbox's cgroup directory (v2; v1: the freezer one,
// CgroupManager::delegated_dir) and the files a delegatee writes are chowned to
// the sandbox's root, and the agent gets an O_DIRECTORY fd of it as fd 4 with
// `--cgroup-fd 4`: it makes one cgroup per command there (src/agent/
// command_cgroup.h). The sandbox has no cgroupfs of its own (no /sys, mount is
// denied by seccomp), so only the agent reaches it. destroy() removes those
// sub-cgroups with the sandbox's, thawing (v1) any its agent left frozen.
//
// The clone runs with the spawner's effective uid switched to the sandbox's
// root, so the user namespace is owned by it: the kernel charges a namespace's
// per-user counters (inotify, fanotify, mqueue, pending signals, processes) to
// its owner up the tree, and a root-owned namespace would let a sandbox drain
// host root's budgets. The spawner refuses any request whose clone would not
// make a new user namespace owned by an id other than host root.
// The child joins its cgroups itself, just after the clone: what the kernel
// allocates in the clone (the namespaces, the task) is charged to the daemon's
// cgroups, not the sandbox's; everything the sandbox does after is the sandbox's.
//
// Ids. Each sandbox gets its own host range (the node allocates it:
// node/uid_ranges.h), so that per-user kernel limits (pipe buffer pages,
// fanotify groups, inotify, keys, mqueue, epoll watches, processes) are the
// sandbox's own and not shared by every sandbox. Image files are stored once,
// owned by ContainerOptions::uid_base + N (the "storage" ids, 100000..). Before
// the clone, each lower layer gets a detached clone of its mount
// (open_tree(OPEN_TREE_CLONE)) idmapped (mount_setattr(MOUNT_ATTR_IDMAP),
// read-only, nosuid, nodev) through a user namespace whose map is
// "uid_base <sandbox root> 65536", made for the create (~0.4 ms: a clone whose
// exit is reaped at the end of create; not cached, so the daemon holds no fd
// per range once its sandbox is gone); the child
// attaches them with move_mount (it cannot idmap: that needs CAP_SYS_ADMIN over
// the layers' file system). So a stored uid_base + N is N inside every sandbox.
// A sandbox created without a range (uid_base 0) runs in the storage ids and
// uses the layers as they are. At start, with ranges configured, the backend
// checks that idmapped mounts work on data_dir.
// In the nodev fallback, a host device node owned by an id in the storage ids
// or in any sandbox range is logged as an error at start (a sandbox could chmod it).
//
// Kernel: >= 5.11 (overlayfs in a user namespace; also uses CLONE_PIDFD,
// waitid(P_PIDFD), close_range); >= 5.19 for per-sandbox ranges (overlayfs over
// idmapped lower layers). Needs root (CAP_SYS_ADMIN, CAP_SETUID/GID to
// write the id maps, cgroup writes).
//
// Thread rules: create(), adopt() and cleanup_orphans() may run concurrently from
// any threads (the backend's state is read-only after construction; the run state
// and cgroups of one id are touched by one call at a time). A
// ContainerInstance is used by one owner at a time. The daemon must not set
// SIGCHLD to SIG_IGN nor reap with waitpid(-1): sandboxes (and the spawner)
// are its children, reaped through their pidfds.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/result.h"
#include "image/layer_resolver.h"
#include "runtime/backend.h"

namespace tp::runtime {

struct ContainerOptions {
  std::string data_dir;    // e.g. /var/lib/tidepool; we create containers/ and images/host/ in it
  std::string agent_path;  // host path of the static tp-agent binary (build/bin/tp-agent)
  // The tp-agent binary run as the spawner (spawner_client.h); empty: agent_path.
  // When it is the agent binary itself, a sandbox's init goes on as the agent
  // without an exec; otherwise (tests with a stand-in agent) it execs agent_path.
  std::string spawner_path;
  // Live restore's run dir: each sandbox's agent socket and init (run_state.h).
  // Root-only; made if missing (not its parents). Empty: <data_dir>/containers/run.
  std::string run_dir;
  // How long the spawner may take for its share of a start (clone, id maps) before
  // it counts as wedged: it is killed and replaced, and that create fails.
  unsigned spawner_timeout_ms = 10000;
  std::string cgroup_name =
      "tidepool";  // parent cgroup: <ctrl mount>/tidepool/<id> (v1) or <v2root>/tidepool/<id>
  // Owner of image files on disk (layers, the host skeleton): host id
  // uid_base + N is id N inside, through an idmapped mount per sandbox. Also
  // root of a sandbox created without a range of its own (SandboxSpec::uid_base 0).
  uint32_t uid_base = 100000;
  // Where every per-sandbox range lies (node/uid_ranges.h): host ids
  // [ranges_first, ranges_first + ranges_ids); 0 ids = no per-sandbox ranges.
  // Checked at start: idmapped mounts must work on data_dir, and no /dev node
  // may be owned by an id there.
  uint32_t ranges_first = 0;
  uint64_t ranges_ids = 0;
  // Layer digest -> lower directory (the image store); unset = only the `host` image.
  std::shared_ptr<image::LayerResolver> layers;
};

// The run dir a daemon uses by default: /run/tidepool/<cgroup_name> when /run is a
// tmpfs (each sandbox's socket is then made and removed in memory, not on the data
// dir's file system), else "" (<data_dir>/containers/run). Makes /run/tidepool
// (root, 0755) when it picks it.
std::string default_run_dir(const std::string& cgroup_name);

// Checks the host (cgroup layout, agent binary, data_dir permissions), builds
// the `host` image skeleton if needed and compiles the seccomp filter.
Result<std::unique_ptr<Backend>> make_container_backend(const ContainerOptions& opts);

}  // namespace tp::runtime
