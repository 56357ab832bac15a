// ZygoteWorker: the real function-tier worker (docs/function-tier.md).
//
// One worker is one container-tier sandbox, created through the runtime backend like
// any other (its own user namespace and host uid range, mount, pid, uts, ipc and net
// namespaces, cgroups with limits, the `host` image or another one read-only under an
// overlay, seccomp, no_new_privs) with SandboxSpec::nested_isolation: processes in it
// may mount, and its memory and pids cgroups are delegated to its root. Its tp-agent
// runs one command, the zygote (zygote/zygote.py, bundled into the daemon and given
// to `python3 -c`); the agent's exec stream of that command carries the frames of
// zygote_codec.h both ways. Each call is a child of the zygote that isolates itself
// further (see zygote.py); nothing of a call is ever held by the zygote.
//
// Lifecycle: create() makes the sandbox, starts the zygote and waits for its kReady
// (blocking; the service runs it on its own threads). The worker is lost when the
// zygote's command ends, the agent connection breaks or the zygote speaks out of
// protocol: running calls fail with kUnavailable, on_lost runs once. destroy() ends the
// zygote, destroys the sandbox (every process, mount, cgroup of it) and frees its uid
// range. These sandboxes are the function tier's own: they are not in the sandbox store
// and not in the API's sandbox list, and a daemon that starts again removes any a
// crashed run left (the container backend's cleanup of sandboxes the store does not
// know).
//
// Thread rules: as Worker (worker.h).
#pragma once

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "function/worker.h"
#include "function/zygote_codec.h"
#include "node/uid_ranges.h"
#include "runtime/backend.h"

namespace tp::function {

struct ImageLayers {
  std::vector<std::string> layers;  // digests, top first
  std::shared_ptr<void> pin;        // keeps them from gc while held
};

struct WorkerHostOptions {
  runtime::Backend* backend = nullptr;          // the container tier
  std::shared_ptr<node::UidRanges> uid_ranges;  // null: the backend's shared range
  std::string node_name = "n0";
  // Layer digests of an image reference (the image store); unset: only "host".
  std::function<Result<ImageLayers>(const std::string& image)> resolve_image;
  std::string zygote_source;  // zygote.py
  zygote::InitConfig init;
  // The sandbox around the zygote: room for every slot's calls at their largest.
  uint64_t memory_bytes = 4ull << 30;
  uint32_t pids = 4096;
  double cpus = 2;
  uint64_t nofile = 8192;
  std::chrono::seconds start_timeout{60};
};

// Makes a ready worker (blocking). Its callbacks run on `io`.
Result<std::shared_ptr<Worker>> make_zygote_worker(boost::asio::io_context& io,
                                                   const WorkerHostOptions& opts,
                                                   const std::string& image);

}  // namespace tp::function
