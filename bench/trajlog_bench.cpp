// trajlog_bench: what the trajectory log costs (docs/trajectory-log.md). It starts two
// daemons of one build side by side (--bin), one with --trajectory-log on (the default)
// and one with --trajectory-log off, each on its own data directory, and measures, JSON
// on the last line of stdout (bench/run.sh merges it; bench/report.py compares):
//
//   exec      p50/p99 of `true` exec'd without a key in a running sandbox, one keep-alive
//             connection per daemon, rounds interleaved (order swapped every round): the
//             log on records every one durably before answering, off records none
//   keyed     the same with an Idempotency-Key each (both daemons record those)
//   ff        fast-forward: a recorded keyed step sent again, answered from the log; its
//             Server-Timing (the daemon's time from the request to the recorded answer)
//             and the client's round trip
//   bytes     the log's bytes per step (records and side files, from GET .../log) after
//             --steps execs printing a short line
//   rate      sustained execs per second with 2 and 8 clients (each its own connection
//             and sandbox) for --rate-seconds each, log on and off interleaved
//
//   trajlog_bench --bin build/bin [--rounds N --runs N --steps N --rate-seconds S]
//
// No thresholds: bench/report.py compares against the targets.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <boost/json.hpp>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_http.h"
#include "bench_util.h"

namespace json = boost::json;
using tp::bench::Clock;
using tp::bench::Conn;
using tp::bench::ms_since;
using tp::bench::pct;
namespace http = boost::beast::http;

extern char** environ;

namespace {

void log(const std::string& m) {
  std::fprintf(stderr, "[trajlog_bench] %s\n", m.c_str());
  std::fflush(stderr);
}

// A tidepoold child on a free port and a data directory of its own.
class Daemon {
 public:
  Daemon(const std::string& bin, const std::string& name, std::vector<std::string> extra) {
    char tmpl[] = "/tmp/tp-trajbench-XXXXXX";
    dir_ = mkdtemp(tmpl);
    ::chmod(dir_.c_str(), 0711);  // the sandboxes' mapped root traverses it
    std::vector<std::string> args = {bin + "/tidepoold", "--listen",     "127.0.0.1:0",
                                     "--insecure-tcp",   "--socket",     "",
                                     "--data-dir",       dir_ + "/data", "--stop-sandboxes-on-exit",
                                     "--log-level",      "warn"};
    for (auto& e : extra) args.push_back(std::move(e));
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int out[2];
    if (::pipe(out) != 0) return;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    int rc = posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(out[1]);
    if (rc != 0) {
      ::close(out[0]);
      pid_ = 0;
      return;
    }
    // "tidepoold ready on http://127.0.0.1:PORT (...)"
    std::string line;
    char c;
    while (line.find("ready on ") == std::string::npos || line.back() != '\n') {
      if (::read(out[0], &c, 1) != 1) break;
      line.push_back(c);
      if (c == '\n' && line.find("ready on ") == std::string::npos) line.clear();
    }
    ::close(out[0]);
    auto at = line.find("http://");
    if (at == std::string::npos) return;
    auto t = tp::bench::parse_url(line.substr(at, line.find(' ', at) - at));
    if (t) target_ = *t;
    ok_ = t.has_value();
    log(name + ": tidepoold pid " + std::to_string(pid_) + " on " + target_.host + ":" +
        target_.port);
  }
  ~Daemon() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int st;
      ::waitpid(pid_, &st, 0);
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  bool ok() const { return ok_; }
  std::unique_ptr<Conn> conn() const { return std::make_unique<Conn>(target_.host, target_.port); }

