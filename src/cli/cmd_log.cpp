// tidepool log: a sandbox's history from its trajectory log (what ran, when, by which
// key, with what result), as a table, as the daemon's JSON (--json), or followed as it
// grows (--follow); --key prints the recorded answer of one keyed call.
#include <boost/json.hpp>
#include <cstdio>
#include <ctime>

#include "cli/commands.h"
#include "cli/parse.h"

namespace tp::cli {
namespace {

namespace json = boost::json;

const json::object* obj(const json::object& o, std::string_view key) {
  const auto* v = o.if_contains(key);
  return v != nullptr && v->is_object() ? &v->get_object() : nullptr;
}

std::string url_decode(std::string_view s) {
  auto hexv = [](char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
  };
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && hexv(s[i + 1]) >= 0 && hexv(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hexv(s[i + 1]) * 16 + hexv(s[i + 2])));
      i += 2;
      continue;
    }
    out.push_back(s[i] == '+' ? ' ' : s[i]);
  }
  return out;
}

// The value of one query parameter of a target ("/x?path=%2Fa&mode=644").
std::string query_value(std::string_view target, std::string_view name) {
  auto q = target.find('?');
  if (q == std::string_view::npos) return "";
  std::string_view rest = target.substr(q + 1);
  while (!rest.empty()) {
    auto amp = rest.find('&');
    std::string_view kv = rest.substr(0, amp);
    auto eq = kv.find('=');
    if (kv.substr(0, eq) == name)
      return eq == std::string_view::npos ? "" : url_decode(kv.substr(eq + 1));
    if (amp == std::string_view::npos) break;
    rest.remove_prefix(amp + 1);
  }
  return "";
}

std::string bytes(int64_t n) {
  char buf[32];
  if (n < 10 * 1024)
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(n));
  else if (n < 10ll << 20)
    std::snprintf(buf, sizeof buf, "%lld KiB", static_cast<long long>(n >> 10));
  else
    std::snprintf(buf, sizeof buf, "%lld MiB", static_cast<long long>(n >> 20));
  return buf;
}

std::string command_text(const json::value* cmd) {
  if (cmd == nullptr) return "?";
  if (cmd->is_string()) return std::string(cmd->get_string());
  std::string out;
  if (cmd->is_array())
    for (const auto& a : cmd->get_array()) {
      if (!out.empty()) out += ' ';
      std::string s = a.is_string() ? std::string(a.get_string()) : json::serialize(a);
      bool plain = !s.empty() && s.find_first_of(" \t\"'\\$`") == std::string::npos;
      out += plain ? s : "'" + s + "'";
    }
  return out;
}

std::string clip(std::string s, size_t n) {
  for (char& c : s)
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  return s.size() <= n ? s : s.substr(0, n - 3) + "...";
}

// What a call did, in a few words.
std::string what_of_call(const json::object& e) {
  std::string method = json_string(e, "method"), target = json_string(e, "target");
  std::string path = target.substr(0, target.find('?'));
  // The part below /v1/sandboxes/<id>.
  std::string below;
  constexpr std::string_view kPrefix = "/v1/sandboxes/";
  if (path.starts_with(kPrefix)) {
    auto slash = path.find('/', kPrefix.size());
    below = slash == std::string::npos ? "" : path.substr(slash);
  }
  const json::object* req = obj(e, "request");
  const json::object* body = req ? obj(*req, "body") : nullptr;
  int64_t len = req ? json_int(*req, "bytes").value_or(0) : 0;
  std::string p = query_value(target, "path");
  if (method == "POST" && below == "/exec")
    return "exec " + command_text(body ? body->if_contains("cmd") : nullptr);
  if (method == "POST" && below == "/processes")
    return "start " + command_text(body ? body->if_contains("cmd") : nullptr);
  if (method == "PUT" && below == "/files") return "write " + p + " (" + bytes(len) + ")";
  if (method == "DELETE" && below == "/files")
    return "rm " + std::string(query_value(target, "recursive") == "true" ? "-r " : "") + p;
  if (method == "POST" && below == "/files/mkdir") return "mkdir " + p;
  if (method == "PUT" && below == "/files/tar") return "upload to " + p + " (" + bytes(len) + ")";
  if (method == "DELETE" && below.empty()) return "delete sandbox";
  if (method == "POST" && below == "/replay")
    return body && body->if_contains("branch") && body->at("branch").is_bool() &&
                   body->at("branch").get_bool()
               ? "branch"
               : "replay";
  if (method == "POST" && below.starts_with("/processes/")) {
    std::string rest = below.substr(11);
    auto slash = rest.find('/');
    std::string pid = rest.substr(0, slash),
                verb = slash == std::string::npos ? "" : rest.substr(slash + 1);
    if (verb == "wait") return "wait process " + pid;
    if (verb == "stdin") return "stdin to process " + pid + " (" + bytes(len) + ")";
    if (verb == "signal") {
      auto sig = body ? json_int(*body, "signal") : std::nullopt;
      return "signal " + std::to_string(sig.value_or(9)) + " to process " + pid;
    }
  }
  return method + " " + path;
}

