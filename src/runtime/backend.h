// Backend interface: what every isolation tier implements (docs/architecture.md).
//
// A backend turns a SandboxSpec into a running sandbox whose PID 1 (or guest
// agent) is tp-agent, reachable through one connected stream fd that speaks
// src/protocol/wire.h. Everything else (exec, files) goes through that agent.
//
// A spec names its image's layers by digest; a backend that needs them on the
// host resolves them through the image::LayerResolver it was given at
// construction (image/layer_resolver.h), before it creates anything: an
// unknown digest fails create() with kNotFound and leaves nothing behind. The
// caller keeps the layers pinned while the sandbox lives.
//
// Ownership: a SandboxInstance owns every kernel resource of its sandbox
// (processes, namespaces, cgroups, mounts, files). destroy() releases them all
// and is idempotent; the destructor calls it. After destroy() returns
// successfully nothing of the sandbox remains on the host.
//
// Thread rules: Backend::create may be called from several threads at once.
// A SandboxInstance is used by one owner at a time (the node's sandbox
// manager serialises calls to it), except agent_fd(), which is read-only.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"

namespace tp::runtime {

struct SandboxSpec {
  std::string id;                        // also the hostname inside the sandbox
  std::string image = "host";            // image name; "host" = read-only views of host system dirs
  std::vector<std::string> layers;       // layer digests (sha256:<hex>), top first; none for host
  uint64_t memory_bytes = 512ull << 20;  // hard limit, no swap
  double cpus = 1.0;                     // cpu quota in cores
  uint32_t pids_max = 512;               // tasks in the sandbox, agent included
  uint64_t disk_bytes = 1ull << 30;      // writable layer (upper directory) size limit
  uint64_t tmp_bytes = 256ull << 20;     // microvm: the guest's /tmp (containers: in disk_bytes)
  // RLIMIT_NOFILE (soft and hard) for everything inside. Open files are not
  // charged to memory cgroups, so pids x nofile is a sandbox's share of the
  // host's fs.file-max: 1024 (the usual soft limit) keeps it at 512 Ki files
  // for the default 512 pids.
  uint64_t nofile = 1024;
  std::map<std::string, std::string> env;  // default environment of commands
  // First host uid/gid of the sandbox's own 65536-id range (root inside = this
  // id), allocated by the node (node/uid_ranges.h) so that per-user kernel
  // limits are the sandbox's own. 0 = the backend's shared default range.
  uint32_t uid_base = 0;
  // Best effort: the lowest CPU weight, and every process under SCHED_IDLE
  // (which it cannot leave: that needs CAP_SYS_NICE on the host), so that it
  // runs only on CPU time nothing else wants.
  bool best_effort = false;
  // The function tier's workers (src/function/): processes inside may use the mount
  // API (a call's child builds its own root; each call is then put under the default
  // filter again), and the sandbox's memory and pids cgroups are delegated to its root
  // (v1; v2 delegates its one cgroup anyway), so that each call gets limits of its own.
  bool nested_isolation = false;
};

struct Usage {
  uint64_t memory_bytes = 0;       // current memory use of the sandbox's cgroup
  uint64_t memory_peak_bytes = 0;  // peak since creation (0 if the kernel does not say)
  uint64_t cpu_usage_us = 0;       // cumulative CPU time
  uint64_t pids = 0;               // tasks now
  uint64_t oom_kills = 0;          // OOM kills inside the sandbox so far
};

// Thread rules: usage() and oom_kills() are safe from any thread, also while another
// one runs destroy() (the node reads the OOM count as an exec starts and as it ends);
// the other methods are called one at a time.
class SandboxInstance {
 public:
  virtual ~SandboxInstance() = default;
  virtual const std::string& id() const = 0;
  // Stream fd connected to tp-agent; owned by the instance (closed by destroy()).
  virtual int agent_fd() const = 0;
  // The node has its own duplicate of agent_fd() and owns the connection from now on:
  // the instance closes its copy (one descriptor fewer per sandbox; agent_fd() is -1
  // afterwards).
  virtual void close_agent_fd() {}
  // Host pid of the sandbox's init (tp-agent).
  virtual pid_t pid() const = 0;
  // True while the sandbox's init runs (non-blocking check).
  virtual bool alive() = 0;
  virtual Result<Usage> usage() = 0;
  // Usage::oom_kills alone; backends override it with something cheaper than usage().
  virtual Result<uint64_t> oom_kills() {
    auto u = usage();
    if (!u) return std::unexpected(u.error());
    return u->oom_kills;
  }
  // Stops every process and releases every resource. Idempotent.
  virtual Result<void> destroy() = 0;

  // Where the daemon can reach the agent again after losing agent_fd() (a
  // restart of the daemon): a unix socket path on the host, "" if none.
  virtual std::string agent_address() const { return {}; }
  // Freezes / thaws every process of the sandbox (the agent included).
  virtual Result<void> freeze() {
    return fail(Code::kInvalidArgument, "this tier cannot freeze a sandbox");
  }
  virtual Result<void> thaw() {
    return fail(Code::kInvalidArgument, "this tier cannot thaw a sandbox");
  }
  // Freezes every process of a sandbox whose destroy() comes later (a stop answered
  // before its teardown, node/sandbox_manager.h): as freeze(), without giving memory
  // back (the destroy frees it). destroy() thaws what it must to kill. A tier that
  // cannot (the default) is destroyed at once instead.
  virtual Result<void> freeze_for_destroy() {
    return fail(Code::kInvalidArgument, "this tier tears down at once");
  }
  // Lets go of the sandbox without stopping it (the daemon exits and a later
  // run adopts it): closes the instance's fds; destroy() is a no-op afterwards.
  virtual void release() { std::abort(); }  // tiers that adopt() override it
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string tier() const = 0;
  // Creates and starts a sandbox. On failure nothing of it remains.
  virtual Result<std::unique_ptr<SandboxInstance>> create(const SandboxSpec& spec) = 0;
  // Takes over a sandbox that a previous daemon run created and left running
  // (live restore). spec is the one it was created with. Its agent_fd() is -1:
  // connect to agent_address(). kNotFound when the sandbox is gone (its init
  // died); nothing of it is removed then (cleanup_orphans does that).
  virtual Result<std::unique_ptr<SandboxInstance>> adopt(const SandboxSpec& spec) {
    return fail(Code::kNotFound, "tier " + tier() + " cannot adopt sandbox " + spec.id);
  }
  // Removes everything a previous daemon run left behind (processes, cgroups,
  // mounts, files) for sandboxes not in `keep`. Returns the ids it cleaned up.
  virtual std::vector<std::string> cleanup_orphans(const std::vector<std::string>& keep) = 0;
};

}  // namespace tp::runtime
