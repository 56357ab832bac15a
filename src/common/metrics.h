// Metrics: counters and histograms rendered in Prometheus text format.
//
// Thread rules: every method is safe from any thread (atomics and a mutex).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace tp {

// Fixed-bucket histogram of seconds.
class Histogram {
 public:
  static constexpr std::array<double, 14> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                     0.25,  0.5,    1,     2.5,  5,     10,   60};
  void observe(double seconds);
  // Appends the _bucket/_sum/_count lines for `name`.
  void render(const std::string& name, std::string* out) const;

 private:
  std::array<std::atomic<uint64_t>, kBounds.size() + 1> buckets_{};
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_us_{0};
};

class Metrics {
 public:
  std::atomic<uint64_t> creations{0};
  std::atomic<uint64_t> creation_failures{0};
  std::atomic<uint64_t> destructions{0};
  std::atomic<uint64_t> teardowns_deferred{0};
  std::atomic<uint64_t> exec_total{0};
  std::atomic<uint64_t> pauses{0};
  std::atomic<uint64_t> resumes{0};
  Histogram exec_seconds;
  Histogram create_seconds;
  Histogram pause_seconds;

  void count_http(int status);
  // Gauge source: sandboxes by state, asked at render time.
  void set_state_source(std::function<std::map<std::string, uint64_t>()> f);
  // A module's own metrics (pools, jobs, the function tier), appended in Prometheus text at render
  // time. Add before serving.
  void add_source(std::function<void(std::string* out)> f);
  std::string render() const;

 private:
  mutable std::mutex mu_;
  std::map<int, uint64_t> http_;
  std::function<std::map<std::string, uint64_t>()> states_;
  std::vector<std::function<void(std::string* out)>> sources_;
};

}  // namespace tp
