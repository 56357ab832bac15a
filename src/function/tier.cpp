#include "function/tier.h"

#include <set>
#include <thread>

#include "common/log.h"
#include "sys/seccomp.h"

namespace tp::function {

Result<std::unique_ptr<FunctionService>> make_function_tier(boost::asio::io_context& io,
                                                            TierOptions opts) {
  auto langs = LanguageSet::load(opts.languages_dir);
  if (!langs) return std::unexpected(langs.error());
  const auto& assets = bundled_assets();
  auto src = assets.find("zygote.py");
  if (src == assets.end()) return fail(Code::kInternal, "the zygote is not bundled");

  // Every call runs under the container tier's own policy (the worker sandbox itself
  // runs with the mount API allowed, for the calls' children to build their roots).
  auto filter = sys::build_sandbox_filter();
  if (!filter) return std::unexpected(filter.error());
  zygote::InitConfig& init = opts.host.init;
  init.seccomp_bpf.assign(reinterpret_cast<const char*>((*filter)->insns.data()),
                          (*filter)->insns.size() * sizeof(sock_filter));
  init.scratch_bytes = opts.scratch_bytes;
  init.warm["generic"] = opts.warm;
  // What every call's child uses itself, then what python programs import most.
  std::set<std::string> preload = {"atexit", "builtins",  "io",   "resource",
                                   "stat",   "traceback", "types"};
  size_t prestarted = 0;
  for (const auto& d : (*langs)->all()) {
    if (d.mode == RunMode::kPython) preload.insert(d.preload.begin(), d.preload.end());
    if (d.prestarted()) {
      init.warm[d.name] = opts.warm_prestart;
      zygote::InitConfig::Prestart p;
      p.argv = d.prestart;
      p.env = {{"PATH", "/usr/local/bin:/usr/bin:/bin"},
               {"HOME", "/tmp"},
               {"TMPDIR", "/tmp"},
               {"LANG", "C.UTF-8"}};
      for (const auto& [k, v] : d.env) p.env[k] = v;
      init.prestart[d.name] = std::move(p);
      ++prestarted;
    }
  }
  init.preload.assign(preload.begin(), preload.end());
  opts.service.warm = init.warm;
  // Every slot's child, the warm ones, and a few being torn down.
  init.max_children =
      static_cast<uint32_t>(opts.service.slots + opts.warm + prestarted * opts.warm_prestart + 8);
  init.uid_base = 20000;

  WorkerHostOptions& host = opts.host;
  host.zygote_source = src->second;
  const Limits& max = opts.service.max;
  host.memory_bytes = opts.service.slots * max.memory_bytes + (1ull << 30);
  host.pids = static_cast<uint32_t>(
      std::min<uint64_t>(opts.service.slots * max.pids + 64 * init.max_children + 256, 1u << 22));
  host.cpus = std::max(1u, std::thread::hardware_concurrency());
  host.nofile = 64ull * init.max_children + 1024;

  WorkerFactory factory = [&io, host](const std::string& image) {
    return make_zygote_worker(io, host, image);
  };
  std::string names;
  for (const auto& d : (*langs)->all()) names += (names.empty() ? "" : ", ") + d.name;
  spdlog::info("function tier: languages {}; {} workers x {} slots per image, started on first use",
               names, opts.service.workers, opts.service.slots);
  return std::make_unique<FunctionService>(*langs, std::move(factory), opts.service);
}

}  // namespace tp::function
