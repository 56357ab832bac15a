#include "api/function_routes.h"

#include <boost/json.hpp>
#include <cmath>

#include "common/json_util.h"

namespace tp::api {

namespace json = boost::json;
using function::RunRequest;
using function::RunResult;
using function::StepResult;

namespace {

constexpr const char* kRunKeys[] = {
    "language", "source",         "stdin",   "stdin_b64",       "files",     "args",
    "env",      "fetch_files",    "timeout", "compile_timeout", "memory_mb", "max_output_bytes",
    "pids",     "max_files_bytes"};

Result<void> check_keys(const json::object& o, std::initializer_list<std::string_view> extra) {
  for (const auto& kv : o) {
    bool ok = false;
    for (const char* k : kRunKeys) ok = ok || kv.key() == k;
    for (auto k : extra) ok = ok || kv.key() == k;
    if (!ok) return fail(Code::kInvalidArgument, "unknown field '" + std::string(kv.key()) + "'");
  }
  return {};
}

Result<uint64_t> seconds_ms(const json::object& o, const char* key) {
  auto it = o.find(key);
  if (it == o.end() || it->value().is_null()) return 0;
  if (!it->value().is_number())
    return fail(Code::kInvalidArgument,
                std::string("field '") + key + "' must be a number of seconds");
  double t = it->value().to_number<double>();
  if (!(t > 0) || t > 86400)
    return fail(Code::kInvalidArgument,
                std::string("field '") + key + "' must be between 0 and 86400 seconds");
  return std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(t * 1000)));
}

// "stdin" (text) or "stdin_b64" (bytes); at most one.
Result<std::optional<std::string>> stdin_of(const json::object& o) {
  bool text = o.contains("stdin") && !o.at("stdin").is_null();
  bool b64 = o.contains("stdin_b64") && !o.at("stdin_b64").is_null();
  if (text && b64) return fail(Code::kInvalidArgument, "give 'stdin' or 'stdin_b64', not both");
  if (text) {
    auto s = json_util::get_string(o, "stdin", "");
    if (!s) return std::unexpected(s.error());
    return std::optional<std::string>(*s);
  }
  if (b64) {
    auto s = json_util::get_string(o, "stdin_b64", "");
    if (!s) return std::unexpected(s.error());
    auto d = json_util::base64_decode(*s);
    if (!d) return fail(Code::kInvalidArgument, "field 'stdin_b64' must be base64");
    return std::optional<std::string>(*d);
  }
  return std::optional<std::string>();
}

// {"path": "<base64>"}; a null value is skipped (as SandboxFusion does).
Result<std::vector<function::File>> files_of(const json::object& o, const char* key) {
  std::vector<function::File> out;
  auto it = o.find(key);
  if (it == o.end() || it->value().is_null()) return out;
  if (!it->value().is_object())
    return fail(Code::kInvalidArgument,
                std::string("field '") + key + "' must map paths to base64");
  for (const auto& kv : it->value().as_object()) {
    if (kv.value().is_null()) continue;
    if (!kv.value().is_string())
      return fail(Code::kInvalidArgument,
                  "file '" + std::string(kv.key()) + "' must be base64 text");
    auto d = json_util::base64_decode(kv.value().as_string());
    if (!d)
      return fail(Code::kInvalidArgument, "file '" + std::string(kv.key()) + "' is not base64");
    out.push_back(function::File{std::string(kv.key()), std::move(*d), 0644});
  }
  return out;
}

json::value opt_int(const std::optional<int64_t>& v) {
  return v ? json::value(*v) : json::value(nullptr);
}

double ms(uint64_t us) { return std::round(static_cast<double>(us) / 10.0) / 100.0; }

void put_output(json::object& o, const char* key, const std::string& data) {
  if (json_util::valid_utf8(data)) {
    o[key] = data;
  } else {
    o[key] = json_util::to_valid_utf8(data);
    o[std::string(key) + "_b64"] = json_util::base64_encode(data);
  }
}

json::object step_json(const StepResult& s) {
  json::object o;
  o["verdict"] = function::verdict_name(s.verdict);
  o["exit_code"] = opt_int(s.exit_code);
  o["signal"] = s.signal;
  put_output(o, "stdout", s.stdout_data);
  put_output(o, "stderr", s.stderr_data);
  o["stdout_truncated"] = s.stdout_truncated;
  o["stderr_truncated"] = s.stderr_truncated;
  o["wall_ms"] = ms(s.wall_us);
  o["cpu_ms"] = ms(s.cpu_us);
  o["memory_peak_bytes"] = s.peak_memory_bytes;
  if (!s.error.empty()) o["error"] = s.error;
  return o;
}

