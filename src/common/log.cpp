#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace tp::log {

void init(const std::string& level) {
  auto logger = spdlog::stderr_color_mt("tidepool");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  spdlog::set_level(spdlog::level::from_str(level));
}

}  // namespace tp::log
