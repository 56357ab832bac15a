#include "api/sandbox_fusion.h"

#include <boost/json.hpp>
#include <cmath>

#include "api/function_routes.h"
#include "common/json_util.h"
#include "function/language.h"

namespace tp::api {

namespace json = boost::json;
using function::RunRequest;
using function::RunResult;
using function::StepResult;

namespace {

// FastAPI's answer to a request its model refuses (422 Unprocessable Entity).
void unprocessable(const std::shared_ptr<Responder>& res, const std::string& type,
                   const std::string& field, const std::string& msg, const json::value& input) {
  json::object d;
  d["type"] = type;
  json::array loc{"body"};
  if (!field.empty()) loc.emplace_back(field);
  d["loc"] = std::move(loc);
  d["msg"] = msg;
  d["input"] = input;
  json::object out;
  out["detail"] = json::array{std::move(d)};
  res->send(422, "application/json", json_util::serialize_utf8(out) + "\n");
}

json::object command_result(const StepResult& s) {
  json::object o;
  o["execution_time"] = static_cast<double>(s.wall_us) / 1e6;
  o["stdout"] = json_util::to_valid_utf8(s.stdout_data);
  std::string err = s.stderr_data;
  if (s.timed_out) {
    o["status"] = "TimeLimitExceeded";
    o["return_code"] = nullptr;
  } else {
    o["status"] = "Finished";
    int64_t rc;
    if (!s.error.empty()) {
      // The program could not be started (as a shell would say: 127).
      rc = 127;
      err += (err.empty() || err.back() == '\n' ? "" : "\n") + s.error + "\n";
    } else if (s.signal != 0 || !s.exit_code) {
      rc = -static_cast<int64_t>(s.signal ? s.signal : 9);
    } else {
      rc = *s.exit_code;
    }
    o["return_code"] = rc;
  }
  o["stderr"] = json_util::to_valid_utf8(err);
  return o;
}

bool step_failed(const json::object& r) {
  if (r.at("status").as_string() != "Finished") return true;
  const auto& rc = r.at("return_code");
  return !rc.is_int64() || rc.as_int64() != 0;
}

// pydantic's float field: a number, or a string holding one.
std::optional<double> as_float(const json::value& v) {
  if (v.is_number()) return v.to_number<double>();
  if (v.is_string()) {
    try {
      size_t used = 0;
      std::string s(v.as_string());
      double d = std::stod(s, &used);
      if (used == s.size()) return d;
    } catch (...) {
    }
  }
  return std::nullopt;
}

}  // namespace

json::object sandbox_fusion_response(const Result<RunResult>& r,
                                     const std::vector<std::string>& fetch) {
  json::object o;
  o["status"] = "Success";
  o["message"] = "";
  o["compile_result"] = nullptr;
  o["run_result"] = nullptr;
  o["executor_pod_name"] = nullptr;
  o["files"] = json::object();
  if (!r) {
    o["status"] = "SandboxError";
    o["message"] = r.error().message();
    return o;
  }
  bool failed = false;
  if (r->compile) {
    json::object c = command_result(*r->compile);
    failed = failed || step_failed(c);
    o["compile_result"] = std::move(c);
  }
  if (r->run) {
    json::object run = command_result(*r->run);
    failed = failed || step_failed(run);
    o["run_result"] = std::move(run);
    json::object files;
    for (const auto& name : fetch)
      for (const auto& f : r->run->files)
        if (f.path == name) files[name] = json_util::base64_encode(f.data);
    o["files"] = std::move(files);
  }
  if (failed) o["status"] = "Failed";
  return o;
}

bool SandboxFusionRoutes::handle(Request& req, std::shared_ptr<Responder> res) {
  if (req.path != "/run_code") return false;
  if (req.method != "POST") {
    res->send(405, "application/json", "{\"detail\":\"Method Not Allowed\"}\n");
    return true;
  }
  json_util::ParseLimits limits;
  limits.max_budget_bytes = std::max<size_t>(limits.max_budget_bytes, req.body.size() * 4);
  auto parsed = json_util::parse_bounded(req.body, limits);
  if (!parsed) {
    if (parsed.error().code == Code::kPayloadTooLarge) return res->send_error(parsed.error()), true;
    return unprocessable(res, "json_invalid", "", "JSON decode error", json::object()), true;
  }
  if (!parsed->is_object())
    return unprocessable(res, "model_attributes_type", "",
                         "Input should be a valid dictionary or object to extract fields from",
                         *parsed),
           true;
  const json::object& o = parsed->as_object();
  RunRequest run;
  auto get = [&](const char* k) -> const json::value* {
    auto it = o.find(k);
    return it == o.end() ? nullptr : &it->value();
  };
  // code, language: required strings.
  const json::value* code = get("code");
  if (!code) return unprocessable(res, "missing", "code", "Field required", o), true;
  if (!code->is_string())
    return unprocessable(res, "string_type", "code", "Input should be a valid string", *code), true;
  const json::value* lang = get("language");
  if (!lang) return unprocessable(res, "missing", "language", "Field required", o), true;
  const auto& known = function::sandbox_fusion_languages();
  std::string lang_name = lang->is_string() ? std::string(lang->as_string()) : "";
  if (!lang->is_string() || std::find(known.begin(), known.end(), lang_name) == known.end()) {
    std::string expected;
    for (size_t i = 0; i < known.size(); ++i)
      expected += (i ? (i + 1 == known.size() ? " or " : ", ") : "") + ("'" + known[i] + "'");
    return unprocessable(res, "literal_error", "language", "Input should be " + expected, *lang),
           true;
  }
  run.source = std::string(code->as_string());
  // Timeouts (seconds, floats), memory (MB, int; -1 = the node's default).
  for (auto [key, dest] :
       {std::pair<const char*, uint64_t*>{"compile_timeout", &run.compile_timeout_ms},
        std::pair<const char*, uint64_t*>{"run_timeout", &run.limits.timeout_ms}}) {
    double secs = 10;
    if (const json::value* v = get(key); v && !v->is_null()) {
      auto f = as_float(*v);
      if (!f)
        return unprocessable(res, "float_parsing", key, "Input should be a valid number", *v), true;
      secs = *f;
    }
    const auto& opts = svc_->options();
    uint64_t cap =
        std::string_view(key) == "run_timeout" ? opts.max.timeout_ms : opts.max_compile_timeout_ms;
    // SandboxFusion takes any value; a non-positive one kills at once, a huge one is capped here.
    *dest = std::clamp<uint64_t>(secs > 0 ? static_cast<uint64_t>(std::llround(secs * 1000)) : 1, 1,
                                 cap);
  }
  if (const json::value* v = get("memory_limit_MB"); v && !v->is_null()) {
    if (!v->is_int64() && !v->is_uint64())
      return unprocessable(res, "int_type", "memory_limit_MB", "Input should be a valid integer",
                           *v),
             true;
    int64_t mb = v->is_int64() ? v->as_int64() : static_cast<int64_t>(v->as_uint64());
    if (mb > 0) {
      uint64_t bytes = static_cast<uint64_t>(mb) << 20;
      const auto& opts = svc_->options();
      run.limits.memory_bytes = std::clamp<uint64_t>(bytes, 16ull << 20, opts.max.memory_bytes);
    }
  }
  if (const json::value* v = get("stdin"); v && !v->is_null()) {
    if (!v->is_string())
      return unprocessable(res, "string_type", "stdin", "Input should be a valid string", *v), true;
    run.stdin_data = std::string(v->as_string());
  }
  if (const json::value* v = get("files"); v && !v->is_null()) {
    if (!v->is_object())
      return unprocessable(res, "dict_type", "files", "Input should be a valid dictionary", *v),
             true;
    for (const auto& kv : v->as_object()) {
      if (kv.value().is_null()) continue;
      if (!kv.value().is_string())
        return unprocessable(res, "string_type", "files", "Input should be a valid string",
                             kv.value()),
               true;
      if (std::string(kv.key()).find("IGNORE_THIS_FILE") != std::string::npos) continue;
      auto data = json_util::base64_decode(kv.value().as_string());
      if (!data) {
        res->send_json(
            200, sandbox_fusion_response(fail(Code::kInvalidArgument,
                                              "file '" + std::string(kv.key()) + "' is not base64"),
                                         {}));
        return true;
      }
      run.files.push_back(function::File{std::string(kv.key()), std::move(*data), 0644});
    }
  }
  if (const json::value* v = get("fetch_files"); v && !v->is_null()) {
    if (!v->is_array())
      return unprocessable(res, "list_type", "fetch_files", "Input should be a valid list", *v),
             true;
    for (const auto& f : v->as_array()) {
      if (!f.is_string())
        return unprocessable(res, "string_type", "fetch_files", "Input should be a valid string",
                             f),
               true;
      run.fetch.emplace_back(f.as_string());
    }
  }
  const function::LanguageDef* def = svc_->languages().find_sandbox_fusion(lang_name);
  if (!def) {
    std::string served;
    for (const auto& d : svc_->languages().all())
      for (const auto& n : d.sandbox_fusion) served += (served.empty() ? "" : ", ") + n;
    res->send_json(200, sandbox_fusion_response(fail(Code::kInvalidArgument,
                                                     "language '" + lang_name +
                                                         "' is not served by this Tidepool node "
                                                         "(served: " +
                                                         served + ")"),
                                                {}));
    return true;
  }
  run.language = def->name;
  auto fetch = run.fetch;
  auto svc = svc_;
  auto job =
      svc->run(function_client(req.caller), std::move(run), [res, fetch](Result<RunResult> r) {
        res->send_json(200, sandbox_fusion_response(r, fetch));
      });
  if (!job) {
    res->send_json(200, sandbox_fusion_response(std::unexpected(job.error()), {}));
    return true;
  }
  res->set_on_abort([svc, j = *job] { svc->cancel(j); });
  return true;
}

}  // namespace tp::api
