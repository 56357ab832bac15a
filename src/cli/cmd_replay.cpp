// tidepool replay: re-run a sandbox's trajectory log into a fresh sandbox and report the
// first step whose answer differs from the record; --branch keeps the new sandbox live
// (a branch at that step). Exit 0: every step matched; 3: a step diverged.
#include <boost/json.hpp>
#include <cstdio>

#include "cli/commands.h"

namespace tp::cli {
namespace {

namespace json = boost::json;

constexpr int kExitDiverged = 3;

}  // namespace

Action add_replay(CLI::App& root, Context& ctx) {
  struct State {
    std::string id, key;
    int64_t to = 0;
    bool branch = false, keep = false, json = false;
  };
  auto st = std::make_shared<State>();
  CLI::App* sub = root.add_subcommand(
      "replay",
      "Re-run a sandbox's logged steps in a fresh sandbox and report the first divergence "
      "(exit 3 if a step diverged)");
  sub->add_option("id", st->id, "sandbox id")->required()->type_name("ID");
  sub->add_option("--to", st->to, "up to this step (a seq of `tidepool log`; default: the end)")
      ->type_name("SEQ");
  sub->add_option("--to-key", st->key, "up to the call with this Idempotency-Key")
      ->type_name("KEY");
  sub->add_flag("--branch", st->branch, "keep the new sandbox running: it continues from there");
  sub->add_flag("--keep", st->keep, "keep the new sandbox after a plain replay");
  sub->add_flag("--json", st->json, "print the daemon's report");
  return [st, &ctx]() -> int {
    if (st->to < 0) return usage_error("--to must be 1 or more");
    if (st->to > 0 && !st->key.empty()) return usage_error("give --to or --to-key, not both");
    json::object body;
    if (st->to > 0) body["to_step"] = st->to;
    if (!st->key.empty()) body["to_key"] = st->key;
    if (st->branch) body["branch"] = true;
    if (st->keep) body["keep"] = true;
    auto client = ctx.client();
    if (!client) return report(client.error());
    json::value b = body;
    auto resp = (*client)->call_json(Method::kPost, sandbox_path(st->id) + "/replay", &b);
    if (!resp) return report(resp.error());
    if (!resp->is_object()) return report(Error{Code::kInternal, 0, "tidepoold sent no report"});
    const auto& r = resp->get_object();
    bool matched =
        r.if_contains("matched") && r.at("matched").is_bool() && r.at("matched").get_bool();
    if (st->json) {
      std::printf("%s\n", json::serialize(r).c_str());
      return matched ? kExitOk : kExitDiverged;
    }
    std::string sb;
    if (const auto* s = r.if_contains("sandbox"); s && s->is_object())
      sb = json_string(s->get_object(), "id");
    bool kept = r.if_contains("kept") && r.at("kept").is_bool() && r.at("kept").get_bool();
    std::printf("replayed %lld calls of %s up to step %lld into %s (%s)\n",
                static_cast<long long>(json_int(r, "replayed").value_or(0)), st->id.c_str(),
                static_cast<long long>(json_int(r, "to_step").value_or(0)), sb.c_str(),
                kept ? "kept" : "removed");
    if (const auto* n = r.if_contains("notes"); n && n->is_array())
      for (const auto& x : n->get_array())
        if (x.is_string()) std::printf("note: %s\n", std::string(x.get_string()).c_str());
    if (matched) {
      std::printf("every step matched\n");
      return kExitOk;
    }
    if (const auto* d = r.if_contains("first_divergence"); d && d->is_object()) {
      const auto& o = d->get_object();
      std::printf(
          "%lld step(s) diverged; the first: step %lld%s (%s): %s\n  recorded: %s\n  replayed: "
          "%s\n",
          static_cast<long long>(json_int(r, "divergences").value_or(0)),
          static_cast<long long>(json_int(o, "seq").value_or(0)),
          json_string(o, "key").empty() ? "" : (" key " + json_string(o, "key")).c_str(),
          json_string(o, "call").c_str(), json_string(o, "field").c_str(),
          json_string(o, "recorded").c_str(), json_string(o, "replayed").c_str());
    }
    return kExitDiverged;
  };
}

}  // namespace tp::cli
