// The function tier as the daemon assembles it: languages, zygote workers in container
// sandboxes, the service (docs/function-tier.md). Workers start on the first call.
//
// Thread rules: make_function_tier() once, from the daemon's main thread.
#pragma once

#include <boost/asio/io_context.hpp>
#include <memory>
#include <string>

#include "function/function_service.h"
#include "function/zygote_worker.h"

namespace tp::function {

struct TierOptions {
  std::string languages_dir;  // --fn-languages: more definitions ("" = the built-in ones)
  ServiceOptions service;
  uint32_t warm = 4;           // ready children per worker for every exec/python call
  uint32_t warm_prestart = 1;  // ready runtimes per worker for each prestarted language
  uint64_t scratch_bytes = 128ull << 20;
  WorkerHostOptions host;  // backend, uid ranges, node name, image resolver
};

Result<std::unique_ptr<FunctionService>> make_function_tier(boost::asio::io_context& io,
                                                            TierOptions opts);

}  // namespace tp::function
