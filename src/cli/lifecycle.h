// Internal to the CLI: what `templates`, `pools`, `jobs` and `top` share: table rows of
// the daemon's Template, Pool and Job objects, the Prometheus text of /metrics, and the
// frame `top` draws.
//
// Promises: pure functions of their arguments (no I/O, but show_list); fields the daemon
// left out show as "-", never as an error.
// Thread rules: safe from any thread.
#pragma once

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/value.hpp>
#include <ctime>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tp::cli {

class HttpClient;

// A number field of a JSON object (integers too), nullopt when absent or not a number.
std::optional<double> json_number(const boost::json::object& o, std::string_view key);
// The array under `key` of an answer object, or nullptr.
const boost::json::array* json_array_in(const boost::json::value& v, std::string_view key);
// One path segment, percent-encoded ('/' too, so that a name cannot become another route).
std::string path_segment(std::string_view text);
// A number as the tables print it: "0.5", "2", "1e+06" (%g).
std::string format_number(double v);

// Rows (with their header) of GET /v1/templates, /v1/pools and /v1/jobs answers.
std::vector<std::vector<std::string>> template_rows(const boost::json::array& templates);
std::vector<std::vector<std::string>> pool_rows(const boost::json::array& pools);
std::vector<std::vector<std::string>> job_rows(const boost::json::array& jobs, std::time_t now);

// GETs `target`, takes the array under `key` of the answer and prints it as JSON or as
// the table `rows` makes of it; returns the exit code (errors reported in one line).
using RowsOf = std::function<std::vector<std::vector<std::string>>(const boost::json::array&)>;
int show_list(HttpClient& client, const std::string& target, std::string_view key, bool json_out,
              const RowsOf& rows);

// One sample of the Prometheus text exposition: name, labels, value.
struct MetricSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};
// Parses the text exposition; comment lines and malformed lines are skipped.
std::vector<MetricSample> parse_prometheus(std::string_view text);
// The sum of every sample named `name` (0 when there is none).
double metric_sum(const std::vector<MetricSample>& samples, std::string_view name);
// Per value of `label`, the sum of the samples named `name` carrying it.
std::map<std::string, double> metric_by(const std::vector<MetricSample>& samples,
                                        std::string_view name, std::string_view label);

// What one frame of `top` shows, as fetched at `at` (a monotonic time in seconds).
struct TopSample {
  double at = 0;
  std::string url;
  std::time_t wall = 0;
  boost::json::array pools;
  boost::json::array jobs;
  std::vector<MetricSample> metrics;
};
// The counters `top` turns into rates, in the order shown.
std::vector<std::pair<std::string, std::string>> top_rate_counters();
// Rate of `counter` between two samples (per second); nullopt without a previous sample,
// when no time passed, or when the counter went down (the daemon restarted).
std::optional<double> counter_rate(const TopSample& now, const TopSample* prev,
                                   std::string_view counter);
// The whole frame as text (no terminal control sequences).
std::string render_top(const TopSample& now, const TopSample* prev);

}  // namespace tp::cli
