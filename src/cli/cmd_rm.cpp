// tidepool rm: remove sandboxes; prints each removed id, one error line per failure.
#include <cstdio>

#include "cli/commands.h"

namespace tp::cli {

Action add_rm(CLI::App& root, Context& ctx) {
  auto ids = std::make_shared<std::vector<std::string>>();
  CLI::App* sub = root.add_subcommand("rm", "Remove sandboxes (exit 1 if any removal failed)");
  sub->add_option("ids", *ids, "sandbox ids")->required()->type_name("ID...");
  return [ids, &ctx]() -> int {
    auto client = ctx.client();
    if (!client) return report(client.error());
    int rc = kExitOk;
    for (const auto& id : *ids) {
      auto r = (*client)->call_json(Method::kDelete, sandbox_path(id));
      if (!r) {
        rc = report(r.error());
        // Daemon gone: the other ids would only repeat the same line.
        if (r.error().code == Code::kUnavailable) break;
        continue;
      }
      std::printf("%s\n", id.c_str());
      std::fflush(stdout);
    }
    return rc;
  };
}

}  // namespace tp::cli
