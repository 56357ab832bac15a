// Small helpers the benchmark programs share: elapsed milliseconds and percentiles.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace tp::bench {

using Clock = std::chrono::steady_clock;

inline double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// The p-th percentile (0..100) of v, nearest rank.
inline double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p / 100.0 * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

}  // namespace tp::bench
