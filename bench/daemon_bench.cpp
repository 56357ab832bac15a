// daemon_bench: the daemon's exec path, memory and restart, against a running tidepoold
// (--url, default TIDEPOOL_URL or http://127.0.0.1:7070). One mode per run, JSON on stdout
// (the last line; bench/peers.py and bench/run.sh read it), progress on stderr:
//
//   exec             p50/p99 of `busybox true` exec'd in one running sandbox over HTTP
//                    (one keep-alive connection, as api_bench), against spawning the same
//                    binary on the host (posix_spawn + waitpid, the floor of any exec);
//                    interleaved in --rounds rounds, order swapped every round
//   rss              the daemon's VmRSS before and after --count execs that each print
//                    4 MiB, every request with its own Idempotency-Key (the answers the
//                    daemon may keep for replays are what this watches)
//   restart-prepare  creates --count sandboxes and writes their ids to --ids
//   restart-wait     after bench/run.sh started the new daemon (at --t0-ns, CLOCK_REALTIME),
//                    execs in every sandbox of --ids until each answers or is reported
//                    gone; then deletes them. The time is until the last one answered.
//
// No thresholds: bench/report.py compares.
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench_http.h"
#include "bench_util.h"

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace json = boost::json;
using tp::bench::Clock;
using tp::bench::Conn;
using tp::bench::describe;
using tp::bench::exec_ok;
using tp::bench::ms_since;
using tp::bench::parse_url;
using tp::bench::pct;
using tp::bench::Target;

extern char** environ;

