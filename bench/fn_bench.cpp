// fn_bench: the function tier (docs/function-tier.md) against what it replaces, side by
// side in one run, against a running tidepoold (--url, default TIDEPOOL_URL or
// http://127.0.0.1:7070):
//   1. `print(1)` in python through the function tier (POST /v1/functions/run): latency
//      at the client (p50, p99), at the server (the answer's server_ms) and runs per
//      second with 1, 2 and 8 concurrent clients;
//   2. the same program in a fresh container-tier sandbox per call (create, exec
//      `python3 -c 'print(1)'`, delete), as a trainer without a function tier would;
//   3. a bare `python3 -c 'print(1)'` process on the host (posix_spawn + wait), the
//      floor of starting an interpreter at all;
//   4. a C++ solution against 100 test cases in one batch call (POST /v1/functions/batch
//      with cases): once cold (compiled in that call) and once warm (cached binary).
// Rows run interleaved round by round so that load from neighbours hits all alike.
// Prints a table, or one JSON object with --json. No thresholds: bench/run.sh and
// bench/report.py compare.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <boost/json.hpp>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "cli/http_client.h"

extern char** environ;

namespace json = boost::json;
using tp::bench::Clock;
using tp::bench::ms_since;
using tp::bench::pct;
using tp::cli::HttpClient;
using tp::cli::Method;
using tp::cli::Url;