std::string exit_text(const json::object& r) {
  if (r.if_contains("timed_out") && r.at("timed_out").is_bool() && r.at("timed_out").get_bool())
    return "timed out";
  auto sig = json_int(r, "signal").value_or(0);
  if (sig > 0) return "signal " + std::to_string(sig);
  auto code = json_int(r, "exit_code");
  return code ? "exit " + std::to_string(*code) : "";
}

std::string result_of_call(const json::object& e) {
  int64_t status = json_int(e, "status").value_or(0);
  const json::object* r = obj(e, "result");
  if (status >= 400) {
    std::string s = std::to_string(status);
    if (r) s += " " + json_string(*r, "code") + ": " + json_string(*r, "message");
    return s;
  }
  if (!r) return std::to_string(status);
  std::string s = exit_text(*r);
  if (const json::object* inner = obj(*r, "result"); s.empty() && inner) s = exit_text(*inner);
  if (!s.empty()) {
    auto out = json_int(*r, "stdout_bytes"), err = json_int(*r, "stderr_bytes");
    if (out || err)
      s += " (" + bytes(out.value_or(0)) + " out, " + bytes(err.value_or(0)) + " err)";
    return s;
  }
  if (auto pid = json_int(*r, "pid")) return "pid " + std::to_string(*pid);
  if (auto size = json_int(*r, "size")) return std::to_string(status) + ", " + bytes(*size);
  return std::to_string(status);
}

std::string what_of_event(const json::object& e) {
  std::string ev = json_string(e, "event");
  const json::object* d = obj(e, "detail");
  if (!d) return ev;
  if (ev == "created") {
    size_t layers = 0;
    if (const auto* l = d->if_contains("layers"); l && l->is_array())
      layers = l->get_array().size();
    return "created (image " + json_string(*d, "image") +
           (layers ? ", " + std::to_string(layers) + " layer" + (layers > 1 ? "s" : "") : "") + ")";
  }
  if (ev == "process_exit") {
    std::string s = "process " + std::to_string(json_int(*d, "pid").value_or(0)) + " ended";
    std::string x = exit_text(*d);
    if (const json::object* err = obj(*d, "error")) x = json_string(*err, "message");
    return x.empty() ? s : s + ": " + x;
  }
  if (ev == "ended") return "ended (" + json_string(*d, "end_reason") + ")";
  if (ev == "replay")
    return "replay of " + json_string(*d, "source") + " to step " +
           std::to_string(json_int(*d, "to_step").value_or(0));
  if (ev == "replay_finished")
    return "replay finished: " + std::to_string(json_int(*d, "replayed").value_or(0)) + " calls, " +
           std::to_string(json_int(*d, "divergences").value_or(0)) + " divergences";
  return ev;
}