std::string client_of(const Request& req) { return function_client(req.caller); }

void answer_error(const std::shared_ptr<Responder>& res, const Error& e) { res->send_error(e); }

Result<json::object> body_object(const Request& req) {
  json_util::ParseLimits limits;
  limits.max_budget_bytes = std::max<size_t>(limits.max_budget_bytes, req.body.size() * 4);
  return json_util::parse_object(req.body, limits);
}

}  // namespace

std::string function_client(const Caller& c) {
  if (!c.key_id.empty()) return "key:" + c.key_id;
  if (!c.peer.empty()) return c.peer;
  return "anonymous";
}

Result<RunRequest> parse_run_request(const json::object& o) {
  TP_TRY(check_keys(o, {}));
  RunRequest r;
  auto lang = json_util::get_string(o, "language", "");
  if (!lang) return std::unexpected(lang.error());
  if (lang->empty()) return fail(Code::kInvalidArgument, "field 'language' is required");
  if (!o.contains("source") || !o.at("source").is_string())
    return fail(Code::kInvalidArgument, "field 'source' is required (the program's text)");
  r.language = *lang;
  r.source = std::string(o.at("source").as_string());
  auto in = stdin_of(o);
  if (!in) return std::unexpected(in.error());
  if (*in) r.stdin_data = std::move(**in);
  auto files = files_of(o, "files");
  if (!files) return std::unexpected(files.error());
  r.files = std::move(*files);
  auto args = json_util::get_string_list(o, "args");
  if (!args) return std::unexpected(args.error());
  r.args = std::move(*args);
  auto env = json_util::get_string_map(o, "env");
  if (!env) return std::unexpected(env.error());
  r.env = std::move(*env);
  auto fetch = json_util::get_string_list(o, "fetch_files");
  if (!fetch) return std::unexpected(fetch.error());
  r.fetch = std::move(*fetch);
  auto t = seconds_ms(o, "timeout");
  if (!t) return std::unexpected(t.error());
  r.limits.timeout_ms = *t;
  auto ct = seconds_ms(o, "compile_timeout");
  if (!ct) return std::unexpected(ct.error());
  r.compile_timeout_ms = *ct;
  auto mem = json_util::get_int(o, "memory_mb", 0, 0, 1 << 20);
  if (!mem) return std::unexpected(mem.error());
  r.limits.memory_bytes = static_cast<uint64_t>(*mem) << 20;
  auto out = json_util::get_int(o, "max_output_bytes", 0, 0, 1ll << 40);
  if (!out) return std::unexpected(out.error());
  r.limits.output_bytes = static_cast<uint64_t>(*out);
  auto fb = json_util::get_int(o, "max_files_bytes", 0, 0, 1ll << 40);
  if (!fb) return std::unexpected(fb.error());
  r.limits.files_bytes = static_cast<uint64_t>(*fb);
  auto pids = json_util::get_int(o, "pids", 0, 0, 1 << 22);
  if (!pids) return std::unexpected(pids.error());
  r.limits.pids = static_cast<uint32_t>(*pids);
  return r;
}

json::object run_result_json(const RunResult& r) {
  json::object o;
  o["verdict"] = function::verdict_name(r.verdict);
  if (r.run) {
    json::object s = step_json(*r.run);
    s.erase("verdict");
    for (auto& kv : s) o[kv.key()] = kv.value();
    json::object files;
    for (const auto& f : r.run->files) files[f.path] = json_util::base64_encode(f.data);
    o["files"] = std::move(files);
    json::array missing;
    for (const auto& m : r.run->missing) missing.emplace_back(m);
    o["missing_files"] = std::move(missing);
  } else {
    o["exit_code"] = nullptr;
    o["signal"] = 0;
    o["stdout"] = "";
    o["stderr"] = "";
    o["stdout_truncated"] = false;
    o["stderr_truncated"] = false;
    o["wall_ms"] = 0;
    o["cpu_ms"] = 0;
    o["memory_peak_bytes"] = 0;
    o["files"] = json::object();
    o["missing_files"] = json::array();
  }
  o["compile"] = r.compile ? json::value(step_json(*r.compile)) : json::value(nullptr);
  o["compile_cached"] = r.compile_cached;
  o["queue_ms"] = ms(r.queue_us);
  o["server_ms"] = ms(r.server_us);
  return o;
}

