// Tables and the `top` frame of the lifecycle commands (cli/lifecycle.h).
#include "cli/lifecycle.h"

#include <boost/json/serialize.hpp>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "cli/commands.h"
#include "cli/parse.h"

namespace tp::cli {
namespace {

namespace json = boost::json;

// "-" for an absent field, else the number as the tables print it.
std::string cell_number(const json::object& o, std::string_view key) {
  auto v = json_number(o, key);
  return v ? format_number(*v) : "-";
}

std::string cell_mb(const json::object& o, std::string_view key) {
  auto v = json_number(o, key);
  return v ? format_mb(static_cast<int64_t>(*v)) : "-";
}

std::string cell_text(const json::object& o, std::string_view key) {
  std::string s = str_of(o, key);
  return s.empty() ? "-" : s;
}

const json::object* sub_object(const json::object& o, std::string_view key) {
  const auto* v = o.if_contains(key);
  return v != nullptr && v->is_object() ? &v->get_object() : nullptr;
}

// "used/limit" of a job's quota field ("used" alone when the quota is 0, no limit).
std::string use_of(const json::object& job, std::string_view key, bool mb) {
  const json::object* use = sub_object(job, "use");
  const json::object* quota = sub_object(job, "quota");
  auto fmt = [mb](double v) { return mb ? format_mb(static_cast<int64_t>(v)) : format_number(v); };
  std::string used = "-";
  if (use != nullptr)
    if (auto u = json_number(*use, key)) used = fmt(*u);
  if (quota != nullptr)
    if (auto q = json_number(*quota, key); q && *q > 0) return used + "/" + fmt(*q);
  return used;
}

std::string percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f%%", fraction * 100);
  return buf;
}

// The label block of a sample: key="value",... (escapes \" \\ \n).
bool parse_labels(std::string_view s, std::map<std::string, std::string>* out) {
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ',' || s[i] == ' ')) ++i;
    if (i >= s.size()) break;
    size_t eq = s.find('=', i);
    if (eq == std::string_view::npos || eq + 1 >= s.size() || s[eq + 1] != '"') return false;
    std::string key(s.substr(i, eq - i));
    std::string value;
    size_t j = eq + 2;
    for (; j < s.size() && s[j] != '"'; ++j) {
      if (s[j] == '\\' && j + 1 < s.size()) {
        ++j;
        value += s[j] == 'n' ? '\n' : s[j];
      } else {
        value += s[j];
      }
    }
    if (j >= s.size()) return false;
    (*out)[key] = std::move(value);
    i = j + 1;
  }
  return true;
}

}  // namespace

std::optional<double> json_number(const boost::json::object& o, std::string_view key) {
  const auto* v = o.if_contains(key);
  if (v == nullptr) return std::nullopt;
  if (v->is_int64()) return static_cast<double>(v->get_int64());
  if (v->is_uint64()) return static_cast<double>(v->get_uint64());
  if (v->is_double()) return v->get_double();
  return std::nullopt;
}

const boost::json::array* json_array_in(const boost::json::value& v, std::string_view key) {
  if (!v.is_object()) return nullptr;
  const auto* a = v.get_object().if_contains(key);
  return a != nullptr && a->is_array() ? &a->get_array() : nullptr;
}

std::string path_segment(std::string_view text) {
  std::string safe;
  for (char c : url_encode(text)) safe += c == '/' ? std::string("%2F") : std::string(1, c);
  return safe;
}

std::string format_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::vector<std::vector<std::string>> template_rows(const boost::json::array& templates) {
  std::vector<std::vector<std::string>> rows{
      {"NAME", "IMAGE", "TIER", "CPUS", "MEMORY", "PRIORITY", "POOL", "READY", "VERSION"}};
  for (const auto& v : templates) {
    if (!v.is_object()) continue;
    const auto& t = v.get_object();
    std::string pool = cell_number(t, "pool_min") + ".." + cell_number(t, "pool_max");
    std::string ready = "-";
    if (const json::object* p = sub_object(t, "pool")) ready = cell_number(*p, "ready");
    rows.push_back({cell_text(t, "name"), cell_text(t, "image"), cell_text(t, "tier"),
                    cell_number(t, "cpus"), cell_mb(t, "memory_mb"), cell_text(t, "priority"), pool,
                    ready, cell_number(t, "version")});
  }
  return rows;
}

std::vector<std::vector<std::string>> pool_rows(const boost::json::array& pools) {
  std::vector<std::vector<std::string>> rows{{"TEMPLATE", "READY", "CREATING", "TARGET", "MIN",
                                              "MAX", "HITS", "MISSES", "HIT RATE", "REQ/S",
                                              "COLD CREATE"}};
  for (const auto& v : pools) {
    if (!v.is_object()) continue;
    const auto& p = v.get_object();
    auto hit = json_number(p, "hit_rate");
    auto rate = json_number(p, "rate_per_second");
    auto cold = json_number(p, "cold_create_seconds");
    char rate_buf[32] = "-", cold_buf[32] = "-";
    if (rate) std::snprintf(rate_buf, sizeof rate_buf, "%.2f", *rate);
    if (cold) std::snprintf(cold_buf, sizeof cold_buf, "%.2fs", *cold);
    rows.push_back({cell_text(p, "template"), cell_number(p, "ready"), cell_number(p, "creating"),
                    cell_number(p, "target"), cell_number(p, "min"), cell_number(p, "max"),
                    cell_number(p, "hits"), cell_number(p, "misses"), hit ? percent(*hit) : "-",
                    rate_buf, cold_buf});
  }
  return rows;
}

