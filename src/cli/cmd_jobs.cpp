// tidepool jobs ls|create|get|heartbeat|end|end-step: jobs, the sandboxes of one
// training run under a lease and quotas (api/openapi.yaml, /v1/jobs).
//
//   id=$(tidepool jobs create --name run7 --lease 2m --quota-sandboxes 64)
//   tidepool create --job "$id" --step 12 ...
//   tidepool jobs heartbeat "$id"          # renew the lease (the trainer does this)
//   tidepool jobs end-step "$id" 12        # remove step 12's sandboxes
//   tidepool jobs end "$id"                # end it, removing all of its sandboxes
//
// create, heartbeat and end print the job id (--json: the daemon's Job); end-step prints
// how many sandboxes it removed; get prints the Job as JSON; ls prints a table.
#include <boost/json/serialize.hpp>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "cli/commands.h"
#include "cli/lifecycle.h"
#include "cli/parse.h"

namespace tp::cli {
namespace {

namespace json = boost::json;

std::string job_path(const std::string& id, const std::string& suffix = "") {
  return "/v1/jobs/" + path_segment(id) + suffix;
}

struct JobFlags {
  std::string name, lease, grace, quota_memory, quota_cpus;
  std::optional<int64_t> quota_sandboxes;
  std::vector<std::string> labels;

  void add_to(CLI::App* app) {
    app->add_option("--name", name, "a name for people (not unique)")->type_name("NAME");
    app->add_option("--lease", lease,
                    "lease renewed by heartbeats, e.g. 60s, 5m (default 60s); when it lapses the "
                    "job's sandboxes are paused")
        ->type_name("DURATION");
    app->add_option("--grace", grace,
                    "how long a lapsed job keeps its paused sandboxes before it ends "
                    "(default 10m)")
        ->type_name("DURATION");
    app->add_option("--quota-sandboxes", quota_sandboxes, "at most N live sandboxes (0: no limit)")
        ->type_name("N");
    app->add_option("--quota-memory", quota_memory,
                    "at most this much memory over its sandboxes, e.g. 16G (0: no limit)")
        ->type_name("SIZE");
    app->add_option("--quota-cpus", quota_cpus, "at most this many cores over its sandboxes")
        ->type_name("N");
    app->add_option("--label", labels, "label KEY=VALUE (repeatable)")
        ->type_name("K=V")
        ->allow_extra_args(false);
  }