std::vector<RouteInfo> FunctionRoutes::routes() {
  return {{"POST", "/v1/functions/run"},
          {"POST", "/v1/functions/batch"},
          {"GET", "/v1/functions/languages"},
          {"GET", "/v1/functions"}};
}

bool FunctionRoutes::takes_large_body(const std::string& method, const std::string& path) {
  return method == "POST" && (path == "/v1/functions/run" || path == "/v1/functions/batch");
}

bool FunctionRoutes::handle(Request& req, std::shared_ptr<Responder> res) {
  const std::string& p = req.path;
  if (!p.starts_with("/v1/functions")) return false;
  auto svc = svc_;
  if (p == "/v1/functions/run" && req.method == "POST") {
    auto body = body_object(req);
    if (!body) return answer_error(res, body.error()), true;
    auto run = parse_run_request(*body);
    if (!run) return answer_error(res, run.error()), true;
    auto job = svc->run(client_of(req), std::move(*run), [res](Result<RunResult> r) {
      if (!r) return res->send_error(r.error());
      res->send_json(200, run_result_json(*r));
    });
    if (!job) return answer_error(res, job.error()), true;
    res->set_on_abort([svc, j = *job] { svc->cancel(j); });
    return true;
  }
  if (p == "/v1/functions/batch" && req.method == "POST") {
    auto body = body_object(req);
    if (!body) return answer_error(res, body.error()), true;
    std::vector<RunRequest> runs;
    const json::object& o = *body;
    if (o.contains("runs")) {
      if (o.size() != 1 || !o.at("runs").is_array())
        return answer_error(res,
                            Error{Code::kInvalidArgument, 0,
                                  "a batch is {\"runs\": [...]} or one program with \"cases\""}),
               true;
      size_t i = 0;
      for (const auto& v : o.at("runs").as_array()) {
        if (!v.is_object())
          return answer_error(res, Error{Code::kInvalidArgument, 0,
                                         "run " + std::to_string(i) + " must be an object"}),
                 true;
        auto r = parse_run_request(v.as_object());
        if (!r)
          return answer_error(res, Error{r.error().code, 0,
                                         "run " + std::to_string(i) + ": " + r.error().message()}),
                 true;
        runs.push_back(std::move(*r));
        ++i;
      }
    } else {
      json::object base = o;
      base.erase("cases");
      auto proto = parse_run_request(base);
      if (!proto) return answer_error(res, proto.error()), true;
      auto it = o.find("cases");
      if (it == o.end() || !it->value().is_array())
        return answer_error(res, Error{Code::kInvalidArgument, 0,
                                       "field 'cases' (a list of {stdin, args, files, env}) or "
                                       "'runs' is required"}),
               true;
      size_t i = 0;
      for (const auto& v : it->value().as_array()) {
        auto bad = [&](const std::string& why) {
          answer_error(res,
                       Error{Code::kInvalidArgument, 0, "case " + std::to_string(i) + ": " + why});
          return true;
        };
        if (!v.is_object()) return bad("must be an object");
        const json::object& c = v.as_object();
        if (auto r = json_util::only_keys(c, {"stdin", "stdin_b64", "args", "files", "env"}); !r)
          return bad(r.error().message());
        RunRequest run = *proto;
        auto in = stdin_of(c);
        if (!in) return bad(in.error().message());
        if (*in) run.stdin_data = std::move(**in);
        if (c.contains("args")) {
          auto a = json_util::get_string_list(c, "args");
          if (!a) return bad(a.error().message());
          run.args = std::move(*a);
        }
        auto f = files_of(c, "files");
        if (!f) return bad(f.error().message());
        for (auto& file : *f) run.files.push_back(std::move(file));
        auto env = json_util::get_string_map(c, "env");
        if (!env) return bad(env.error().message());
        for (auto& [k, v2] : *env) run.env[k] = v2;
        runs.push_back(std::move(run));
        ++i;
      }
    }
    auto job = svc->run_batch(client_of(req), std::move(runs),
                              [res](std::vector<Result<RunResult>> results) {
                                json::array arr;
                                for (const auto& r : results) {
                                  if (r) {
                                    arr.emplace_back(run_result_json(*r));
                                  } else {
                                    json::object e;
                                    e["code"] = code_name(r.error().code);
                                    e["message"] = r.error().message();
                                    json::object w;
                                    w["error"] = std::move(e);
                                    arr.emplace_back(std::move(w));
                                  }
                                }
                                json::object out;
                                out["results"] = std::move(arr);
                                res->send_json(200, out);
                              });
    if (!job) return answer_error(res, job.error()), true;
    res->set_on_abort([svc, j = *job] { svc->cancel(j); });
    return true;
  }
  if (p == "/v1/functions/languages" && req.method == "GET") {
    json::array arr;
    for (const auto& d : svc->languages().all()) {
      json::object l;
      l["name"] = d.name;
      json::array aliases, sf, ext, run, compile;
      for (const auto& a : d.aliases) aliases.emplace_back(a);
      for (const auto& a : d.sandbox_fusion) sf.emplace_back(a);
      for (const auto& a : d.extensions) ext.emplace_back(a);
      for (const auto& a : d.run) run.emplace_back(a);
      for (const auto& a : d.compile) compile.emplace_back(a);
      l["aliases"] = std::move(aliases);
      l["sandbox_fusion"] = std::move(sf);
      l["extensions"] = std::move(ext);
      l["image"] = d.image;
      l["file"] = d.file;
      l["run"] = std::move(run);
      l["compile"] = std::move(compile);
      l["mode"] = d.mode == function::RunMode::kPython ? "python" : "exec";
      l["prestarted"] = d.prestarted();
      l["source"] = d.source;
      arr.emplace_back(std::move(l));
    }
    json::object out;
    out["languages"] = std::move(arr);
    res->send_json(200, out);
    return true;
  }
  if (p == "/v1/functions" && req.method == "GET") {
    auto s = svc->status();
    json::array pools;
    for (const auto& ps : s.pools) {
      json::object po;
      po["image"] = ps.image;
      json::array ws;
      for (const auto& w : ps.workers) {
        json::object wo;
        wo["id"] = w.id;
        wo["in_flight"] = w.in_flight;
        ws.emplace_back(std::move(wo));
      }
      po["workers"] = std::move(ws);
      po["starting"] = ps.starting;
      po["queued"] = ps.queued;
      po["in_flight"] = ps.in_flight;
      po["last_error"] = ps.last_error.empty() ? json::value(nullptr) : json::value(ps.last_error);
      pools.emplace_back(std::move(po));
    }
    json::object out;
    out["pools"] = std::move(pools);
    out["queued"] = s.queued;
    out["in_flight"] = s.in_flight;
    out["runs_total"] = s.runs_total;
    out["runs_per_second"] = s.runs_per_second;
    json::object verdicts;
    for (const auto& [k, v] : s.verdicts) verdicts[k] = v;
    out["verdicts"] = std::move(verdicts);
    json::object cache;
    cache["hits"] = s.cache.hits;
    cache["misses"] = s.cache.misses;
    cache["entries"] = s.cache.entries;
    cache["bytes"] = s.cache.bytes;
    out["compile_cache"] = std::move(cache);
    const auto& opts = svc->options();
    json::object cfg;
    cfg["workers_per_image"] = opts.workers;
    cfg["slots_per_worker"] = opts.slots;
    cfg["per_client_in_flight"] = opts.queue.per_client_in_flight;
    cfg["default_timeout"] = static_cast<double>(opts.defaults.timeout_ms) / 1000.0;
    cfg["max_timeout"] = static_cast<double>(opts.max.timeout_ms) / 1000.0;
    cfg["default_memory_mb"] = opts.defaults.memory_bytes >> 20;
    cfg["max_memory_mb"] = opts.max.memory_bytes >> 20;
    json::object warm;
    for (const auto& [k, v] : svc->warm_per_worker()) warm[k] = v;
    cfg["warm_per_worker"] = std::move(warm);
    out["config"] = std::move(cfg);
    res->send_json(200, out);
    return true;
  }
  if (p == "/v1/functions" || p == "/v1/functions/run" || p == "/v1/functions/batch" ||
      p == "/v1/functions/languages") {
    res->send_error(
        Error{Code::kInvalidArgument, 0, "method " + req.method + " not allowed on " + p});
    return true;
  }
  return false;
}

}  // namespace tp::api
