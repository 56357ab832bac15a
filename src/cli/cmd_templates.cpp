// tidepool templates ls|create|replace|get|rm, and tidepool pools: named sandbox shapes
// with their warm pools (api/openapi.yaml, /v1/templates and /v1/pools).
//
//   tidepool templates create NAME [--image ...] [--pool-min N] [--pool-max N]
//   tidepool templates replace NAME [...] [--version N]   (PUT: create or replace; with
//                                                          --version only that version)
//
// create and replace print the template's name and version ("py 2"); get prints its JSON;
// ls and pools print tables (--json: the daemon's JSON array).
#include <boost/json/serialize.hpp>
#include <cstdio>

#include "cli/commands.h"
#include "cli/lifecycle.h"
#include "cli/parse.h"

namespace tp::cli {
namespace {

namespace json = boost::json;

std::string template_path(const std::string& name) { return "/v1/templates/" + path_segment(name); }

struct TemplateFlags {
  std::string name;
  CreateFlags shape;
  std::optional<int64_t> pool_min, pool_max, version;
  bool json_out = false;

  void add_to(CLI::App* app, bool with_version) {
    app->add_option("name", name, "template name (letters, digits, '-', '_', '.')")->required();
    shape.add_to(app, /*placement=*/false);
    app->add_option("--pool-min", pool_min, "fresh sandboxes kept ready at least (default 0)")
        ->type_name("N");
    app->add_option("--pool-max", pool_max,
                    "at most this many ready; between min and max the pool follows demand "
                    "(default 0: no pool)")
        ->type_name("N");
    if (with_version)
      app->add_option("--version", version,
                      "replace only this stored version (compare-and-set; exit 1 if another)")
          ->type_name("N");
    app->add_flag("--json", json_out, "print the daemon's JSON answer");
  }

  Result<json::object> to_request() const {
    auto o = shape.to_request();
    if (!o) return o;
    (*o)["name"] = name;
    if (pool_min) {
      if (*pool_min < 0) return fail(Code::kInvalidArgument, "--pool-min: must not be negative");
      (*o)["pool_min"] = *pool_min;
    }
    if (pool_max) {
      if (*pool_max < 0) return fail(Code::kInvalidArgument, "--pool-max: must not be negative");
      (*o)["pool_max"] = *pool_max;
    }
    if (pool_min && pool_max && *pool_min > *pool_max)
      return fail(Code::kInvalidArgument, "--pool-min: must not exceed --pool-max");
    if (version) {
      if (*version <= 0) return fail(Code::kInvalidArgument, "--version: must be positive");
      (*o)["version"] = *version;
    }
    return o;
  }
};

// Prints a Template answer: its JSON, or "NAME VERSION".
int print_template(const json::value& v, bool json_out) {
  if (json_out) {
    std::printf("%s\n", json::serialize(v).c_str());
    return kExitOk;
  }
  if (!v.is_object()) return report(Error{Code::kInternal, 0, "tidepoold sent no template"});
  const auto& o = v.get_object();
  auto ver = json_number(o, "version");
  std::printf("%s %s\n", str_of(o, "name").c_str(), ver ? format_number(*ver).c_str() : "-");
  return kExitOk;
}

}  // namespace

Action add_templates(CLI::App& root, Context& ctx) {
  struct State {
    TemplateFlags create, replace;
    std::string name;
    bool json_out = false;
  };
  auto st = std::make_shared<State>();
  CLI::App* tpl = root.add_subcommand(
      "templates", "Manage templates (named sandbox shapes with warm pools): ls, create, ...");
  tpl->require_subcommand(1);
  CLI::App* ls = tpl->add_subcommand("ls", "List templates with their pools");
  ls->add_flag("--json", st->json_out, "print the daemon's JSON array instead of a table");
  CLI::App* create = tpl->add_subcommand("create", "Create a template (exit 1 if the name exists)");
  st->create.add_to(create, /*with_version=*/false);
  CLI::App* replace =
      tpl->add_subcommand("replace", "Create or replace a template (its pool is drained)");
  st->replace.add_to(replace, /*with_version=*/true);
  CLI::App* get = tpl->add_subcommand("get", "Show one template (and its pool) as JSON");
  get->add_option("name", st->name, "template name")->required();
  CLI::App* rm = tpl->add_subcommand("rm", "Remove a template and drain its pool");
  rm->add_option("name", st->name, "template name")->required();

  return [st, &ctx, ls, create, replace, get, rm]() -> int {
    // Flags first: a usage error must not wait for the daemon.
    std::optional<json::value> body;
    if (create->parsed() || replace->parsed()) {
      auto req = (create->parsed() ? st->create : st->replace).to_request();
      if (!req) return usage_error(req.error().message());
      body = json::value(std::move(*req));
    }
    auto client = ctx.client();
    if (!client) return report(client.error());
    HttpClient& c = **client;
    if (ls->parsed())
      return show_list(c, "/v1/templates", "templates", st->json_out, template_rows);
    if (create->parsed()) {
      auto r = c.call_json(Method::kPost, "/v1/templates", &*body);
      if (!r) return report(r.error());
      return print_template(*r, st->create.json_out);
    }
    if (replace->parsed()) {
      auto r = c.call_json(Method::kPut, template_path(st->replace.name), &*body);
      if (!r) return report(r.error());
      return print_template(*r, st->replace.json_out);
    }
    if (get->parsed()) {
      auto r = c.call_json(Method::kGet, template_path(st->name));
      if (!r) return report(r.error());
      return print_template(*r, true);
    }
    auto r = c.call_json(Method::kDelete, template_path(st->name));
    if (!r) return report(r.error());
    std::printf("%s\n", st->name.c_str());
    return kExitOk;
  };
}

Action add_pools(CLI::App& root, Context& ctx) {
  auto json_out = std::make_shared<bool>(false);
  CLI::App* sub = root.add_subcommand("pools", "Show the warm pools (one per template)");
  sub->add_flag("--json", *json_out, "print the daemon's JSON array instead of a table");
  return [json_out, &ctx]() -> int {
    auto client = ctx.client();
    if (!client) return report(client.error());
    return show_list(**client, "/v1/pools", "pools", *json_out, pool_rows);
  };
}

}  // namespace tp::cli
