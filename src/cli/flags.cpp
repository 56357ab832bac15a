// CreateFlags and ExecFlags: the flag sets `create`, `run` and `exec` share.
#include <unistd.h>

#include <charconv>
#include <cmath>

#include "cli/commands.h"
#include "cli/parse.h"

namespace tp::cli {
namespace {

Error flag_error(std::string_view flag, const Error& e) {
  return Error{Code::kInvalidArgument, 0, std::string(flag) + ": " + e.message()};
}

Result<boost::json::object> pairs_to_object(std::string_view flag,
                                            const std::vector<std::string>& items) {
  boost::json::object o;
  for (const auto& item : items) {
    auto kv = parse_key_value(item);
    if (!kv) return std::unexpected(flag_error(flag, kv.error()));
    o[kv->first] = kv->second;
  }
  return o;
}

// Whole seconds for the daemon's integer fields, never rounding a positive value to 0.
int64_t ceil_seconds(double s) { return static_cast<int64_t>(std::ceil(s - 1e-9)); }

}  // namespace

void CreateFlags::add_to(CLI::App* app, bool placement) {
  app->add_option("--image", image, "image to start from (default: host)")->type_name("IMAGE");
  app->add_option("--tier", tier, "isolation tier: container or microvm (default: container)")
      ->type_name("TIER");
  app->add_option("--memory", memory,
                  "memory limit; K, M, G, T suffixes (binary), plain number = MiB (default 512M)")
      ->type_name("SIZE");
  app->add_option("--cpus", cpus, "CPU quota in cores, e.g. 0.5 (default 1)")->type_name("N");
  app->add_option("--disk", disk, "writable disk limit; same units as --memory (default 1G)")
      ->type_name("SIZE");
  app->add_option("--pids", pids, "maximum number of processes (default 512)")->type_name("N");
  app->add_option("--ttl", ttl,
                  "lifetime, e.g. 90s, 10m, 1h30m, plain number = seconds (default 1h)")
      ->type_name("DURATION");
  app->add_option("--idle-timeout", idle_timeout,
                  "remove after this long without requests (default: never)")
      ->type_name("DURATION");
  app->add_option("--label", labels, "label KEY=VALUE (repeatable)")
      ->type_name("K=V")
      ->allow_extra_args(false);
  app->add_option("--env", env, "environment variable KEY=VALUE (repeatable)")
      ->type_name("K=V")
      ->allow_extra_args(false);
  app->add_option("--priority", priority,
                  "normal, or best-effort (lowest CPU weight, SCHED_IDLE) (default normal)")
      ->type_name("PRIO");
  if (!placement) return;
  app->add_option("--template", template_name,
                  "start from this template (its warm pool first); other flags override it")
      ->type_name("NAME");
  app->add_option("--job", job, "belong to this job (its quotas apply; ending it removes this)")
      ->type_name("JOB");
  app->add_option("--step", step, "tag within the job (needs --job; `jobs end-step` removes it)")
      ->type_name("STEP");
}

Result<boost::json::object> CreateFlags::to_request() const {
  boost::json::object o;
  if (!image.empty()) o["image"] = image;
  if (!tier.empty()) o["tier"] = tier;
  if (!memory.empty()) {
    auto mb = parse_size_mb(memory);
    if (!mb) return std::unexpected(flag_error("--memory", mb.error()));
    o["memory_mb"] = *mb;
  }
  if (!disk.empty()) {
    auto mb = parse_size_mb(disk);
    if (!mb) return std::unexpected(flag_error("--disk", mb.error()));
    o["disk_mb"] = *mb;
  }
  if (!cpus.empty()) {
    double v = 0;
    auto [ptr, ec] = std::from_chars(cpus.data(), cpus.data() + cpus.size(), v);
    if (ec != std::errc() || ptr != cpus.data() + cpus.size() || !std::isfinite(v) || v <= 0) {
      return fail(Code::kInvalidArgument, "--cpus: expected a positive number, got '" + cpus + "'");
    }
    o["cpus"] = v;
  }
  if (pids) {
    if (*pids <= 0) return fail(Code::kInvalidArgument, "--pids: must be positive");
    o["pids"] = *pids;
  }
  if (!ttl.empty()) {
    auto s = parse_duration_seconds(ttl);
    if (!s) return std::unexpected(flag_error("--ttl", s.error()));
    if (*s <= 0) return fail(Code::kInvalidArgument, "--ttl: must be positive");
    o["ttl_seconds"] = ceil_seconds(*s);
  }
  if (!idle_timeout.empty()) {
    auto s = parse_duration_seconds(idle_timeout);
    if (!s) return std::unexpected(flag_error("--idle-timeout", s.error()));
    o["idle_timeout_seconds"] = ceil_seconds(*s);
  }
  if (!labels.empty()) {
    auto l = pairs_to_object("--label", labels);
    if (!l) return std::unexpected(l.error());
    o["labels"] = std::move(*l);
  }
  if (!env.empty()) {
    auto e = pairs_to_object("--env", env);
    if (!e) return std::unexpected(e.error());
    o["env"] = std::move(*e);
  }
  if (!priority.empty()) {
    if (priority != "normal" && priority != "best-effort")
      return fail(Code::kInvalidArgument,
                  "--priority: expected normal or best-effort, got '" + priority + "'");
    o["priority"] = priority;
  }
  if (!step.empty() && job.empty()) return fail(Code::kInvalidArgument, "--step: needs --job");
  if (!template_name.empty()) o["template"] = template_name;
  if (!job.empty()) o["job"] = job;
  if (!step.empty()) o["step"] = step;
  return o;
}

void ExecFlags::add_to(CLI::App* app, bool with_env) {
  app->add_option("--timeout", timeout,
                  "kill the command and all its processes after this long (exit 124)")
      ->type_name("DURATION");
  if (with_env) {
    app->add_option("--env", env, "environment variable KEY=VALUE (repeatable)")
        ->type_name("K=V")
        ->allow_extra_args(false);
  }
  app->add_option("--cwd", cwd, "working directory inside the sandbox (default /)")
      ->type_name("DIR");
  app->add_option("--user", user, "uid inside the sandbox (default 0)")->type_name("UID");
  app->add_flag("-i,--stdin", forward_stdin,
                "send this process's stdin to the command (read to end of file first)");
}

Result<boost::json::object> ExecFlags::to_request() const {
  if (cmd.empty()) return fail(Code::kInvalidArgument, "no command given (put it after --)");
  boost::json::object o;
  boost::json::array argv;
  for (const auto& a : cmd) argv.emplace_back(a);
  o["cmd"] = std::move(argv);
  o["stream"] = true;
  if (!timeout.empty()) {
    auto s = parse_duration_seconds(timeout);
    if (!s) return std::unexpected(flag_error("--timeout", s.error()));
    if (*s <= 0) return fail(Code::kInvalidArgument, "--timeout: must be positive");
    o["timeout"] = *s;
  }
  if (!env.empty()) {
    auto e = pairs_to_object("--env", env);
    if (!e) return std::unexpected(e.error());
    o["env"] = std::move(*e);
  }
  if (!cwd.empty()) o["cwd"] = cwd;
  if (user) {
    if (*user < 0) return fail(Code::kInvalidArgument, "--user: must not be negative");
    o["user"] = *user;
  }
  if (forward_stdin) {
    auto in = read_all(STDIN_FILENO, "stdin");
    if (!in) return std::unexpected(in.error());
    o["stdin"] = base64_encode(*in);
  }
  return o;
}

}  // namespace tp::cli
