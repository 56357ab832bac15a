// RateLimit / RateLimitedLog: one report per interval for an event that can
// repeat in a tight loop (accept() failing at the fd limit), with a count of
// the repeats held back, so a storm costs a few lines instead of gigabytes of log.
// Thread rules: all methods are safe from any thread.
#pragma once

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

namespace tp::log {

class RateLimit {
 public:
  using Clock = std::chrono::steady_clock;
  using NowFn = std::function<Clock::time_point()>;

  // `now` is replaceable so that tests need no sleeping.
  explicit RateLimit(
      Clock::duration interval, NowFn now = [] { return Clock::now(); })
      : interval_(interval), now_(std::move(now)) {}

  // True when this occurrence should be reported: the first one, then the first
  // one at least `interval` after the last report. *suppressed gets the number
  // of occurrences held back since the last report (0 otherwise).
  bool allow(uint64_t* suppressed);
  // Occurrences held back since the last report.
  uint64_t pending() const;

 private:
  mutable std::mutex mu_;
  Clock::duration interval_;
  NowFn now_;
  std::optional<Clock::time_point> last_;
  uint64_t held_ = 0;
};

class RateLimitedLog {
 public:
  explicit RateLimitedLog(
      spdlog::level::level_enum level,
      RateLimit::Clock::duration interval = std::chrono::seconds(1),
      RateLimit::NowFn now = [] { return RateLimit::Clock::now(); })
      : level_(level), limit_(interval, std::move(now)) {}

  // Logs to the default logger unless a line went out less than an interval ago;
  // the line then carries how many were suppressed before it. True when logged.
  template <class... Args>
  bool log(fmt::format_string<Args...> f, Args&&... args) {
    uint64_t suppressed = 0;
    if (!limit_.allow(&suppressed)) return false;
    std::string msg = fmt::format(f, std::forward<Args>(args)...);
    if (suppressed) msg += fmt::format(" ({} similar messages suppressed)", suppressed);
    spdlog::log(level_, "{}", msg);
    return true;
  }

 private:
  spdlog::level::level_enum level_;
  RateLimit limit_;
};

}  // namespace tp::log
