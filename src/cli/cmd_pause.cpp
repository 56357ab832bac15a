// tidepool pause|resume ID...: freeze every process of sandboxes, or thaw them (any
// later request to a paused sandbox resumes it too). Prints each id done, one error line
// per failure (exit 1 if any failed).
#include <cstdio>

#include "cli/commands.h"

namespace tp::cli {
namespace {

Action add_freeze(CLI::App& root, Context& ctx, const char* name, const char* help) {
  auto ids = std::make_shared<std::vector<std::string>>();
  CLI::App* sub = root.add_subcommand(name, help);
  sub->add_option("ids", *ids, "sandbox ids")->required()->type_name("ID...");
  std::string suffix = std::string("/") + name;
  return [ids, suffix, &ctx]() -> int {
    auto client = ctx.client();
    if (!client) return report(client.error());
    int rc = kExitOk;
    for (const auto& id : *ids) {
      auto r = (*client)->call_json(Method::kPost, sandbox_path(id) + suffix);
      if (!r) {
        rc = report(r.error());
        if (r.error().code == Code::kUnavailable) break;  // the daemon is gone for all
        continue;
      }
      std::printf("%s\n", id.c_str());
      std::fflush(stdout);
    }
    return rc;
  };
}

}  // namespace

Action add_pause(CLI::App& root, Context& ctx) {
  return add_freeze(root, ctx, "pause",
                    "Pause sandboxes: freeze their processes (a later request resumes them)");
}

Action add_resume(CLI::App& root, Context& ctx) {
  return add_freeze(root, ctx, "resume", "Resume paused sandboxes");
}

}  // namespace tp::cli
