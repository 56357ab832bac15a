// api_bench: Tidepool through its HTTP API from an in-process client.
//
// Measures, against a running tidepoold (--url, default TIDEPOOL_URL or
// http://127.0.0.1:7070):
//   1. latency of create, first exec of `true` (static busybox's, as the floor's, when
//      the image has it; --cmd), destroy, and their sum (p50, p99)
//   2. sustained sandboxes per second (create + exec true + destroy) with 1 and 2
//      concurrent clients
//   3. idle host memory per sandbox with --idle N sandboxes alive: kernel
//      counters from /proc/meminfo (slab, stacks, page tables, per-cpu) plus the
//      agents' PSS; the sandboxes' memory cgroup is printed for comparison
// Prints a table, or JSON with --json. No thresholds: bench/run.sh compares.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <boost/json.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "cli/http_client.h"

namespace json = boost::json;
using tp::bench::Clock;
using tp::bench::ms_since;
using tp::bench::pct;
using tp::cli::HttpClient;
using tp::cli::Method;

namespace {

struct Cycle {
  double create = 0, exec = 0, destroy = 0;
  bool ok = false;
};

// The create request; --image replaces the image before any request is sent.
std::string g_create_body = R"({"image":"host","memory_mb":256,"cpus":1,"ttl_seconds":600})";
// The command timed as "first exec": --cmd, space-separated (see main for the default).
std::string g_exec_body = R"({"cmd":["true"]})";

Cycle cycle(HttpClient& c) {
  Cycle r;
  auto t0 = Clock::now();
  auto created = c.request(Method::kPost, "/v1/sandboxes", g_create_body, "application/json");
  r.create = ms_since(t0);
  if (!created) {
    std::fprintf(stderr, "create: %s\n", created.error().message().c_str());
    return r;
  }
  std::string id(json::parse(created->body).as_object().at("id").as_string());
  auto t1 = Clock::now();
  auto ex =
      c.request(Method::kPost, "/v1/sandboxes/" + id + "/exec", g_exec_body, "application/json");
  r.exec = ms_since(t1);
  auto t2 = Clock::now();
  auto del = c.request(Method::kDelete, "/v1/sandboxes/" + id);
  r.destroy = ms_since(t2);
  r.ok = ex.has_value() && del.has_value();
  if (!ex) std::fprintf(stderr, "exec: %s\n", ex.error().message().c_str());
  if (!del) std::fprintf(stderr, "delete: %s\n", del.error().message().c_str());
  return r;
}

std::map<std::string, long> meminfo_kb() {
  std::map<std::string, long> m;
  std::ifstream in("/proc/meminfo");
  std::string k;
  long v;
  std::string unit;
  while (in >> k >> v) {
    k.pop_back();
    m[k] = v;
    std::getline(in, unit);
  }
  return m;
}

// Kernel memory that sandboxes cost (slab, stacks, page tables, per-cpu). Anon
// pages are left out: on a shared machine other processes move them; the
// agents' own pages are counted by agents_pss_kb().
long kernel_kb() {
  auto m = meminfo_kb();
  return m["Slab"] + m["KernelStack"] + m["PageTables"] + m["Percpu"];
}

// Proportional set size of every tp-agent process (shared text counted once in total).
long agents_pss_kb() {
  long total = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream comm(e.path() / "comm");
    std::string c;
    if (!(comm >> c) || c != "tp-agent") continue;
    std::ifstream sm(e.path() / "smaps_rollup");
    std::string k;
    long v;
    while (sm >> k) {
      if (k == "Pss:" && sm >> v) {
        total += v;
        break;
      }
    }
  }
  return total;
}

