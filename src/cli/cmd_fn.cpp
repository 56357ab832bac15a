// tidepool fn run|languages: the function tier (docs/function-tier.md).
//
//   tidepool fn run [--lang L] [--timeout T] [--memory M] [--file PATH]... [--json] FILE [ARGS...]
//
// runs FILE's program once in the function tier with this process's stdin (when it is
// not a terminal) as its input, copies its stdout and stderr here and exits with its
// exit status. The language comes from --lang or FILE's extension (the daemon's
// definitions say which extensions are whose). A run that did not end normally says
// so on stderr in one line and exits 124 (time limit), 137 (memory limit), 141 (output
// limit), 1 (compile error, with the compiler's messages) or 128+N (killed by signal N).
// --json prints the daemon's answer instead.
#include <fcntl.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "cli/parse.h"

namespace tp::cli {
namespace {

namespace json = boost::json;

// A program's output as it ran (stdout_b64 when it was not UTF-8).
std::string output_of(const json::object& o, const char* key) {
  std::string b64 = str_of(o, std::string(key) + "_b64");
  if (!b64.empty()) {
    auto d = base64_decode(b64);
    if (d) return *d;
  }
  return str_of(o, key);
}

// The language whose definition lists FILE's extension.
Result<std::string> language_for(HttpClient& c, const std::string& file) {
  std::string ext = std::filesystem::path(file).extension().string();
  if (ext.empty())
    return fail(Code::kInvalidArgument, "cannot tell the language of '" + file + "' (use --lang)");
  auto langs = c.call_json(Method::kGet, "/v1/functions/languages");
  if (!langs) return std::unexpected(langs.error());
  if (langs->is_object())
    if (const auto* arr = langs->as_object().if_contains("languages"); arr && arr->is_array())
      for (const auto& l : arr->as_array()) {
        if (!l.is_object()) continue;
        const auto* exts = l.as_object().if_contains("extensions");
        if (!exts || !exts->is_array()) continue;
        for (const auto& e : exts->as_array())
          if (e.is_string() && e.as_string() == ext) return str_of(l.as_object(), "name");
      }
  return fail(Code::kInvalidArgument, "no language of this daemon runs '" + ext +
                                          "' files (use --lang; see `tidepool fn languages`)");
}

Action add_run_sub(CLI::App* fn, Context& ctx) {
  struct State {
    std::string lang, timeout, memory, compile_timeout;
    std::vector<std::string> files;
    bool json_out = false;
    std::vector<std::string> program;  // FILE ARGS...
  };
  auto st = std::make_shared<State>();
  CLI::App* sub = fn->add_subcommand(
      "run", "Run a program once in the function tier, with this process's stdin as its input");
  sub->add_option("--lang", st->lang, "language (default: from FILE's extension)")
      ->type_name("LANG");
  sub->add_option("--timeout", st->timeout, "time limit (e.g. 2, 500ms, 1m; default: the daemon's)")
      ->type_name("DURATION");
  sub->add_option("--compile-timeout", st->compile_timeout,
                  "compile time limit (compiled languages)")
      ->type_name("DURATION");
  sub->add_option("--memory", st->memory, "memory limit (e.g. 256M, 1G; default: the daemon's)")
      ->type_name("SIZE");
  sub->add_option("--file", st->files,
                  "an extra file for the program's directory: PATH (its name) or NAME=PATH "
                  "(repeatable)")
      ->type_name("[NAME=]PATH");
  sub->add_flag("--json", st->json_out, "print the daemon's JSON answer");
  sub->add_option("program", st->program, "FILE and its arguments")
      ->required()
      ->type_name("FILE ARGS");
  sub->positionals_at_end(true);

  return [st, &ctx]() -> int {
    const std::string& file = st->program.front();
    auto source = read_file(file);
    if (!source) return report(source.error());
    json::object req;
    req["source"] = *source;
    json::array args;
    for (size_t i = 1; i < st->program.size(); ++i) args.emplace_back(st->program[i]);
    req["args"] = std::move(args);
    if (!st->timeout.empty()) {
      auto t = parse_duration_seconds(st->timeout);
      if (!t || *t <= 0)
        return usage_error("--timeout: " + (t ? std::string("must be > 0") : t.error().message()));
      req["timeout"] = *t;
    }
    if (!st->compile_timeout.empty()) {
      auto t = parse_duration_seconds(st->compile_timeout);
      if (!t || *t <= 0)
        return usage_error("--compile-timeout: " +
                           (t ? std::string("must be > 0") : t.error().message()));
      req["compile_timeout"] = *t;
    }
    if (!st->memory.empty()) {
      auto m = parse_size_mb(st->memory);
      if (!m) return usage_error("--memory: " + m.error().message());
      req["memory_mb"] = *m;
    }
    json::object files;
    for (const auto& f : st->files) {
      std::string name = std::filesystem::path(f).filename().string(), path = f;
      if (auto eq = f.find('='); eq != std::string::npos) {
        name = f.substr(0, eq);
        path = f.substr(eq + 1);
      }
      auto data = read_file(path);
      if (!data) return report(data.error());
      files[name] = base64_encode(*data);
    }
    if (!files.empty()) req["files"] = std::move(files);
    if (!::isatty(0)) {
      auto in = read_all(0, "stdin");
      if (!in) return report(in.error());
      req["stdin_b64"] = base64_encode(*in);
    }
    auto c = ctx.client();
    if (!c) return report(c.error());
    std::string lang = st->lang;
    if (lang.empty()) {
      auto l = language_for(**c, file);
      if (!l)
        return l.error().code == Code::kInvalidArgument ? usage_error(l.error().message())
                                                        : report(l.error());
      lang = *l;
    }
    req["language"] = lang;
    json::value body = req;
    auto ans = (*c)->call_json(Method::kPost, "/v1/functions/run", &body);
    if (!ans) return report(ans.error());
    if (st->json_out) {
      std::printf("%s\n", json::serialize(*ans).c_str());
      return kExitOk;
    }
    if (!ans->is_object())
      return report(Error{Code::kInternal, 0, "the daemon's answer is not an object"});
    const json::object& o = ans->as_object();
    std::string verdict = str_of(o, "verdict");
    if (verdict == "compile_error") {
      if (const auto* cmp = o.if_contains("compile"); cmp && cmp->is_object()) {
        write_all(1, output_of(cmp->as_object(), "stdout"));
        write_all(2, output_of(cmp->as_object(), "stderr"));
      }
      std::fprintf(stderr, "tidepool: compile error\n");
      return kExitError;
    }
    write_all(1, output_of(o, "stdout"));
    write_all(2, output_of(o, "stderr"));
    if (!str_of(o, "error").empty())
      std::fprintf(stderr, "tidepool: %s\n", str_of(o, "error").c_str());
    if (verdict == "time_limit") {
      std::fprintf(stderr, "tidepool: time limit exceeded\n");
      return kExitTimedOut;
    }
    if (verdict == "memory_limit") {
      std::fprintf(stderr, "tidepool: memory limit exceeded\n");
      return kExitSignalBase + 9;
    }
    if (verdict == "output_limit") {
      std::fprintf(stderr, "tidepool: output limit exceeded\n");
      return kExitSignalBase + 13;
    }
    const auto* ec = o.if_contains("exit_code");
    const auto* sig = o.if_contains("signal");
    int64_t code = ec && ec->is_int64() ? ec->as_int64() : -1;
    int64_t s = sig && sig->is_int64() ? sig->as_int64() : 0;
    return exit_status_for(code, s, false);
  };
}

Action add_languages_sub(CLI::App* fn, Context& ctx) {
  auto json_out = std::make_shared<bool>(false);
  CLI::App* sub = fn->add_subcommand("languages", "List the languages the function tier serves");
  sub->add_flag("--json", *json_out, "print the daemon's JSON answer");
  return [json_out, &ctx]() -> int {
    auto c = ctx.client();
    if (!c) return report(c.error());
    auto ans = (*c)->call_json(Method::kGet, "/v1/functions/languages");
    if (!ans) return report(ans.error());
    if (*json_out) {
      std::printf("%s\n", json::serialize(*ans).c_str());
      return kExitOk;
    }
    std::printf("%-10s %-22s %-16s %s\n", "LANGUAGE", "ALIASES", "EXTENSIONS", "RUN");
    if (ans->is_object())
      if (const auto* arr = ans->as_object().if_contains("languages"); arr && arr->is_array())
        for (const auto& l : arr->as_array()) {
          if (!l.is_object()) continue;
          const auto& o = l.as_object();
          auto join = [&](const char* k) {
            std::string s;
            if (const auto* a = o.if_contains(k); a && a->is_array())
              for (const auto& x : a->as_array())
                if (x.is_string()) s += (s.empty() ? "" : ",") + std::string(x.as_string());
            return s.empty() ? std::string("-") : s;
          };
          std::string run;
          if (const auto* a = o.if_contains("compile");
              a && a->is_array() && !a->as_array().empty())
            run = "compile+run";
          else
            run = str_of(o, "mode") == "python" ? "in a preloaded interpreter" : "exec";
          std::printf("%-10s %-22s %-16s %s\n", str_of(o, "name").c_str(), join("aliases").c_str(),
                      join("extensions").c_str(), run.c_str());
        }
    return kExitOk;
  };
}

}  // namespace

Action add_fn(CLI::App& root, Context& ctx) {
  CLI::App* fn =
      root.add_subcommand("fn", "The function tier: run programs without a sandbox of your own");
  fn->require_subcommand(1);
  Action run = add_run_sub(fn, ctx);
  Action langs = add_languages_sub(fn, ctx);
  return [fn, run, langs]() -> int {
    if (fn->get_subcommand("run")->parsed()) return run();
    return langs();
  };
}

}  // namespace tp::cli
