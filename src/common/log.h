// Logging: spdlog with a sandbox id on every line that concerns a sandbox.
// Thread rules: all functions are safe from any thread.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace tp::log {

// Sets up the default logger (stderr, "[time] [level] message"). level: trace..critical.
void init(const std::string& level);

}  // namespace tp::log

// Every log line about a sandbox carries its id first: TP_SB_INFO(id, "exec {}", x).
#define TP_SB_INFO(id, fmtstr, ...) spdlog::info("[{}] " fmtstr, id __VA_OPT__(, ) __VA_ARGS__)
#define TP_SB_WARN(id, fmtstr, ...) spdlog::warn("[{}] " fmtstr, id __VA_OPT__(, ) __VA_ARGS__)
#define TP_SB_ERROR(id, fmtstr, ...) spdlog::error("[{}] " fmtstr, id __VA_OPT__(, ) __VA_ARGS__)
#define TP_SB_DEBUG(id, fmtstr, ...) spdlog::debug("[{}] " fmtstr, id __VA_OPT__(, ) __VA_ARGS__)
