#include "api/function_setup.h"

#include <cmath>

#include "api/function_routes.h"
#include "api/sandbox_fusion.h"
#include "common/log.h"
#include "function/tier.h"

namespace tp::api {

void FunctionFlags::add_to(CLI::App& app) {
  app.add_option("--fn-workers", workers,
                 "function tier: zygote worker sandboxes per image, started on the first call "
                 "(0 = no function tier)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 64u));
  app.add_option("--fn-slots", slots, "function tier: calls running at once per worker")
      ->capture_default_str()
      ->check(CLI::Range(1u, 256u));
  app.add_option("--fn-warm", warm, "function tier: children each worker keeps ready")
      ->capture_default_str()
      ->check(CLI::Range(0u, 256u));
  app.add_option("--fn-client-concurrency", client_concurrency,
                 "function tier: calls of one client (API key, uid or address) running at once; "
                 "the rest wait their turn (0 = no limit)")
      ->capture_default_str();
  app.add_option("--fn-languages", languages_dir,
                 "function tier: directory of more language definitions (*.json), added to the "
                 "built-in ones (a name given again replaces the built-in)");
  app.add_option("--fn-timeout", timeout, "function tier: default time limit of a run, seconds")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 86400.0));
  app.add_option("--fn-max-timeout", max_timeout, "function tier: largest time limit, seconds")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 86400.0));
  app.add_option("--fn-memory-mb", memory_mb, "function tier: default memory limit of a run")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{16}, uint64_t{1} << 20));
  app.add_option("--fn-max-memory-mb", max_memory_mb, "function tier: largest memory limit")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{16}, uint64_t{1} << 20));
  app.add_option("--fn-scratch-mb", scratch_mb,
                 "function tier: size of each call's scratch tmpfs (counted in its memory)")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 20));
  app.add_option("--fn-cache-mb", cache_mb, "function tier: memory for compiled programs")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 20));
  app.add_option("--fn-max-body-mb", max_body_mb,
                 "function tier: largest request body of a run or batch (programs, inputs, files)")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{4096}));
  app.add_flag("--fn-prestart", prestart,
               "function tier: start the host image's workers at start instead of on first use");
}

bool function_body(const std::string& method, const std::string& path) {
  return FunctionRoutes::takes_large_body(method, path) ||
         (method == "POST" && path == "/run_code");
}

Result<std::shared_ptr<function::FunctionService>> start_function_tier(
    const FunctionFlags& f, boost::asio::io_context& io, Api& api, Metrics& metrics,
    runtime::Backend* backend, std::shared_ptr<node::UidRanges> ranges, const std::string& node,
    std::shared_ptr<image::ImageStore> images) {
  if (f.workers == 0) {
    spdlog::info("function tier: off (--fn-workers 0)");
    return std::shared_ptr<function::FunctionService>();
  }
  if (f.timeout > f.max_timeout || f.memory_mb > f.max_memory_mb)
    return fail(Code::kInvalidArgument,
                "--fn-timeout and --fn-memory-mb must not exceed --fn-max-timeout and "
                "--fn-max-memory-mb");
  function::TierOptions o;
  o.languages_dir = f.languages_dir;
  o.service.workers = f.workers;
  o.service.slots = f.slots;
  o.service.queue.per_client_in_flight = f.client_concurrency;
  o.service.defaults.timeout_ms = static_cast<uint64_t>(std::llround(f.timeout * 1000));
  o.service.max.timeout_ms = static_cast<uint64_t>(std::llround(f.max_timeout * 1000));
  o.service.defaults.memory_bytes = f.memory_mb << 20;
  o.service.max.memory_bytes = f.max_memory_mb << 20;
  o.service.cache_bytes = f.cache_mb << 20;
  o.warm = f.warm;
  o.scratch_bytes = f.scratch_mb << 20;
  o.host.backend = backend;
  o.host.uid_ranges = std::move(ranges);
  o.host.node_name = node;
  if (images)
    o.host.resolve_image = [images](const std::string& ref) -> Result<function::ImageLayers> {
      auto r = images->resolve(ref);
      if (!r) return std::unexpected(r.error());
      return function::ImageLayers{r->digests, r->pin};
    };
  auto svc = function::make_function_tier(io, std::move(o));
  if (!svc) return std::unexpected(svc.error());
  std::shared_ptr<function::FunctionService> fn = std::move(*svc);
  api.add_provider(std::make_shared<FunctionRoutes>(fn));
  api.add_provider(std::make_shared<SandboxFusionRoutes>(fn));
  std::weak_ptr<function::FunctionService> weak = fn;
  metrics.add_source([weak](std::string* out) {
    if (auto s = weak.lock()) s->render_metrics(out);
  });
  if (f.prestart) fn->warm_up("host");
  return fn;
}

}  // namespace tp::api
