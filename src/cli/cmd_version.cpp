// tidepool version: this client's version and, when reachable, the daemon's.
#include <cstdio>

#include "cli/commands.h"

namespace tp::cli {

Action add_version(CLI::App& root, Context& ctx) {
  root.add_subcommand("version",
                      "Print the client's version and the daemon's (an unreachable daemon is "
                      "reported on stderr but is not an error)");
  return [&ctx]() -> int {
    std::printf("tidepool %s\n", TP_VERSION);
    std::fflush(stdout);
    auto client = ctx.client();
    if (!client) return report(client.error());
    auto v = (*client)->call_json(Method::kGet, "/version");
    if (!v) {
      report(v.error());
      return kExitOk;
    }
    std::string version = "unknown", api, tiers;
    if (v->is_object()) {
      const auto& o = v->get_object();
      if (const auto* s = o.if_contains("version"); s && s->is_string()) version = s->get_string();
      if (const auto* s = o.if_contains("api"); s && s->is_string()) api = s->get_string();
      if (const auto* t = o.if_contains("tiers"); t && t->is_array()) {
        for (const auto& x : t->get_array()) {
          if (!x.is_string()) continue;
          if (!tiers.empty()) tiers += ",";
          tiers += x.get_string();
        }
      }
    }
    std::string extra;
    if (!api.empty()) extra += "api " + api;
    if (!tiers.empty()) extra += (extra.empty() ? "" : "; ") + std::string("tiers ") + tiers;
    std::printf("tidepoold %s%s at %s\n", version.c_str(),
                extra.empty() ? "" : (" (" + extra + ")").c_str(), (*client)->url().str().c_str());
    return kExitOk;
  };
}

}  // namespace tp::cli
