// tidepool image import|build|ls|inspect|rm|gc: manage the daemon's images
// (api/openapi.yaml, /v1/images). import uploads an archive file; build sends
// a spec file (src/image/builder.h) and waits for mmdebstrap; ls prints a
// table (--json for the daemon's JSON).
#include <fcntl.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <cstdio>

#include "cli/commands.h"
#include "cli/parse.h"

namespace tp::cli {
namespace {

namespace json = boost::json;

std::string human_bytes(double b) {
  const char* u[] = {"B", "KB", "MB", "GB", "TB"};
  int i = 0;
  while (b >= 1024 && i < 4) {
    b /= 1024;
    ++i;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, i ? "%.1f %s" : "%.0f %s", b, u[i]);
  return buf;
}

double num_of(const json::object& o, std::string_view k) {
  const auto* v = o.if_contains(k);
  if (!v) return 0;
  if (v->is_int64()) return static_cast<double>(v->get_int64());
  if (v->is_uint64()) return static_cast<double>(v->get_uint64());
  if (v->is_double()) return v->get_double();
  return 0;
}

void print_json(const json::value& v) { std::printf("%s\n", json::serialize(v).c_str()); }

std::string image_path(const std::string& ref) {
  std::string enc = url_encode(ref), safe;
  for (char c : enc) safe += c == '/' ? std::string("%2F") : std::string(1, c);
  return "/v1/images/" + safe;
}

struct ImageFlags {
  std::string file, name, version, kind = "auto", spec, ref;
  bool json = false;
};

}  // namespace

Action add_image(CLI::App& root, Context& ctx) {
  auto f = std::make_shared<ImageFlags>();
  CLI::App* img = root.add_subcommand("image", "Manage images: import, build, ls, inspect, rm, gc");
  img->require_subcommand(1);
  CLI::App* imp =
      img->add_subcommand("import", "Import a docker-save or OCI archive, or a tar as one layer");
  imp->add_option("file", f->file, "archive file ('-' = stdin)")->required();
  imp->add_option("--name", f->name, "image name (default: the archive's tag)");
  imp->add_option("--version", f->version, "image version (default: the tag's, else next integer)");
  imp->add_option("--kind", f->kind, "auto, docker, oci or layer")->capture_default_str();
  CLI::App* build =
      img->add_subcommand("build", "Build a Debian image with mmdebstrap from a JSON spec file");
  build->add_option("spec", f->spec, "spec file ('-' = stdin)")->required();
  CLI::App* ls = img->add_subcommand("ls", "List images");
  ls->add_flag("--json", f->json, "print the daemon's JSON");
  CLI::App* inspect = img->add_subcommand("inspect", "Show one image as JSON");
  inspect->add_option("ref", f->ref, "name[:version]")->required();
  CLI::App* rm = img->add_subcommand("rm", "Remove an image (its layers go at the next gc)");
  rm->add_option("ref", f->ref, "name[:version]")->required();
  CLI::App* gc = img->add_subcommand("gc", "Remove layers no image references and no sandbox uses");

  return [f, &ctx, imp, build, ls, inspect, rm, gc]() -> int {
    auto client = ctx.client();
    if (!client) return report(client.error());
    HttpClient& c = **client;
    if (imp->parsed()) {
      auto data = f->file == "-" ? read_all(0, "stdin") : read_file(f->file);
      if (!data) return report(data.error());
      std::string q = "?kind=" + url_encode(f->kind);
      if (!f->name.empty()) q += "&name=" + url_encode(f->name);
      if (!f->version.empty()) q += "&version=" + url_encode(f->version);
      auto r = c.request(Method::kPost, "/v1/images/import" + q, *data, "application/x-tar");
      if (!r) return report(r.error());
      boost::system::error_code ec;
      auto v = json::parse(r->body, ec);
      if (!ec && v.is_object()) std::printf("%s\n", str_of(v.as_object(), "ref").c_str());
      return kExitOk;
    }
    if (build->parsed()) {
      auto data = f->spec == "-" ? read_all(0, "stdin") : read_file(f->spec);
      if (!data) return report(data.error());
      auto r = c.request(Method::kPost, "/v1/images/build", *data, "application/json");
      if (!r) return report(r.error());
      boost::system::error_code ec;
      auto v = json::parse(r->body, ec);
      if (!ec && v.is_object())
        std::printf("%s%s\n", str_of(v.as_object(), "ref").c_str(),
                    v.as_object().contains("cached") && v.as_object().at("cached").is_bool() &&
                            v.as_object().at("cached").as_bool()
                        ? " (cached)"
                        : "");
      return kExitOk;
    }
    if (ls->parsed()) {
      auto r = c.call_json(Method::kGet, "/v1/images");
      if (!r) return report(r.error());
      if (f->json) {
        print_json(*r);
        return kExitOk;
      }
      std::printf("%-32s %-8s %10s %-20s %s\n", "IMAGE", "LAYERS", "SIZE", "SOURCE", "CREATED");
      if (r->is_object())
        if (auto* arr = r->as_object().if_contains("images"); arr && arr->is_array())
          for (const auto& x : arr->as_array()) {
            if (!x.is_object()) continue;
            const auto& o = x.as_object();
            size_t n = o.contains("layers") && o.at("layers").is_array()
                           ? o.at("layers").as_array().size()
                           : 0;
            std::printf("%-32s %-8zu %10s %-20s %s\n", str_of(o, "ref").c_str(), n,
                        human_bytes(num_of(o, "size_bytes")).c_str(),
                        str_of(o, "source").substr(0, 20).c_str(), str_of(o, "created_at").c_str());
          }
      return kExitOk;
    }
    if (inspect->parsed()) {
      auto r = c.call_json(Method::kGet, image_path(f->ref));
      if (!r) return report(r.error());
      print_json(*r);
      return kExitOk;
    }
    if (rm->parsed()) {
      auto r = c.call_json(Method::kDelete, image_path(f->ref));
      if (!r) return report(r.error());
      if (r->is_object()) std::printf("%s\n", str_of(r->as_object(), "ref").c_str());
      return kExitOk;
    }
    if (gc->parsed()) {
      auto r = c.call_json(Method::kPost, "/v1/images/gc");
      if (!r) return report(r.error());
      if (r->is_object()) {
        const auto& o = r->as_object();
        size_t n = o.contains("removed") && o.at("removed").is_array()
                       ? o.at("removed").as_array().size()
                       : 0;
        std::printf("removed %zu layers, freed %s\n", n,
                    human_bytes(num_of(o, "freed_bytes")).c_str());
      }
      return kExitOk;
    }
    return usage_error("image: a subcommand is required (see --help)");
  };
}

}  // namespace tp::cli