// Memory charged to the sandboxes' cgroups: the parent holding `id`'s cgroup.
long cgroup_usage_kb(const std::string& id) {
  for (const char* root : {"/sys/fs/cgroup/memory", "/sys/fs/cgroup"}) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
      if (e.path().filename().string().rfind("tidepool", 0) != 0) continue;
      if (!std::filesystem::exists(e.path() / id)) continue;
      for (const char* f : {"memory.usage_in_bytes", "memory.current"}) {
        std::ifstream in(e.path() / f);
        long v;
        if (in >> v) return v / 1024;
      }
    }
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"api_bench: Tidepool create/exec/destroy through the HTTP API"};
  const char* env_url = std::getenv("TIDEPOOL_URL");
  std::string url = env_url ? env_url : "http://127.0.0.1:7070";
  int iterations = 200, warmup = 10, rate_seconds = 10, idle = 500;
  bool as_json = false, samples = false;
  std::string image = "host";
  // The floor (raw_floor) execs static busybox `true`: with the host image the
  // same binary is there when busybox-static is installed, so both run the same
  // program; a dynamic /usr/bin/true adds ~0.4 ms of loading to every exec.
  std::string cmd = std::filesystem::exists("/bin/busybox") ? "/bin/busybox true" : "true";
  std::vector<int> concurrency{1, 2};
  std::string tpl;
  app.add_option("--url", url);
  app.add_option("--iterations", iterations, "sequential cycles for latency");
  app.add_option("--warmup", warmup);
  app.add_option("--rate-seconds", rate_seconds, "duration of each sustained-rate run");
  app.add_option("--idle", idle, "sandboxes alive for the memory measurement (0 skips)");
  app.add_flag("--json", as_json);
  app.add_option("--image", image, "image of the sandboxes (default host)");
  app.add_option(
      "--cmd", cmd,
      "command of the first exec, space-separated (default: busybox true, as the floor)");
  app.add_option("--concurrency", concurrency,
                 "client threads of each sustained-rate run (default 1,2)")
      ->delimiter(',');
  app.add_option("--template", tpl,
                 "create from this template (its warm pool first); the image's shape is then "
                 "the template's");
  app.add_flag("--samples", samples,
               "with --json: every create+exec+destroy time (bench/run.sh plots them)");
  CLI11_PARSE(app, argc, argv);
  if (image != "host" && !app.count("--cmd")) cmd = "true";  // what the image itself has
  json::array argv_json;
  for (size_t i = 0; i < cmd.size();) {
    size_t j = cmd.find(' ', i);
    if (j == std::string::npos) j = cmd.size();
    if (j > i) argv_json.emplace_back(cmd.substr(i, j - i));
    i = j + 1;
  }
  g_exec_body = json::serialize(json::object{{"cmd", argv_json}});
  g_create_body = json::serialize(
      json::object{{"image", image}, {"memory_mb", 256}, {"cpus", 1}, {"ttl_seconds", 600}});
  if (!tpl.empty())
    g_create_body = json::serialize(json::object{{"template", tpl}, {"ttl_seconds", 600}});

  auto parsed = tp::cli::Url::parse(url);
  if (!parsed) {
    std::fprintf(stderr, "api_bench: %s\n", parsed.error().message().c_str());
    return 2;
  }
  HttpClient client(*parsed);
  for (int i = 0; i < warmup; ++i) cycle(client);

  std::vector<double> c_ms, e_ms, d_ms, t_ms, ce_ms;
  int failures = 0;
  for (int i = 0; i < iterations; ++i) {
    Cycle r = cycle(client);
    if (!r.ok) {
      failures++;
      continue;
    }
    c_ms.push_back(r.create);
    e_ms.push_back(r.exec);
    d_ms.push_back(r.destroy);
    t_ms.push_back(r.create + r.exec + r.destroy);
    ce_ms.push_back(r.create + r.exec);
  }

  std::map<int, double> rate;
  for (int workers : rate_seconds > 0 ? concurrency : std::vector<int>{}) {
    std::atomic<long> done{0};
    std::atomic<bool> stop{false};
    std::vector<std::thread> ts;
    auto t0 = Clock::now();
    for (int w = 0; w < workers; ++w)
      ts.emplace_back([&] {
        HttpClient c(*parsed);
        while (!stop.load()) {
          if (cycle(c).ok) done++;
        }
      });
    std::this_thread::sleep_for(std::chrono::seconds(rate_seconds));
    stop = true;
    for (auto& t : ts) t.join();
    rate[workers] = static_cast<double>(done.load()) / (ms_since(t0) / 1000.0);
  }

  double idle_kernel_kb = -1, idle_cg_kb = -1, idle_agent_kb = -1;
  if (idle > 0) {
    // Baselines: one sandbox alive so that the cgroup parent exists.
    auto probe = client.request(Method::kPost, "/v1/sandboxes", g_create_body, "application/json");
    std::string probe_id =
        probe ? std::string(json::parse(probe->body).as_object().at("id").as_string()) : "";
    std::this_thread::sleep_for(std::chrono::seconds(1));
    long k0 = kernel_kb(), cg0 = cgroup_usage_kb(probe_id), a0 = agents_pss_kb();
    std::vector<std::string> ids;
    for (int i = 0; i < idle; ++i) {
      auto created =
          client.request(Method::kPost, "/v1/sandboxes", g_create_body, "application/json");
      if (!created) {
        std::fprintf(stderr, "idle create %d: %s\n", i, created.error().message().c_str());
        break;
      }
      ids.emplace_back(json::parse(created->body).as_object().at("id").as_string());
    }
    std::this_thread::sleep_for(std::chrono::seconds(2));
    long k1 = kernel_kb(), cg1 = cgroup_usage_kb(probe_id), a1 = agents_pss_kb();
    if (!ids.empty()) {
      double n = static_cast<double>(ids.size());
      idle_kernel_kb = static_cast<double>(k1 - k0) / n;
      idle_agent_kb = static_cast<double>(a1 - a0) / n;
      if (cg0 >= 0 && cg1 >= 0) idle_cg_kb = static_cast<double>(cg1 - cg0) / n;
    }
    for (const auto& id : ids) (void)client.request(Method::kDelete, "/v1/sandboxes/" + id);
    if (!probe_id.empty()) (void)client.request(Method::kDelete, "/v1/sandboxes/" + probe_id);
    idle = static_cast<int>(ids.size());
  }

  if (as_json) {
    json::object o{{"iterations", iterations},
                   {"failures", failures},
                   {"create_p50_ms", pct(c_ms, 50)},
                   {"create_p99_ms", pct(c_ms, 99)},
                   {"exec_p50_ms", pct(e_ms, 50)},
                   {"exec_p99_ms", pct(e_ms, 99)},
                   {"destroy_p50_ms", pct(d_ms, 50)},
                   {"destroy_p99_ms", pct(d_ms, 99)},
                   {"total_p50_ms", pct(t_ms, 50)},
                   {"create_exec_p50_ms", pct(ce_ms, 50)},
                   {"total_p99_ms", pct(t_ms, 99)},
                   {"rate_1", rate[1]},
                   {"rate_2", rate[2]},
                   {"image", image},
                   {"cmd", cmd},
                   {"idle_sandboxes", idle},
                   {"idle_kernel_kb_per_sandbox", idle_kernel_kb},
                   {"idle_agent_pss_kb_per_sandbox", idle_agent_kb},
                   {"idle_total_kb_per_sandbox", idle_kernel_kb + idle_agent_kb},
                   {"idle_memcg_kb_per_sandbox", idle_cg_kb}};
    json::object rates;
    for (const auto& [w, r] : rate) rates[std::to_string(w)] = r;
    o["rates"] = std::move(rates);
    if (samples) {
      o["total_samples_ms"] = json::value_from(t_ms);
      o["create_exec_samples_ms"] = json::value_from(ce_ms);
    }
    std::printf("%s\n", json::serialize(o).c_str());
  } else {
    std::printf("tidepool API (%d cycles, %d failed; image %s, exec of `%s`)\n", iterations,
                failures, image.c_str(), cmd.c_str());
    std::printf("  %-22s %9s %9s\n", "phase", "p50 ms", "p99 ms");
    std::printf("  %-22s %9.2f %9.2f\n", "create", pct(c_ms, 50), pct(c_ms, 99));
    std::printf("  %-22s %9.2f %9.2f\n", "first exec", pct(e_ms, 50), pct(e_ms, 99));
    std::printf("  %-22s %9.2f %9.2f\n", "destroy", pct(d_ms, 50), pct(d_ms, 99));
    std::printf("  %-22s %9.2f %9.2f\n", "create+exec+destroy", pct(t_ms, 50), pct(t_ms, 99));
    std::printf("  sustained: %.1f sandboxes/s (1 client), %.1f (2 clients)\n", rate[1], rate[2]);
    if (idle > 0)
      std::printf(
          "  idle memory with %d alive: %.0f kB/sandbox = %.0f kernel (slab, stacks, page tables,"
          " percpu) + %.0f agent PSS; memcg says %.0f kB\n",
          idle, idle_kernel_kb + idle_agent_kb, idle_kernel_kb, idle_agent_kb, idle_cg_kb);
  }
  return failures ? 1 : 0;
}