 private:
  std::string dir_;
  pid_t pid_ = 0;
  tp::bench::Target target_;
  bool ok_ = false;
};

std::optional<std::string> create(Conn& c) {
  std::string why;
  auto id = tp::bench::create_sandbox(c, "host", 3600, &why);
  if (!id) log("create: " + why);
  return id;
}

// "replay;dur=0.083" -> 0.083
std::optional<double> replay_ms(const std::string& st) {
  auto at = st.find("dur=");
  if (at == std::string::npos) return std::nullopt;
  return std::strtod(st.c_str() + at + 4, nullptr);
}

json::object stats(const std::vector<double>& v) {
  return json::object{
      {"n", static_cast<int64_t>(v.size())}, {"p50_ms", pct(v, 50)}, {"p99_ms", pct(v, 99)}};
}

struct Opts {
  std::string bin = "build/bin";
  int rounds = 10, runs = 50, steps = 200, ff = 200;
  double rate_seconds = 5;
};

struct Side {
  std::string name;
  Daemon* d;
  std::unique_ptr<Conn> conn;
  std::string sandbox;
  std::vector<double> exec_ms, keyed_ms;
};

// Sustained execs per second: `clients` threads, each with its own connection and
// sandbox, for `seconds`.
json::object rate(Daemon& d, int clients, double seconds, std::vector<std::string>& sandboxes) {
  std::atomic<int64_t> done{0}, failed{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> ts;
  for (int i = 0; i < clients; ++i)
    ts.emplace_back([&, i] {
      auto c = d.conn();
      const std::string target = "/v1/sandboxes/" + sandboxes[static_cast<size_t>(i)] + "/exec";
      while (!stop) {
        auto a = c->request(http::verb::post, target, R"({"cmd":["/bin/true"]})");
        (tp::bench::exec_ok(a) ? done : failed)++;
      }
    });
  auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
  stop = true;
  for (auto& t : ts) t.join();
  double s = ms_since(t0) / 1000.0;
  return json::object{{"clients", clients},
                      {"execs", done.load()},
                      {"failed", failed.load()},
                      {"seconds", s},
                      {"per_second", static_cast<double>(done.load()) / s}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"trajlog_bench: the trajectory log's cost (see the file's header)"};
  Opts o;
  app.add_option("--bin", o.bin, "directory of tidepoold and tp-agent");
  app.add_option("--rounds", o.rounds, "exec: interleaved rounds");
  app.add_option("--runs", o.runs, "exec: execs per daemon per round");
  app.add_option("--steps", o.steps, "bytes: steps in the sandbox whose log is measured");
  app.add_option("--ff", o.ff, "fast-forward: recorded steps sent again");
  app.add_option("--rate-seconds", o.rate_seconds, "rate: seconds per client count and daemon");
  CLI11_PARSE(app, argc, argv);
  json::object out{{"mode", "trajectory"}};
  Daemon on(o.bin, "log on", {});
  Daemon off(o.bin, "log off", {"--trajectory-log", "off"});
  if (!on.ok() || !off.ok()) {
    out["error"] = "a daemon did not start";
    std::printf("%s\n", json::serialize(out).c_str());
    return 1;
  }
  std::vector<Side> sides;
  sides.push_back({"on", &on, on.conn(), "", {}, {}});
  sides.push_back({"off", &off, off.conn(), "", {}, {}});
  for (auto& s : sides) {
    auto id = create(*s.conn);
    if (!id) {
      out["error"] = "create failed";
      std::printf("%s\n", json::serialize(out).c_str());
      return 1;
    }
    s.sandbox = *id;
  }
  const std::string body = R"({"cmd":["/bin/true"]})";
  int64_t failures = 0;
  // exec (no key) and keyed, interleaved.
  log("exec latency: " + std::to_string(o.rounds) + " rounds x " + std::to_string(o.runs));
  for (auto& s : sides)
    for (int i = 0; i < 5; ++i)  // warm-up
      (void)s.conn->request(http::verb::post, "/v1/sandboxes/" + s.sandbox + "/exec", body);
  int64_t key_seq = 0;
  for (int r = 0; r < o.rounds; ++r)
    for (int half = 0; half < 2; ++half) {
      Side& s = sides[static_cast<size_t>((half + r) % 2)];
      const std::string target = "/v1/sandboxes/" + s.sandbox + "/exec";
      for (int i = 0; i < o.runs; ++i) {
        auto t0 = Clock::now();
        auto a = s.conn->request(http::verb::post, target, body);
        double ms = ms_since(t0);
        tp::bench::exec_ok(a) ? s.exec_ms.push_back(ms) : (void)failures++;
        std::vector<std::pair<std::string, std::string>> key = {
            {"Idempotency-Key", "bench-" + s.name + "-" + std::to_string(++key_seq)}};
        t0 = Clock::now();
        a = s.conn->request(http::verb::post, target, body, key);
        ms = ms_since(t0);
        tp::bench::exec_ok(a) ? s.keyed_ms.push_back(ms) : (void)failures++;
      }
    }
  out["exec_on"] = stats(sides[0].exec_ms);
  out["exec_off"] = stats(sides[1].exec_ms);
  out["keyed_on"] = stats(sides[0].keyed_ms);
  out["keyed_off"] = stats(sides[1].keyed_ms);
  double p_on = pct(sides[0].exec_ms, 50), p_off = pct(sides[1].exec_ms, 50);
  out["added_p50_pct"] = p_off > 0 ? (p_on / p_off - 1) * 100 : 0.0;

  // Fast-forward: record steps, then send each again.
  {
    Side& s = sides[0];
    const std::string target = "/v1/sandboxes/" + s.sandbox + "/exec";
    const std::string step = R"({"cmd":["sh","-c","echo step"]})";
    for (int i = 0; i < o.ff; ++i)
      (void)s.conn->request(http::verb::post, target, step,
                            {{"Idempotency-Key", "ff-" + std::to_string(i)}});
    std::vector<double> server, client;
    for (int i = 0; i < o.ff; ++i) {
      auto t0 = Clock::now();
      auto a = s.conn->request(http::verb::post, target, step,
                               {{"Idempotency-Key", "ff-" + std::to_string(i)}});
      double ms = ms_since(t0);
      auto st = replay_ms(a.server_timing);
      if (a.status != 200 || !st) {
        failures++;
        continue;
      }
      server.push_back(*st);
      client.push_back(ms);
    }
    out["ff_server"] = stats(server);
    out["ff_client"] = stats(client);
  }

  // Bytes per step: a sandbox of its own, --steps execs printing a short line.
  {
    Conn& c = *sides[0].conn;
    auto id = create(c);
    if (id) {
      const std::string target = "/v1/sandboxes/" + *id + "/exec";
      for (int i = 0; i < o.steps; ++i)
        (void)c.request(http::verb::post, target,
                        R"({"cmd":["sh","-c","echo step )" + std::to_string(i) + R"("]})",
                        {{"Idempotency-Key", "bytes-" + std::to_string(i)}});
      auto a = c.request(http::verb::get, "/v1/sandboxes/" + *id + "/log?limit=1");
      boost::system::error_code ec;
      auto v = json::parse(a.body, ec);
      if (!ec && v.is_object()) {
        auto& l = v.as_object();
        int64_t bytes = l.at("bytes").to_number<int64_t>();
        int64_t records = l.at("records").to_number<int64_t>();
        out["bytes"] = json::object{{"steps", o.steps},
                                    {"records", records},
                                    {"log_bytes", bytes},
                                    {"per_step", static_cast<double>(bytes) / o.steps}};
      }
      (void)c.request(http::verb::delete_, "/v1/sandboxes/" + *id);
    }
  }

  // Sustained rate, 2 and 8 clients, on and off interleaved.
  {
    std::vector<std::string> sb_on, sb_off;
    auto con = on.conn(), coff = off.conn();
    for (int i = 0; i < 8; ++i) {
      auto a = create(*con), b = create(*coff);
      if (!a || !b) break;
      sb_on.push_back(*a);
      sb_off.push_back(*b);
    }
    if (sb_on.size() == 8) {
      json::object r_on, r_off;
      for (int clients : {2, 8}) {
        log("rate: " + std::to_string(clients) + " clients");
        r_on[std::to_string(clients)] = rate(on, clients, o.rate_seconds, sb_on);
        r_off[std::to_string(clients)] = rate(off, clients, o.rate_seconds, sb_off);
      }
      out["rate_on"] = std::move(r_on);
      out["rate_off"] = std::move(r_off);
    }
    for (auto& id : sb_on) (void)con->request(http::verb::delete_, "/v1/sandboxes/" + id);
    for (auto& id : sb_off) (void)coff->request(http::verb::delete_, "/v1/sandboxes/" + id);
  }
  for (auto& s : sides) (void)s.conn->request(http::verb::delete_, "/v1/sandboxes/" + s.sandbox);
  out["failures"] = failures;
  out["config"] = json::object{{"rounds", o.rounds},
                               {"runs", o.runs},
                               {"steps", o.steps},
                               {"ff", o.ff},
                               {"rate_seconds", o.rate_seconds}};
  std::printf("%s\n", json::serialize(out).c_str());
  return failures ? 1 : 0;
}
