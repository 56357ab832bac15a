#include "common/metrics.h"

#include <fmt/format.h>

namespace tp {

void Histogram::observe(double seconds) {
  size_t i = 0;
  while (i < kBounds.size() && seconds > kBounds[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_us_.fetch_add(static_cast<uint64_t>(seconds * 1e6), std::memory_order_relaxed);
}

void Histogram::render(const std::string& name, std::string* out) const {
  uint64_t cum = 0;
  for (size_t i = 0; i < kBounds.size(); ++i) {
    cum += buckets_[i].load(std::memory_order_relaxed);
    *out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, kBounds[i], cum);
  }
  cum += buckets_[kBounds.size()].load(std::memory_order_relaxed);
  *out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, cum);
  *out += fmt::format("{}_sum {}\n", name, static_cast<double>(sum_us_.load()) / 1e6);
  *out += fmt::format("{}_count {}\n", name, count_.load());
}

void Metrics::count_http(int status) {
  std::lock_guard lk(mu_);
  ++http_[status];
}

void Metrics::set_state_source(std::function<std::map<std::string, uint64_t>()> f) {
  std::lock_guard lk(mu_);
  states_ = std::move(f);
}

void Metrics::add_source(std::function<void(std::string* out)> f) {
  std::lock_guard lk(mu_);
  sources_.push_back(std::move(f));
}

std::string Metrics::render() const {
  std::string out;
  std::function<std::map<std::string, uint64_t>()> states;
  std::map<int, uint64_t> http;
  std::vector<std::function<void(std::string*)>> sources;
  {
    std::lock_guard lk(mu_);
    states = states_;
    http = http_;
    sources = sources_;
  }
  out += "# HELP tidepool_sandboxes Sandboxes by state.\n# TYPE tidepool_sandboxes gauge\n";
  std::map<std::string, uint64_t> by_state = {
      {"creating", 0}, {"running", 0}, {"paused", 0}, {"stopped", 0}, {"lost", 0}};
  if (states)
    for (const auto& [k, v] : states()) by_state[k] = v;
  for (const auto& [k, v] : by_state)
    out += fmt::format("tidepool_sandboxes{{state=\"{}\"}} {}\n", k, v);
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    out += fmt::format("# HELP {0} {1}\n# TYPE {0} counter\n{0} {2}\n", name, help, v);
  };
  counter("tidepool_sandbox_creations_total", "Sandboxes created.", creations.load());
  counter("tidepool_sandbox_creation_failures_total", "Sandbox creations that failed.",
          creation_failures.load());
  counter("tidepool_sandbox_destructions_total", "Sandboxes destroyed.", destructions.load());
  counter("tidepool_sandbox_teardowns_deferred_total",
          "Stops answered ahead whose teardown waited for clients to be quiet.",
          teardowns_deferred.load());
  counter("tidepool_exec_total", "Commands run.", exec_total.load());
  counter("tidepool_sandbox_pauses_total", "Sandboxes paused.", pauses.load());
  counter("tidepool_sandbox_resumes_total", "Paused sandboxes resumed.", resumes.load());
  out +=
      "# HELP tidepool_exec_duration_seconds Command wall time.\n"
      "# TYPE tidepool_exec_duration_seconds histogram\n";
  exec_seconds.render("tidepool_exec_duration_seconds", &out);
  out +=
      "# HELP tidepool_sandbox_create_duration_seconds Time to create a sandbox.\n"
      "# TYPE tidepool_sandbox_create_duration_seconds histogram\n";
  create_seconds.render("tidepool_sandbox_create_duration_seconds", &out);
  out +=
      "# HELP tidepool_sandbox_pause_duration_seconds Time to freeze a sandbox.\n"
      "# TYPE tidepool_sandbox_pause_duration_seconds histogram\n";
  pause_seconds.render("tidepool_sandbox_pause_duration_seconds", &out);
  out +=
      "# HELP tidepool_http_requests_total HTTP requests by status.\n"
      "# TYPE tidepool_http_requests_total counter\n";
  for (const auto& [code, n] : http)
    out += fmt::format("tidepool_http_requests_total{{code=\"{}\"}} {}\n", code, n);
  for (const auto& f : sources) f(&out);
  return out;
}

}  // namespace tp