  Result<json::object> to_request() const {
    json::object o;
    if (!name.empty()) o["name"] = name;
    auto whole_seconds = [](const std::string& flag, const std::string& text,
                            bool zero_ok) -> Result<int64_t> {
      auto s = parse_duration_seconds(text);
      if (!s) return fail(Code::kInvalidArgument, flag + ": " + s.error().message());
      if (*s <= 0 && !zero_ok) return fail(Code::kInvalidArgument, flag + ": must be positive");
      return static_cast<int64_t>(std::ceil(*s - 1e-9));
    };
    if (!lease.empty()) {
      auto s = whole_seconds("--lease", lease, false);
      if (!s) return std::unexpected(s.error());
      o["lease_seconds"] = *s;
    }
    if (!grace.empty()) {
      auto s = whole_seconds("--grace", grace, true);
      if (!s) return std::unexpected(s.error());
      o["grace_seconds"] = *s;
    }
    json::object quota;
    if (quota_sandboxes) {
      if (*quota_sandboxes < 0)
        return fail(Code::kInvalidArgument, "--quota-sandboxes: must not be negative");
      quota["sandboxes"] = *quota_sandboxes;
    }
    if (!quota_memory.empty()) {
      auto mb = parse_size_mb(quota_memory);
      if (!mb) return fail(Code::kInvalidArgument, "--quota-memory: " + mb.error().message());
      quota["memory_mb"] = *mb;
    }
    if (!quota_cpus.empty()) {
      double v = 0;
      const char* end = quota_cpus.data() + quota_cpus.size();
      auto [ptr, ec] = std::from_chars(quota_cpus.data(), end, v);
      if (ec != std::errc() || ptr != end || !std::isfinite(v) || v < 0)
        return fail(Code::kInvalidArgument,
                    "--quota-cpus: expected a number >= 0, got '" + quota_cpus + "'");
      quota["cpus"] = v;
    }
    if (!quota.empty()) o["quota"] = std::move(quota);
    if (!labels.empty()) {
      json::object l;
      for (const auto& item : labels) {
        auto kv = parse_key_value(item);
        if (!kv) return fail(Code::kInvalidArgument, "--label: " + kv.error().message());
        l[kv->first] = kv->second;
      }
      o["labels"] = std::move(l);
    }
    return o;
  }
};

// Prints a Job answer: its JSON, or its id.
int print_job(const json::value& v, bool json_out) {
  if (json_out) {
    std::printf("%s\n", json::serialize(v).c_str());
    return kExitOk;
  }
  std::string id = v.is_object() ? str_of(v.get_object(), "id") : "";
  if (id.empty()) return report(Error{Code::kInternal, 0, "tidepoold answered without a job id"});
  std::printf("%s\n", id.c_str());
  return kExitOk;
}

}  // namespace

Action add_jobs(CLI::App& root, Context& ctx) {
  struct State {
    JobFlags spec;
    std::string id, step;
    bool json_out = false, all = false;
  };
  auto st = std::make_shared<State>();
  CLI::App* jobs = root.add_subcommand(
      "jobs", "Manage jobs (a training run's sandboxes under a lease and quotas): ls, create, ...");
  jobs->require_subcommand(1);
  CLI::App* ls = jobs->add_subcommand("ls", "List live jobs (all with --all) and what they hold");
  ls->add_flag("-a,--all", st->all, "include ended jobs");
  CLI::App* create = jobs->add_subcommand("create", "Create a job and print its id");
  st->spec.add_to(create);
  CLI::App* get = jobs->add_subcommand("get", "Show one job (and what it holds) as JSON");
  CLI::App* heartbeat = jobs->add_subcommand("heartbeat", "Renew a job's lease");
  CLI::App* end = jobs->add_subcommand("end", "End a job, removing all of its sandboxes");
  CLI::App* end_step =
      jobs->add_subcommand("end-step", "Remove the sandboxes of one step of a job");
  for (CLI::App* sub : {get, heartbeat, end, end_step})
    sub->add_option("job", st->id, "job id")->required()->type_name("JOB");
  end_step->add_option("step", st->step, "step tag (as given to create --step)")
      ->required()
      ->type_name("STEP");
  for (CLI::App* sub : {ls, create, heartbeat, end, end_step})
    sub->add_flag("--json", st->json_out, "print the daemon's JSON answer");

  return [st, &ctx, ls, create, get, heartbeat, end]() -> int {
    std::optional<json::value> body;
    if (create->parsed()) {
      auto req = st->spec.to_request();
      if (!req) return usage_error(req.error().message());
      body = json::value(std::move(*req));
    }
    auto client = ctx.client();
    if (!client) return report(client.error());
    HttpClient& c = **client;
    if (ls->parsed())
      return show_list(c, st->all ? "/v1/jobs?all=true" : "/v1/jobs", "jobs", st->json_out,
                       [](const json::array& a) { return job_rows(a, std::time(nullptr)); });
    if (create->parsed()) {
      auto r = c.call_json(Method::kPost, "/v1/jobs", &*body);
      if (!r) return report(r.error());
      return print_job(*r, st->json_out);
    }
    if (get->parsed()) {
      auto r = c.call_json(Method::kGet, job_path(st->id));
      if (!r) return report(r.error());
      return print_job(*r, true);
    }
    if (heartbeat->parsed() || end->parsed()) {
      auto r = heartbeat->parsed() ? c.call_json(Method::kPost, job_path(st->id, "/heartbeat"))
                                   : c.call_json(Method::kDelete, job_path(st->id));
      if (!r) return report(r.error());
      return print_job(*r, st->json_out);
    }
    auto r = c.call_json(Method::kDelete, job_path(st->id, "/steps/" + path_segment(st->step)));
    if (!r) return report(r.error());
    if (st->json_out) {
      std::printf("%s\n", json::serialize(*r).c_str());
      return kExitOk;
    }
    auto n = r->is_object() ? json_number(r->get_object(), "reclaimed") : std::nullopt;
    std::printf("%s\n", n ? format_number(*n).c_str() : "0");
    return kExitOk;
  };
}

}  // namespace tp::cli
