// tidepool exec: run a command in an existing sandbox, streaming its output; exits with
// the command's exit code.
#include "cli/commands.h"

namespace tp::cli {

Action add_exec(CLI::App& root, Context& ctx) {
  struct State {
    std::string id;
    ExecFlags exec;
  };
  auto st = std::make_shared<State>();
  CLI::App* sub = root.add_subcommand(
      "exec", "Run a command in a sandbox: tidepool exec ID [flags] -- CMD ARGS...");
  sub->add_option("id", st->id, "sandbox id")->required()->type_name("ID");
  st->exec.add_to(sub, /*with_env=*/true);
  sub->add_option("cmd", st->exec.cmd, "command and arguments (after --)")->type_name("CMD");
  return [st, &ctx]() -> int {
    auto req = st->exec.to_request();
    if (!req) {
      return req.error().code == Code::kInvalidArgument ? usage_error(req.error().message())
                                                        : report(req.error());
    }
    auto client = ctx.client();
    if (!client) return report(client.error());
    auto code = stream_exec(**client, st->id, *req);
    if (!code) return report(code.error());
    return *code;
  };
}

}  // namespace tp::cli