std::vector<std::vector<std::string>> job_rows(const boost::json::array& jobs, std::time_t now) {
  std::vector<std::vector<std::string>> rows{
      {"ID", "NAME", "STATE", "SANDBOXES", "MEMORY", "CPUS", "PAUSED", "LEASE"}};
  for (const auto& v : jobs) {
    if (!v.is_object()) continue;
    const auto& j = v.get_object();
    std::string lease = "-";
    std::string state = str_of(j, "state");
    if (state == "ended") {
      lease = "ended (" + cell_text(j, "end_reason") + ")";
    } else if (auto e = parse_rfc3339(str_of(j, "lease_expires_at"))) {
      lease = *e <= now ? "lapsed" : "in " + format_duration_short(*e - now);
    }
    std::string paused = "-";
    if (const json::object* u = sub_object(j, "use")) paused = cell_number(*u, "paused");
    rows.push_back({cell_text(j, "id"), cell_text(j, "name"), state.empty() ? "-" : state,
                    use_of(j, "sandboxes", false), use_of(j, "memory_mb", true),
                    use_of(j, "cpus", false), paused, lease});
  }
  return rows;
}

int show_list(HttpClient& client, const std::string& target, std::string_view key, bool json_out,
              const RowsOf& rows) {
  auto r = client.call_json(Method::kGet, target);
  if (!r) return report(r.error());
  const json::array* list = json_array_in(*r, key);
  if (list == nullptr)
    return report(Error{Code::kInternal, 0, "tidepoold sent no " + std::string(key) + " list"});
  if (json_out)
    std::printf("%s\n", json::serialize(*list).c_str());
  else
    print_table(rows(*list));
  return kExitOk;
}

std::vector<MetricSample> parse_prometheus(std::string_view text) {
  std::vector<MetricSample> out;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
    if (line.empty() || line.front() == '#') continue;
    MetricSample s;
    size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string_view::npos || name_end == 0) continue;
    s.name = std::string(line.substr(0, name_end));
    std::string_view rest = line.substr(name_end);
    if (rest.front() == '{') {
      size_t close = rest.rfind('}');
      if (close == std::string_view::npos || !parse_labels(rest.substr(1, close - 1), &s.labels))
        continue;
      rest.remove_prefix(close + 1);
    }
    while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
    rest = rest.substr(0, rest.find(' '));  // a timestamp may follow
    double v = 0;
    auto [ptr, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), v);
    if (ec != std::errc() || ptr != rest.data() + rest.size()) continue;
    s.value = v;
    out.push_back(std::move(s));
  }
  return out;
}

double metric_sum(const std::vector<MetricSample>& samples, std::string_view name) {
  double sum = 0;
  for (const auto& s : samples)
    if (s.name == name) sum += s.value;
  return sum;
}

std::map<std::string, double> metric_by(const std::vector<MetricSample>& samples,
                                        std::string_view name, std::string_view label) {
  std::map<std::string, double> out;
  for (const auto& s : samples) {
    if (s.name != name) continue;
    auto it = s.labels.find(std::string(label));
    if (it != s.labels.end()) out[it->second] += s.value;
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> top_rate_counters() {
  return {{"creates", "tidepool_sandbox_creations_total"},
          {"removals", "tidepool_sandbox_destructions_total"},
          {"execs", "tidepool_exec_total"},
          {"pool hits", "tidepool_pool_hits_total"},
          {"pool misses", "tidepool_pool_misses_total"},
          {"http requests", "tidepool_http_requests_total"}};
}

std::optional<double> counter_rate(const TopSample& now, const TopSample* prev,
                                   std::string_view counter) {
  if (prev == nullptr) return std::nullopt;
  double dt = now.at - prev->at;
  if (!(dt > 0)) return std::nullopt;
  double d = metric_sum(now.metrics, counter) - metric_sum(prev->metrics, counter);
  if (d < 0) return std::nullopt;
  return d / dt;
}

std::string render_top(const TopSample& now, const TopSample* prev) {
  std::string out;
  char when[32] = "";
  struct tm tm {};
  if (localtime_r(&now.wall, &tm) != nullptr) std::strftime(when, sizeof when, "%H:%M:%S", &tm);
  out += "tidepool top  " + now.url + "  " + when + "\n\n";

  std::string states;
  auto by_state = metric_by(now.metrics, "tidepool_sandboxes", "state");
  for (const char* st : {"creating", "running", "paused"}) {
    auto it = by_state.find(st);
    states += std::string(states.empty() ? "" : "  ") + st + " " +
              format_number(it == by_state.end() ? 0 : it->second);
  }
  for (const auto& [st, n] : by_state)
    if (st != "creating" && st != "running" && st != "paused")
      states += "  " + st + " " + format_number(n);
  out += "Sandboxes: " + states + "\n";

  std::vector<std::vector<std::string>> rates{{"COUNTER", "TOTAL", "PER SECOND"}};
  for (const auto& [label, counter] : top_rate_counters()) {
    auto r = counter_rate(now, prev, counter);
    char buf[32] = "-";
    if (r) std::snprintf(buf, sizeof buf, "%.2f", *r);
    rates.push_back({label, format_number(metric_sum(now.metrics, counter)), buf});
  }
  out += "\n" + format_table(rates);

  out += "\nPools (" + std::to_string(now.pools.size()) + ")\n";
  if (!now.pools.empty()) out += format_table(pool_rows(now.pools));
  out += "\nJobs (" + std::to_string(now.jobs.size()) + ")\n";
  if (!now.jobs.empty()) out += format_table(job_rows(now.jobs, now.wall));
  return out;
}

}  // namespace tp::cli
