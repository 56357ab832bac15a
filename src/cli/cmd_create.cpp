// tidepool create: make a sandbox and print only its id (so `id=$(tidepool create)` works).
#include <cstdio>

#include "cli/commands.h"

namespace tp::cli {

Action add_create(CLI::App& root, Context& ctx) {
  auto flags = std::make_shared<CreateFlags>();
  CLI::App* sub = root.add_subcommand("create", "Create a sandbox and print its id");
  flags->add_to(sub);
  return [flags, &ctx]() -> int {
    auto req = flags->to_request();
    if (!req) return usage_error(req.error().message());
    auto client = ctx.client();
    if (!client) return report(client.error());
    boost::json::value body(std::move(*req));
    auto resp = (*client)->call_json(Method::kPost, "/v1/sandboxes", &body);
    if (!resp) return report(resp.error());
    const auto* id = resp->is_object() ? resp->get_object().if_contains("id") : nullptr;
    if (id == nullptr || !id->is_string()) {
      return report(Error{Code::kInternal, 0, "tidepoold answered without a sandbox id"});
    }
    std::printf("%s\n", std::string(id->get_string()).c_str());
    return kExitOk;
  };
}

}  // namespace tp::cli