namespace {

struct Sample {
  std::vector<double> client_ms;
  std::vector<double> server_ms;
  size_t ok = 0, failed = 0;
  double seconds = 0;
  std::string last_error;
};

// One unit of work of a row; returns false on failure (with *err), *server_ms when known.
using Op = std::function<bool(HttpClient*, double* server_ms, std::string* err)>;

Sample measure(const Url& url, const Op& op, int clients, double seconds, size_t min_calls) {
  Sample s;
  std::mutex mu;
  std::atomic<size_t> done{0};
  auto t0 = Clock::now();
  auto deadline =
      t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  std::vector<std::thread> ts;
  for (int i = 0; i < clients; ++i)
    ts.emplace_back([&] {
      HttpClient c(url);
      std::vector<double> cm, sm;
      size_t ok = 0, bad = 0;
      std::string err;
      while (Clock::now() < deadline || done.load() < min_calls) {
        auto t = Clock::now();
        double server = -1;
        bool r = op(&c, &server, &err);
        double ms = ms_since(t);
        done.fetch_add(1);
        if (r) {
          ++ok;
          cm.push_back(ms);
          if (server >= 0) sm.push_back(server);
        } else {
          ++bad;
        }
        if (Clock::now() > deadline + std::chrono::seconds(120)) break;
      }
      std::lock_guard l(mu);
      s.client_ms.insert(s.client_ms.end(), cm.begin(), cm.end());
      s.server_ms.insert(s.server_ms.end(), sm.begin(), sm.end());
      s.ok += ok;
      s.failed += bad;
      if (!err.empty()) s.last_error = err;
    });
  for (auto& t : ts) t.join();
  s.seconds = ms_since(t0) / 1000.0;
  return s;
}

const std::string kPrint1 = R"J({"language":"python","source":"print(1)","timeout":10})J";

bool fn_print1(HttpClient* c, double* server_ms, std::string* err) {
  auto r = c->request(Method::kPost, "/v1/functions/run", kPrint1, "application/json");
  if (!r) return *err = r.error().message(), false;
  auto o = json::parse(r->body).as_object();
  if (o.at("verdict").as_string() != "ok" || o.at("stdout").as_string() != "1\n")
    return *err = "unexpected answer: " + r->body.substr(0, 300), false;
  *server_ms = o.at("server_ms").to_number<double>();
  return true;
}

bool sandbox_print1(HttpClient* c, double*, std::string* err) {
  auto created =
      c->request(Method::kPost, "/v1/sandboxes",
                 R"({"image":"host","memory_mb":256,"ttl_seconds":600})", "application/json");
  if (!created) return *err = "create: " + created.error().message(), false;
  std::string id(json::parse(created->body).as_object().at("id").as_string());
  auto ex = c->request(Method::kPost, "/v1/sandboxes/" + id + "/exec",
                       R"J({"cmd":["python3","-c","print(1)"]})J", "application/json");
  auto del = c->request(Method::kDelete, "/v1/sandboxes/" + id);
  if (!ex) return *err = "exec: " + ex.error().message(), false;
  if (!del) return *err = "delete: " + del.error().message(), false;
  auto o = json::parse(ex->body).as_object();
  if (o.at("exit_code").to_number<int64_t>() != 0)
    return *err = "exec: " + ex->body.substr(0, 200), false;
  return true;
}

bool host_print1(HttpClient*, double*, std::string* err) {
  const char* argv[] = {"/usr/bin/python3", "-c", "print(1)", nullptr};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid;
  int rc = posix_spawn(&pid, argv[0], &fa, nullptr, const_cast<char**>(argv), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return *err = std::string("posix_spawn: ") + std::strerror(rc), false;
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

json::object row_json(const Sample& s) {
  json::object o;
  o["calls"] = s.ok;
  o["failed"] = s.failed;
  o["seconds"] = s.seconds;
  o["per_second"] = s.seconds > 0 ? static_cast<double>(s.ok) / s.seconds : 0;
  o["p50_ms"] = pct(s.client_ms, 50);
  o["p99_ms"] = pct(s.client_ms, 99);
  if (!s.server_ms.empty()) {
    o["server_p50_ms"] = pct(s.server_ms, 50);
    o["server_p99_ms"] = pct(s.server_ms, 99);
  }
  if (!s.last_error.empty()) o["last_error"] = s.last_error;
  return o;
}

// A C++ solution (sum of two numbers per line, like a contest's A+B) and its 100 cases.
const char* kSolution = R"(#include <iostream>
int main() { long long a, b; while (std::cin >> a >> b) std::cout << a + b << "\n"; return 0; }
)";

// `source` is new to the daemon the first time (compiled in the call), cached the second.
json::object batch_once(const Url& url, const std::string& source) {
  json::object req;
  req["language"] = "cpp";
  req["source"] = source;
  req["timeout"] = 10;
  json::array cases;
  std::vector<std::string> want;
  for (int i = 0; i < 100; ++i) {
    json::object c;
    c["stdin"] = std::to_string(i) + " " + std::to_string(i * 7) + "\n";
    want.push_back(std::to_string(i + i * 7) + "\n");
    cases.emplace_back(std::move(c));
  }
  req["cases"] = std::move(cases);
  HttpClient c(url);
  auto t = Clock::now();
  auto r =
      c.request(Method::kPost, "/v1/functions/batch", json::serialize(req), "application/json");
  double ms = ms_since(t);
  json::object o;
  o["wall_ms"] = ms;
  if (!r) {
    o["error"] = r.error().message();
    return o;
  }
  auto results = json::parse(r->body).as_object().at("results").as_array();
  size_t right = 0;
  double compile_ms = 0, run_sum = 0;
  std::vector<double> runs;
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& x = results[i].as_object();
    if (x.contains("error")) continue;
    if (x.at("verdict").as_string() == "ok" && x.at("stdout").as_string() == want[i]) ++right;
    runs.push_back(x.at("wall_ms").to_number<double>());
    run_sum += runs.back();
    if (x.at("compile").is_object() && !x.at("compile_cached").as_bool())
      compile_ms =
          std::max(compile_ms, x.at("compile").as_object().at("wall_ms").to_number<double>());
  }
  o["cases"] = results.size();
  o["correct"] = right;
  o["compile_ms"] = compile_ms;
  o["case_p50_ms"] = pct(runs, 50);
  o["case_p99_ms"] = pct(runs, 99);
  o["cases_per_second"] = ms > 0 ? 1000.0 * static_cast<double>(results.size()) / ms : 0;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fn_bench: the function tier against a fresh sandbox and a bare host python3"};
  std::string url_text =
      std::getenv("TIDEPOOL_URL") ? std::getenv("TIDEPOOL_URL") : "http://127.0.0.1:7070";
  double seconds = 5, sandbox_seconds = 5;
  int rounds = 2;
  std::vector<int> clients = {1, 2, 8};
  bool as_json = false, skip_sandbox = false, skip_host = false, skip_batch = false;
  app.add_option("--url", url_text, "tidepoold URL")->capture_default_str();
  app.add_option("--seconds", seconds, "seconds per row, client count and round")
      ->capture_default_str();
  app.add_option("--sandbox-seconds", sandbox_seconds, "the same for the fresh-sandbox row")
      ->capture_default_str();
  app.add_option("--rounds", rounds, "rounds (rows interleaved per round)")->capture_default_str();
  app.add_option("--clients", clients, "client counts")->capture_default_str();
  app.add_flag("--skip-sandbox", skip_sandbox, "leave out the fresh-sandbox row");
  app.add_flag("--skip-host", skip_host, "leave out the host python3 row");
  app.add_flag("--skip-batch", skip_batch, "leave out the C++ batch calls");
  app.add_flag("--json", as_json, "print JSON");
  CLI11_PARSE(app, argc, argv);
  auto url = Url::parse(url_text);
  if (!url) {
    std::fprintf(stderr, "fn_bench: %s\n", url.error().message().c_str());
    return 2;
  }
  // Warm up: the first call starts the workers (sandbox + zygote), which is not what a
  // steady stream of calls sees.
  {
    HttpClient c(*url);
    double s;
    std::string err;
    for (int i = 0; i < 50; ++i)
      if (!fn_print1(&c, &s, &err) && i == 49) {
        std::fprintf(stderr, "fn_bench: the function tier does not answer: %s\n", err.c_str());
        return 1;
      }
  }
  struct Row {
    const char* name;
    Op op;
    double secs;
  };
  std::vector<Row> rows = {{"function", fn_print1, seconds}};
  if (!skip_host) rows.push_back({"host_python", host_print1, seconds});
  if (!skip_sandbox) rows.push_back({"sandbox", sandbox_print1, sandbox_seconds});
  std::map<std::string, std::map<int, Sample>> acc;
  for (int r = 0; r < rounds; ++r)
    for (int n : clients)
      for (const auto& row : rows) {
        Sample s = measure(*url, row.op, n, row.secs, static_cast<size_t>(n));
        Sample& a = acc[row.name][n];
        a.client_ms.insert(a.client_ms.end(), s.client_ms.begin(), s.client_ms.end());
        a.server_ms.insert(a.server_ms.end(), s.server_ms.begin(), s.server_ms.end());
        a.ok += s.ok;
        a.failed += s.failed;
        a.seconds += s.seconds;
        if (!s.last_error.empty()) a.last_error = s.last_error;
      }
  json::object out;
  json::object print1;
  for (auto& [name, by] : acc) {
    json::object per;
    for (auto& [n, s] : by) per[std::to_string(n)] = row_json(s);
    print1[name] = std::move(per);
  }
  out["print1"] = std::move(print1);
  // A comment unique to this run makes the program new to the daemon's compile cache.
  std::string source = std::string(kSolution) + "// fn_bench " +
                       std::to_string(Clock::now().time_since_epoch().count()) + "\n";
  if (!skip_batch) {
    out["batch_cold"] = batch_once(*url, source);
    out["batch_warm"] = batch_once(*url, source);
  }
  out["rounds"] = rounds;
  out["seconds"] = seconds;
  if (as_json) {
    std::printf("%s\n", json::serialize(out).c_str());
    return 0;
  }
  std::printf("%-12s %7s %9s %9s %11s %11s %9s\n", "print(1)", "clients", "p50 ms", "p99 ms",
              "server p50", "server p99", "calls/s");
  for (const auto& [name, per] : out.at("print1").as_object())
    for (const auto& [n, v] : per.as_object()) {
      const auto& o = v.as_object();
      auto num = [&](const char* k) { return o.contains(k) ? o.at(k).to_number<double>() : -1.0; };
      std::printf("%-12s %7s %9.2f %9.2f %11.2f %11.2f %9.1f\n", std::string(name).c_str(),
                  std::string(n).c_str(), num("p50_ms"), num("p99_ms"), num("server_p50_ms"),
                  num("server_p99_ms"), num("per_second"));
    }
  for (const char* k : {"batch_cold", "batch_warm"})
    if (out.contains(k)) std::printf("%s: %s\n", k, json::serialize(out.at(k)).c_str());
  return 0;
}
