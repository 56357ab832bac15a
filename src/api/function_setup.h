// The function tier in the daemon: its flags (--fn-*) and its assembly (the service,
// its routes, the SandboxFusion endpoint and its metrics). docs/function-tier.md.
// Thread rules: the daemon's main thread, before serving.
#pragma once

#include <CLI/CLI.hpp>
#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <memory>
#include <string>

#include "api/routes.h"
#include "common/metrics.h"
#include "function/function_service.h"
#include "image/image_store.h"
#include "node/uid_ranges.h"
#include "runtime/backend.h"

namespace tp::api {

struct FunctionFlags {
  unsigned workers = 2;
  unsigned slots = 8;
  unsigned warm = 4;
  unsigned client_concurrency = 16;
  std::string languages_dir;
  double timeout = 10;
  double max_timeout = 300;
  uint64_t memory_mb = 512;
  uint64_t max_memory_mb = 4096;
  uint64_t scratch_mb = 128;
  uint64_t cache_mb = 256;
  uint64_t max_body_mb = 64;
  bool prestart = false;

  void add_to(CLI::App& app);
};

// The tier with its routes added to `api` and its metrics to `metrics`; null when
// --fn-workers is 0 (no function tier).
Result<std::shared_ptr<function::FunctionService>> start_function_tier(
    const FunctionFlags& flags, boost::asio::io_context& io, Api& api, Metrics& metrics,
    runtime::Backend* backend, std::shared_ptr<node::UidRanges> ranges, const std::string& node,
    std::shared_ptr<image::ImageStore> images);

// Whether a request's body is one of the function tier's (held to --fn-max-body-mb).
bool function_body(const std::string& method, const std::string& path);

}  // namespace tp::api
