// RateLimit / RateLimitedLog (common/rate_limited_log.h) on a fake clock.
#include "common/rate_limited_log.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <sstream>

namespace tp::log {
namespace {

using namespace std::chrono_literals;

struct FakeClock {
  RateLimit::Clock::time_point t{};
  RateLimit::NowFn fn() {
    return [this] { return t; };
  }
};

TEST(RateLimit, FirstPassesThenOnePerIntervalWithTheCountHeldBack) {
  FakeClock c;
  RateLimit rl(1s, c.fn());
  uint64_t n = 99;
  EXPECT_TRUE(rl.allow(&n));
  EXPECT_EQ(n, 0u);
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(rl.allow(&n));
  EXPECT_EQ(rl.pending(), 1000u);
  c.t += 999ms;
  EXPECT_FALSE(rl.allow(&n));
  c.t += 1ms;
  EXPECT_TRUE(rl.allow(&n));
  EXPECT_EQ(n, 1001u);
  EXPECT_EQ(rl.pending(), 0u);
  c.t += 10s;
  EXPECT_TRUE(rl.allow(&n));
  EXPECT_EQ(n, 0u);
}

// Captures the default logger's lines for one test.
class Capture {
 public:
  Capture() : old_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out_);
    auto l = std::make_shared<spdlog::logger>("capture", sink);
    l->set_pattern("%l %v");
    l->set_level(spdlog::level::trace);
    spdlog::set_default_logger(l);
  }
  ~Capture() { spdlog::set_default_logger(old_); }
  std::string text() const { return out_.str(); }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> old_;
};

TEST(RateLimitedLog, OneLinePerIntervalNamingTheSuppressed) {
  Capture cap;
  FakeClock c;
  RateLimitedLog lg(spdlog::level::warn, 1s, c.fn());
  EXPECT_TRUE(lg.log("accept: {}", "Too many open files"));
  for (int i = 0; i < 100000; ++i) lg.log("accept: {}", "Too many open files");
  c.t += 1s;
  EXPECT_TRUE(lg.log("accept: {} #{}", "Too many open files", 2));
  EXPECT_EQ(cap.text(),
            "warning accept: Too many open files\n"
            "warning accept: Too many open files #2 (100000 similar messages suppressed)\n");
}

}  // namespace
}  // namespace tp::log
