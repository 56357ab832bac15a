// The microvm tier (docs/architecture.md, "The microvm tier"): each sandbox is
// a QEMU `-M microvm` guest with its own kernel (Debian's cloud kernel), and
// tp-agent, the same static binary as in containers, as its PID 1, reached
// over a virtio-serial port (src/protocol/README.md, "VM clones").
//
// Root file system: the image's layers as read-only erofs disks (erofs_store.h;
// the `host` image is BUILD/microvm/host.erofs, made by
// scripts/microvm-assets.sh from the host's essential packages and python3)
// under a writable layer in guest memory (guest/init). Limits: spec.cpus ->
// vCPUs (rounded up) and the cgroup cpu quota, spec.memory_bytes -> guest RAM,
// spec.disk_bytes -> the writable layer, spec.pids_max -> the guest's sandbox
// cgroup; QEMU's own cgroup gets the same cpu quota, the guest RAM plus QEMU's
// overhead as its memory limit, and a pids limit (qemu_jail.h: QEMU runs as
// the sandbox's host uid range + 1, in its own namespaces, seeing only what it
// needs).
//
// Fast start: the first create of an image and shape (vCPUs, memory, disk,
// tmp, pids) boots a template VM once (template_store.h): guest RAM in a
// memfd, booted until its agent answered and went idle again, then stopped
// and its device state saved with x-ignore-shared. Every sandbox of that key
// is then a clone: a new QEMU that maps the template's RAM privately (copy on
// write) and restores the device state (qemu_args.h). The clone's first frame
// is kConfigure (hostname = sandbox id, wall clock, a fresh random seed).
// A failed template build or a clone that does not come up falls back to a
// cold boot of that sandbox (MicrovmOptions::templates = false: always cold).
//
// Readiness: create() returns once the agent's kReady is in the socket
// (peeked, left for the node). Cold boots and template builds are at most
// kBootsAtOnce at a time (a TCG boot is a core's worth of work for seconds).
//
// Files: <data_dir>/microvm/run/<id>/ (root 0700) holds `state` (QEMU's pid and
// start time, for adopt) and q/ (owned by QEMU's uid: its QMP and agent
// sockets, console.log, qemu.log); templates/<key>/ likewise while one is
// built; erofs/ the layer images. destroy() kills QEMU (PID 1 of its pid
// namespace), reaps it, removes its cgroup and its run directory. A guest that
// panicked or powered off is reported in the log with the console's last
// lines (QEMU exits; the node sees its agent's stream end). agent_address()
// is q/agent.sock: a restarted daemon connects there again (adopt()).
// cleanup_orphans() kills and removes every QEMU, cgroup and run directory a
// previous run left that is not kept; template leftovers go at start.
//
// Accelerator: KVM when /dev/kvm opens, else TCG (this tier then runs
// correctly but is not a security boundary: SECURITY.md).
//
// Thread rules: create(), adopt() and cleanup_orphans() from any threads at
// once; an instance is used by one owner at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/result.h"
#include "image/layer_resolver.h"
#include "runtime/backend.h"

namespace tp::runtime {

struct MicrovmOptions {
  std::string data_dir;    // we use <data_dir>/microvm/
  std::string assets_dir;  // vmlinuz, initrd.img, host.erofs, assets.id (scripts/microvm-assets.sh)
  std::string qemu_path = "/usr/bin/qemu-system-x86_64";
  std::string mkfs_erofs_path = "/usr/bin/mkfs.erofs";
  // QEMU's cgroups: <cgroup_name>-microvm/<id>.
  std::string cgroup_name = "tidepool";
  // Owner of the image store's layer files (ContainerOptions::uid_base).
  uint32_t storage_uid_base = 100000;
  // Host ids of template QEMUs and of sandboxes created without a range of their own.
  uint32_t default_uid_base = 300000;
  bool templates = true;       // false: every sandbox cold boots
  std::string accel = "auto";  // auto (KVM if /dev/kvm opens), kvm, tcg
  std::shared_ptr<image::LayerResolver> layers;
};

// Checks the assets and QEMU, detects the accelerator, prepares the
// directories and cgroup parent, removes template leftovers.
Result<std::unique_ptr<Backend>> make_microvm_backend(const MicrovmOptions& opts);

}  // namespace tp::runtime