namespace {

std::string exec_body(const std::vector<std::string>& argv) {
  json::array a;
  for (const auto& s : argv) a.emplace_back(s);
  return json::serialize(json::object{{"cmd", a}});
}

std::optional<std::string> create(Conn& c, const std::string& image, int ttl) {
  std::string why;
  auto id = tp::bench::create_sandbox(c, image, ttl, &why);
  if (!id) std::fprintf(stderr, "daemon_bench: create: %s\n", why.c_str());
  return id;
}

long vm_rss_kb(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string k;
  while (in >> k) {
    long v;
    if (k == "VmRSS:" && in >> v) return v;
  }
  return -1;
}

// The host floor of one exec: spawn the binary (glibc's posix_spawn is clone(CLONE_VM |
// CLONE_VFORK) + exec), reap it.
std::optional<double> host_spawn_ms(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& s : argv) args.push_back(const_cast<char*>(s.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  auto t0 = Clock::now();
  pid_t pid;
  int rc = posix_spawn(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return std::nullopt;
  int st = 0;
  if (waitpid(pid, &st, 0) != pid) return std::nullopt;
  double ms = ms_since(t0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) return std::nullopt;
  return ms;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t j = s.find(' ', i);
    if (j == std::string::npos) j = s.size();
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

std::vector<std::string> read_ids(const std::string& path) {
  std::vector<std::string> ids;
  std::ifstream in(path);
  std::string id;
  while (in >> id) ids.push_back(id);
  return ids;
}

int64_t realtime_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

struct Opts {
  Target target;
  std::string image = "host";
  std::string cmd = "/bin/busybox true";
  std::string host_cmd = "/bin/busybox true";
  int rounds = 10, runs = 50, count = 100, daemon_pid = 0, wait_seconds = 30, threads = 4;
  std::string ids_path;
  int64_t t0_ns = 0;
};

int mode_exec(const Opts& o) {
  Conn c(o.target.host, o.target.port);
  auto id = create(c, o.image, 600);
  if (!id) return 1;
  const std::string target = "/v1/sandboxes/" + *id + "/exec";
  const std::string body = exec_body(split(o.cmd));
  const auto host_argv = split(o.host_cmd);
  std::vector<double> sb_ms, host_ms;
  int failures = 0;
  std::string last_error;
  // Warm-up of both paths (the sandbox's first exec, the host's page cache).
  for (int i = 0; i < 3; ++i) {
    (void)c.request(http::verb::post, target, body);
    (void)host_spawn_ms(host_argv);
  }
  for (int r = 0; r < o.rounds; ++r) {
    for (int half = 0; half < 2; ++half) {
      const bool sandbox_side = (half == 0) == (r % 2 == 0);
      for (int i = 0; i < o.runs; ++i) {
        if (sandbox_side) {
          auto t0 = Clock::now();
          auto a = c.request(http::verb::post, target, body);
          double ms = ms_since(t0);
          if (exec_ok(a)) {
            sb_ms.push_back(ms);
          } else {
            failures++;
            last_error = describe(a);
          }
        } else if (auto ms = host_spawn_ms(host_argv)) {
          host_ms.push_back(*ms);
        } else {
          failures++;
          last_error = "host spawn of " + o.host_cmd + " failed";
        }
      }
    }
  }
  (void)c.request(http::verb::delete_, "/v1/sandboxes/" + *id);
  if (!last_error.empty()) std::fprintf(stderr, "daemon_bench exec: %s\n", last_error.c_str());
  double s50 = pct(sb_ms, 50), h50 = pct(host_ms, 50);
  json::object out{{"mode", "exec"},
                   {"cmd", o.cmd},
                   {"host_cmd", o.host_cmd},
                   {"image", o.image},
                   {"runs", static_cast<int64_t>(sb_ms.size())},
                   {"failures", failures},
                   {"sandbox_p50_ms", s50},
                   {"sandbox_p99_ms", pct(sb_ms, 99)},
                   {"host_p50_ms", h50},
                   {"host_p99_ms", pct(host_ms, 99)},
                   {"ratio_p50", h50 > 0 ? s50 / h50 : 0.0}};
  if (!last_error.empty()) out["error"] = last_error;
  std::printf("%s\n", json::serialize(out).c_str());
  return failures ? 1 : 0;
}

int mode_rss(const Opts& o) {
  if (o.daemon_pid <= 0) {
    std::fprintf(stderr, "daemon_bench rss: --daemon-pid is required\n");
    return 2;
  }
  Conn c(o.target.host, o.target.port);
  auto id = create(c, o.image, 600);
  if (!id) return 1;
  const std::string target = "/v1/sandboxes/" + *id + "/exec";
  constexpr long kBytes = 4l << 20;
  const std::string body = exec_body(
      {"/bin/busybox", "sh", "-c",
       "/bin/busybox yes 0123456789abcdef | /bin/busybox head -c " + std::to_string(kBytes)});
  // The sandbox's first exec is not what is measured.
  (void)c.request(http::verb::post, target, exec_body({"/bin/busybox", "true"}));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const long before = vm_rss_kb(o.daemon_pid);
  const std::string key_prefix = "bench-rss-" + std::to_string(realtime_ns()) + "-";
  int failures = 0;
  long short_output = 0;
  std::string last_error;
  auto t0 = Clock::now();
  for (int i = 0; i < o.count; ++i) {
    auto a = c.request(http::verb::post, target, body,
                       {{"Idempotency-Key", key_prefix + std::to_string(i)}});
    if (!exec_ok(a)) {
      failures++;
      last_error = describe(a);
      continue;
    }
    // stdout comes base64-encoded.
    const auto* out = json::parse(a.body).as_object().if_contains("stdout");
    if (!out || !out->is_string() ||
        static_cast<long>(out->as_string().size()) != (kBytes + 2) / 3 * 4)
      short_output++;
  }
  double seconds = ms_since(t0) / 1000.0;
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const long after = vm_rss_kb(o.daemon_pid);
  (void)c.request(http::verb::delete_, "/v1/sandboxes/" + *id);
  if (!last_error.empty()) std::fprintf(stderr, "daemon_bench rss: %s\n", last_error.c_str());
  json::object out{{"mode", "rss"},
                   {"execs", o.count},
                   {"bytes_each", kBytes},
                   {"failures", failures},
                   {"short_output", short_output},
                   {"seconds", seconds},
                   {"rss_before_mib", static_cast<double>(before) / 1024.0},
                   {"rss_after_mib", static_cast<double>(after) / 1024.0}};
  if (!last_error.empty()) out["error"] = last_error;
  std::printf("%s\n", json::serialize(out).c_str());
  return failures ? 1 : 0;
}

int mode_restart_prepare(const Opts& o) {
  Conn c(o.target.host, o.target.port);
  std::ofstream ids(o.ids_path, std::ios::trunc);
  int made = 0;
  auto t0 = Clock::now();
  const std::string body = exec_body(split(o.cmd));
  for (int i = 0; i < o.count; ++i) {
    auto id = create(c, o.image, 3600);
    if (!id) break;
    ids << *id << "\n";
    made++;
    // Each one answers before the restart: the measurement is then about the restart only.
    auto a = c.request(http::verb::post, "/v1/sandboxes/" + *id + "/exec", body);
    if (!exec_ok(a)) {
      std::fprintf(stderr, "daemon_bench restart-prepare: exec in %s: %s\n", id->c_str(),
                   describe(a).c_str());
      break;
    }
  }
  ids.flush();
  std::printf("%s\n", json::serialize(json::object{{"mode", "restart-prepare"},
                                                   {"created", made},
                                                   {"seconds", ms_since(t0) / 1000.0}})
                          .c_str());
  return made == o.count && ids ? 0 : 1;
}

int mode_restart_wait(const Opts& o) {
  const auto ids = read_ids(o.ids_path);
  enum class Fate { kPending, kAnswered, kGone };
  std::vector<Fate> fate(ids.size(), Fate::kPending);
  std::vector<double> answered_at_s(ids.size(), 0);
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::string last_error;
  const auto deadline = Clock::now() + std::chrono::seconds(o.wait_seconds);
  const std::string body = exec_body(split(o.cmd));
  auto since_t0_s = [&] { return static_cast<double>(realtime_ns() - o.t0_ns) / 1e9; };
  // Each worker takes the next id and keeps at it until it answers, is reported gone, or the
  // deadline passes. "Gone": the daemon answers for it as stopped or lost, or not at all (404).
  auto worker = [&] {
    Conn c(o.target.host, o.target.port);
    for (size_t i; (i = next.fetch_add(1)) < ids.size();) {
      const std::string base = "/v1/sandboxes/" + ids[i];
      while (Clock::now() < deadline) {
        auto a = c.request(http::verb::post, base + "/exec", body);
        if (exec_ok(a)) {
          fate[i] = Fate::kAnswered;
          answered_at_s[i] = since_t0_s();
          break;
        }
        if (a.status != 0) {
          auto g = c.request(http::verb::get, base);
          std::string state;
          if (g.status == 200) {
            boost::system::error_code ec;
            auto v = json::parse(g.body, ec);
            if (!ec && v.is_object())
              if (const auto* s = v.as_object().if_contains("state"); s && s->is_string())
                state = std::string(s->as_string());
          }
          if (g.status == 404 || state == "stopped" || state == "lost") {
            fate[i] = Fate::kGone;
            break;
          }
          std::lock_guard lock(mu);
          last_error = describe(a);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < std::max(1, o.threads); ++t) ts.emplace_back(worker);
  for (auto& t : ts) t.join();
  const double waited_s = since_t0_s();

  size_t answered = 0, gone = 0;
  double last = 0, first = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (fate[i] == Fate::kAnswered) {
      first = answered ? std::min(first, answered_at_s[i]) : answered_at_s[i];
      answered++;
      last = std::max(last, answered_at_s[i]);
    } else if (fate[i] == Fate::kGone) {
      gone++;
    }
  }
  // What survived is removed here; what did not, the new daemon has cleaned up already.
  {
    Conn c(o.target.host, o.target.port);
    for (size_t i = 0; i < ids.size(); ++i)
      if (fate[i] != Fate::kGone) (void)c.request(http::verb::delete_, "/v1/sandboxes/" + ids[i]);
  }
  json::object out{{"mode", "restart-wait"},
                   {"sandboxes", static_cast<int64_t>(ids.size())},
                   {"answered", static_cast<int64_t>(answered)},
                   {"gone", static_cast<int64_t>(gone)},
                   {"waited_seconds", waited_s}};
  // The first answer: about when the new daemon served again (its start and recovery);
  // the rest is the time to reach every sandbox from --threads connections.
  if (answered) out["first_answer_seconds"] = first;
  if (answered == ids.size() && !ids.empty())
    out["seconds"] = last;
  else
    out["seconds"] = nullptr;
  if (!last_error.empty()) out["error"] = last_error;
  std::printf("%s\n", json::serialize(out).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"daemon_bench: tidepoold's exec path, memory under keyed execs, restart"};
  const char* env_url = std::getenv("TIDEPOOL_URL");
  std::string url = env_url ? env_url : "http://127.0.0.1:7070";
  std::string mode;
  Opts o;
  app.add_option("mode", mode, "exec | rss | restart-prepare | restart-wait")
      ->required()
      ->check(CLI::IsMember({"exec", "rss", "restart-prepare", "restart-wait"}));
  app.add_option("--url", url);
  app.add_option("--image", o.image, "image of the sandboxes (default host)");
  app.add_option("--cmd", o.cmd,
                 "exec'd in the sandbox, space-separated (default /bin/busybox true)");
  app.add_option("--host-cmd", o.host_cmd, "exec: spawned on the host, absolute path first");
  app.add_option("--rounds", o.rounds, "exec: interleaved rounds");
  app.add_option("--runs", o.runs, "exec: execs per side per round");
  app.add_option("--count", o.count, "rss: keyed execs; restart-prepare: sandboxes");
  app.add_option("--daemon-pid", o.daemon_pid, "rss: the daemon whose VmRSS is read");
  app.add_option("--ids", o.ids_path, "restart-*: the file of sandbox ids");
  app.add_option("--t0-ns", o.t0_ns,
                 "restart-wait: when the new daemon was started (CLOCK_REALTIME ns)");
  app.add_option("--wait-seconds", o.wait_seconds, "restart-wait: give up after this long");
  app.add_option("--threads", o.threads, "restart-wait: client connections");
  CLI11_PARSE(app, argc, argv);
  auto t = parse_url(url);
  if (!t) {
    std::fprintf(stderr, "daemon_bench: cannot parse --url %s (http://host:port)\n", url.c_str());
    return 2;
  }
  o.target = *t;
  if (mode == "exec") return mode_exec(o);
  if (mode == "rss") return mode_rss(o);
  if (o.ids_path.empty()) {
    std::fprintf(stderr, "daemon_bench %s: --ids is required\n", mode.c_str());
    return 2;
  }
  if (mode == "restart-prepare") return mode_restart_prepare(o);
  if (o.t0_ns == 0) o.t0_ns = realtime_ns();
  return mode_restart_wait(o);
}
