// tidepool top [--interval D] [--once]: a live view of the daemon, redrawn every
// interval: sandboxes by state, counters with their rates (from /metrics), the warm
// pools and the live jobs. --once prints one frame and exits (rates need two frames, so
// it shows the totals only); Ctrl-C ends the live view.
#include <unistd.h>

#include <boost/json/value.hpp>
#include <chrono>
#include <cstdio>
#include <thread>

#include "cli/commands.h"
#include "cli/lifecycle.h"
#include "cli/parse.h"

namespace tp::cli {
namespace {

double monotonic_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Result<TopSample> fetch_sample(HttpClient& c) {
  TopSample s;
  s.url = c.url().str();
  auto pools = c.call_json(Method::kGet, "/v1/pools");
  if (!pools) return std::unexpected(pools.error());
  auto jobs = c.call_json(Method::kGet, "/v1/jobs");
  if (!jobs) return std::unexpected(jobs.error());
  auto metrics = c.request(Method::kGet, "/metrics");
  if (!metrics) return std::unexpected(metrics.error());
  s.at = monotonic_seconds();
  s.wall = std::time(nullptr);
  if (const auto* p = json_array_in(*pools, "pools")) s.pools = *p;
  if (const auto* j = json_array_in(*jobs, "jobs")) s.jobs = *j;
  s.metrics = parse_prometheus(metrics->body);
  return s;
}

}  // namespace

Action add_top(CLI::App& root, Context& ctx) {
  struct State {
    std::string interval = "2s";
    bool once = false;
  };
  auto st = std::make_shared<State>();
  CLI::App* sub = root.add_subcommand(
      "top", "Live view of sandboxes by state, rates, warm pools and jobs (Ctrl-C ends it)");
  sub->add_option("-n,--interval", st->interval, "time between frames (default 2s)")
      ->type_name("DURATION");
  sub->add_flag("--once", st->once, "print one frame and exit (for scripts)");
  return [st, &ctx]() -> int {
    auto every = parse_duration_seconds(st->interval);
    if (!every) return usage_error("--interval: " + every.error().message());
    if (*every <= 0) return usage_error("--interval: must be positive");
    auto client = ctx.client();
    if (!client) return report(client.error());
    const bool tty = ::isatty(STDOUT_FILENO) == 1;
    std::optional<TopSample> prev;
    for (;;) {
      auto now = fetch_sample(**client);
      if (!now) return report(now.error());
      std::string frame = render_top(*now, prev ? &*prev : nullptr);
      // Live on a terminal: home the cursor and clear, so the frame redraws in place.
      if (tty && !st->once) frame = "\x1b[H\x1b[2J" + frame;
      if (!write_all(STDOUT_FILENO, frame)) return kExitError;
      if (st->once) return kExitOk;
      if (!tty && !write_all(STDOUT_FILENO, "\n")) return kExitError;
      prev = std::move(*now);
      std::this_thread::sleep_for(std::chrono::duration<double>(*every));
    }
  };
}

}  // namespace tp::cli