std::vector<std::string> row_of(const json::object& e) {
  std::string t = json_string(e, "time");
  // "2026-01-02T03:04:05.678Z" -> "03:04:05.678" (UTC)
  if (auto T = t.find('T'); T != std::string::npos) t = t.substr(T + 1, 12);
  std::string seq = std::to_string(json_int(e, "seq").value_or(0));
  if (json_string(e, "kind") == "event") return {seq, t, "-", clip(what_of_event(e), 60), "-"};
  std::string key = json_string(e, "key");
  return {seq, t, key.empty() ? "-" : clip(key, 40), clip(what_of_call(e), 60),
          clip(result_of_call(e), 60)};
}

const std::vector<std::string> kHeader = {"SEQ", "TIME (UTC)", "KEY", "STEP", "RESULT"};

}  // namespace

Action add_log(CLI::App& root, Context& ctx) {
  struct State {
    std::string id, key;
    int64_t after = 0, limit = 1000;
    bool json = false, follow = false;
  };
  auto st = std::make_shared<State>();
  CLI::App* sub = root.add_subcommand(
      "log", "A sandbox's history from its trajectory log: what ran, when, by which key, result");
  sub->add_option("id", st->id, "sandbox id")->required()->type_name("ID");
  sub->add_option("--after", st->after, "only steps after this seq (a cursor)")->type_name("SEQ");
  sub->add_option("--limit", st->limit, "at most this many steps (1-10000)")->type_name("N");
  sub->add_flag("--json", st->json, "print the daemon's JSON (NDJSON with --follow)");
  sub->add_flag("-f,--follow", st->follow, "keep printing new steps until the sandbox ends");
  sub->add_option("--key", st->key, "print the recorded answer of the call with this key")
      ->type_name("KEY");
  return [st, &ctx]() -> int {
    if (st->after < 0) return usage_error("--after must be 0 or more");
    if (st->limit < 1 || st->limit > 10000) return usage_error("--limit must be 1-10000");
    auto client = ctx.client();
    if (!client) return report(client.error());
    std::string base = sandbox_path(st->id) + "/log";
    if (!st->key.empty()) {
      auto r = (*client)->request(Method::kGet, base + "/result?key=" + url_encode(st->key));
      if (!r) return report(r.error());
      write_all(1, r->body);
      if (!r->body.empty() && r->body.back() != '\n') write_all(1, "\n");
      return kExitOk;
    }
    std::string q = "?after=" + std::to_string(st->after);
    if (st->follow) {
      NdjsonSplitter splitter;
      bool header = false;
      auto on_line = [&](std::string_view line) -> Result<void> {
        if (st->json) {
          write_all(1, std::string(line) + "\n");
          return {};
        }
        boost::system::error_code ec;
        auto v = json::parse(line, ec);
        if (ec || !v.is_object()) return fail(Code::kInternal, "tidepoold sent a bad log entry");
        if (!header) {
          header = true;
          std::printf("%-5s %-12s %s\n", "SEQ", "TIME (UTC)", "KEY / STEP / RESULT");
        }
        auto r = row_of(v.get_object());
        std::printf("%-5s %-12s %s  %s  %s\n", r[0].c_str(), r[1].c_str(), r[2].c_str(),
                    r[3].c_str(), r[4].c_str());
        std::fflush(stdout);
        return {};
      };
      auto r =
          (*client)->stream(Method::kGet, base + q + "&follow=true", "", "", nullptr,
                            [&](std::string_view piece) { return splitter.feed(piece, on_line); });
      if (!r) return report(r.error());
      return kExitOk;
    }
    auto resp =
        (*client)->call_json(Method::kGet, base + q + "&limit=" + std::to_string(st->limit));
    if (!resp) return report(resp.error());
    if (st->json) {
      std::printf("%s\n", json::serialize(*resp).c_str());
      return kExitOk;
    }
    const json::array* entries = nullptr;
    if (resp->is_object())
      if (const auto* e = resp->get_object().if_contains("entries"); e && e->is_array())
        entries = &e->get_array();
    if (entries == nullptr)
      return report(Error{Code::kInternal, 0, "tidepoold sent no log entries"});
    std::vector<std::vector<std::string>> rows{kHeader};
    for (const auto& v : *entries)
      if (v.is_object()) rows.push_back(row_of(v.get_object()));
    print_table(rows);
    return kExitOk;
  };
}

}  // namespace tp::cli
