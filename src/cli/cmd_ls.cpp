// tidepool ls: list sandboxes as a table (or the daemon's JSON with --json).
#include <algorithm>
#include <boost/json/serialize.hpp>
#include <cstdio>
#include <ctime>

#include "cli/commands.h"
#include "cli/lifecycle.h"
#include "cli/parse.h"

namespace tp::cli {
namespace {

std::string str_of(const boost::json::object& o, std::string_view key) {
  const auto* v = o.if_contains(key);
  return v != nullptr && v->is_string() ? std::string(v->get_string()) : std::string();
}

// One table row; "-" where the daemon said nothing.
std::vector<std::string> row_of(const boost::json::object& sb, std::time_t now) {
  std::string id = str_of(sb, "id");
  std::string state = str_of(sb, "state");
  std::string image = str_of(sb, "image");
  auto cpus = json_number(sb, "cpus");
  auto mem = json_number(sb, "memory_mb");
  std::string age = "-";
  if (auto c = parse_rfc3339(str_of(sb, "created_at"))) age = format_duration_short(now - *c);
  std::string expires = "-";
  if (std::string reason = str_of(sb, "end_reason"); !reason.empty()) {
    expires = "ended (" + reason + ")";
  } else if (auto e = parse_rfc3339(str_of(sb, "expires_at"))) {
    expires = *e <= now ? "now" : "in " + format_duration_short(*e - now);
  }
  std::string labels;
  if (const auto* l = sb.if_contains("labels"); l && l->is_object()) {
    std::vector<std::string> kv;
    for (const auto& [k, v] : l->get_object()) {
      kv.push_back(std::string(k) + "=" +
                   (v.is_string() ? std::string(v.get_string()) : boost::json::serialize(v)));
    }
    std::sort(kv.begin(), kv.end());
    for (const auto& x : kv) labels += (labels.empty() ? "" : ",") + x;
  }
  return {id.empty() ? "-" : id,
          state.empty() ? "-" : state,
          image.empty() ? "-" : image,
          cpus ? format_number(*cpus) : "-",
          mem ? format_mb(static_cast<int64_t>(*mem)) : "-",
          age,
          expires,
          labels.empty() ? "-" : labels};
}

}  // namespace

Action add_ls(CLI::App& root, Context& ctx) {
  struct State {
    std::vector<std::string> labels;
    bool all = false;
    bool json = false;
  };
  auto st = std::make_shared<State>();
  CLI::App* sub = root.add_subcommand("ls", "List sandboxes (live ones unless --all)");
  sub->add_option("--label", st->labels,
                  "only sandboxes with label KEY=VALUE (repeatable; all must match)")
      ->type_name("K=V")
      ->allow_extra_args(false);
  sub->add_flag("-a,--all", st->all, "include ended sandboxes");
  sub->add_flag("--json", st->json, "print the daemon's JSON array instead of a table");
  return [st, &ctx]() -> int {
    std::string query;
    for (const auto& l : st->labels) {
      if (auto kv = parse_key_value(l); !kv) return usage_error("--label: " + kv.error().message());
      query += (query.empty() ? "?" : "&") + std::string("label=") + url_encode(l);
    }
    if (st->all) query += (query.empty() ? "?" : "&") + std::string("all=true");
    auto client = ctx.client();
    if (!client) return report(client.error());
    auto resp = (*client)->call_json(Method::kGet, "/v1/sandboxes" + query);
    if (!resp) return report(resp.error());
    const boost::json::array* list = nullptr;
    if (resp->is_object()) {
      if (const auto* s = resp->get_object().if_contains("sandboxes"); s && s->is_array())
        list = &s->get_array();
    }
    if (list == nullptr) return report(Error{Code::kInternal, 0, "tidepoold sent no sandbox list"});
    if (st->json) {
      std::printf("%s\n", boost::json::serialize(*list).c_str());
      return kExitOk;
    }
    std::vector<std::vector<std::string>> rows;
    rows.push_back({"ID", "STATE", "IMAGE", "CPUS", "MEMORY", "AGE", "EXPIRES", "LABELS"});
    std::time_t now = std::time(nullptr);
    for (const auto& v : *list) {
      if (v.is_object()) rows.push_back(row_of(v.get_object(), now));
    }
    print_table(rows);
    return kExitOk;
  };
}

}  // namespace tp::cli
