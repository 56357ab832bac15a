#include "image/oci_archive.h"

#include <boost/json.hpp>

namespace tp::image {
namespace {

namespace json = boost::json;

Result<json::value> parse(const std::string& text, const std::string& what) {
  boost::system::error_code ec;
  json::value v = json::parse(text, ec);
  if (ec) return fail(Code::kInvalidArgument, what + " is not valid JSON: " + ec.message());
  return v;
}

std::string str(const json::object& o, const char* k) {
  auto* v = o.if_contains(k);
  return v && v->is_string() ? std::string(v->as_string()) : std::string();
}

bool valid_digest(const std::string& d) {
  if (d.size() != 71 || d.rfind("sha256:", 0) != 0) return false;
  for (size_t i = 7; i < d.size(); ++i)
    if (!((d[i] >= '0' && d[i] <= '9') || (d[i] >= 'a' && d[i] <= 'f'))) return false;
  return true;
}

Result<std::string> blob_path(const std::string& digest) {
  if (!valid_digest(digest)) return fail(Code::kInvalidArgument, "invalid digest '" + digest + "'");
  return "blobs/sha256/" + digest.substr(7);
}

Result<const std::string*> member(const std::map<std::string, std::string>& m,
                                  const std::string& name) {
  auto it = m.find(normalize_member(name));
  if (it == m.end())
    return fail(Code::kInvalidArgument, "archive member '" + name + "' is missing");
  return &it->second;
}

}  // namespace

Result<ArchiveKind> parse_archive_kind(const std::string& s) {
  if (s.empty() || s == "auto") return ArchiveKind::kAuto;
  if (s == "docker") return ArchiveKind::kDocker;
  if (s == "oci") return ArchiveKind::kOci;
  if (s == "layer" || s == "tar") return ArchiveKind::kLayer;
  return fail(Code::kInvalidArgument, "kind must be auto, docker, oci or layer, got '" + s + "'");
}

std::string normalize_member(const std::string& name) {
  std::string out;
  size_t i = 0;
  while (i <= name.size()) {
    size_t j = name.find('/', i);
    if (j == std::string::npos) j = name.size();
    std::string c = name.substr(i, j - i);
    if (!c.empty() && c != ".") out += (out.empty() ? "" : "/") + c;
    i = j + 1;
  }
  return out;
}

Result<ImageDefaults> parse_image_config(const std::string& text,
                                         std::vector<std::string>* diff_ids) {
  auto v = parse(text, "image config");
  if (!v) return std::unexpected(v.error());
  if (!v->is_object()) return fail(Code::kInvalidArgument, "image config is not an object");
  const auto& o = v->as_object();
  ImageDefaults d;
  const json::object* c = nullptr;
  if (auto* cv = o.if_contains("config"); cv && cv->is_object()) c = &cv->as_object();
  if (c) {
    if (auto* env = c->if_contains("Env"); env && env->is_array()) {
      for (const auto& e : env->as_array()) {
        if (!e.is_string()) continue;
        std::string s(e.as_string());
        auto eq = s.find('=');
        if (eq == 0 || eq == std::string::npos) continue;
        d.env[s.substr(0, eq)] = s.substr(eq + 1);
      }
    }
    d.workdir = str(*c, "WorkingDir");
    d.user = str(*c, "User");
    for (const char* k : {"Entrypoint", "Cmd"}) {
      if (auto* a = c->if_contains(k); a && a->is_array())
        for (const auto& x : a->as_array())
          if (x.is_string()) d.cmd.emplace_back(x.as_string());
    }
  }
  if (diff_ids) {
    diff_ids->clear();
    if (auto* rf = o.if_contains("rootfs"); rf && rf->is_object()) {
      if (auto* ids = rf->as_object().if_contains("diff_ids"); ids && ids->is_array())
        for (const auto& x : ids->as_array()) {
          std::string s = x.is_string() ? std::string(x.as_string()) : "";
          if (!valid_digest(s))
            return fail(Code::kInvalidArgument, "image config has an invalid diff_id '" + s + "'");
          diff_ids->push_back(s);
        }
    }
  }
  return d;
}

Result<ImagePlan> plan_docker(const std::map<std::string, std::string>& members) {
  auto m = member(members, "manifest.json");
  if (!m) return std::unexpected(m.error());
  auto v = parse(**m, "manifest.json");
  if (!v) return std::unexpected(v.error());
  if (!v->is_array() || v->as_array().empty())
    return fail(Code::kInvalidArgument, "manifest.json must be a non-empty array");
  if (v->as_array().size() > 1)
    return fail(Code::kInvalidArgument, "the archive holds " +
                                            std::to_string(v->as_array().size()) +
                                            " images; import one image per archive");
  const auto& e = v->as_array()[0];
  if (!e.is_object()) return fail(Code::kInvalidArgument, "manifest.json entry is not an object");
  const auto& o = e.as_object();
  ImagePlan plan;
  std::string cfg = str(o, "Config");
  if (cfg.empty()) return fail(Code::kInvalidArgument, "manifest.json has no Config");
  auto c = member(members, cfg);
  if (!c) return std::unexpected(c.error());
  std::vector<std::string> diff_ids;
  auto d = parse_image_config(**c, &diff_ids);
  if (!d) return std::unexpected(d.error());
  plan.defaults = std::move(*d);
  auto* layers = o.if_contains("Layers");
  if (!layers || !layers->is_array())
    return fail(Code::kInvalidArgument, "manifest.json has no Layers");
  const auto& la = layers->as_array();
  if (!diff_ids.empty() && diff_ids.size() != la.size())
    return fail(Code::kInvalidArgument, "config lists " + std::to_string(diff_ids.size()) +
                                            " diff_ids for " + std::to_string(la.size()) +
                                            " layers");
  for (size_t i = 0; i < la.size(); ++i) {
    if (!la[i].is_string())
      return fail(Code::kInvalidArgument, "manifest.json Layers must be strings");
    plan.layers.push_back(
        {normalize_member(std::string(la[i].as_string())), diff_ids.empty() ? "" : diff_ids[i]});
  }
  if (auto* t = o.if_contains("RepoTags"); t && t->is_array())
    for (const auto& x : t->as_array())
      if (x.is_string()) plan.tags.emplace_back(x.as_string());
  return plan;
}

Result<ImagePlan> plan_oci(const std::map<std::string, std::string>& members) {
  auto idx = member(members, "index.json");
  if (!idx) return std::unexpected(idx.error());
  auto v = parse(**idx, "index.json");
  if (!v) return std::unexpected(v.error());
  ImagePlan plan;
  // Follow nested indexes (an image index inside the layout index) to one manifest.
  json::value cur = *v;
  for (int depth = 0;; ++depth) {
    if (depth > 4) return fail(Code::kInvalidArgument, "image indexes nested too deep");
    if (!cur.is_object()) return fail(Code::kInvalidArgument, "index is not an object");
    auto* ms = cur.as_object().if_contains("manifests");
    if (!ms) break;  // an image manifest
    if (!ms->is_array() || ms->as_array().empty())
      return fail(Code::kInvalidArgument, "index lists no manifests");
    if (ms->as_array().size() > 1)
      return fail(Code::kInvalidArgument,
                  "the index lists " + std::to_string(ms->as_array().size()) +
                      " manifests; import one image (platform) per archive");
    const auto& d = ms->as_array()[0];
    if (!d.is_object()) return fail(Code::kInvalidArgument, "index entry is not an object");
    if (auto* an = d.as_object().if_contains("annotations"); an && an->is_object()) {
      std::string ref = str(an->as_object(), "org.opencontainers.image.ref.name");
      if (!ref.empty()) plan.tags.push_back(ref);
    }
    auto p = blob_path(str(d.as_object(), "digest"));
    if (!p) return std::unexpected(p.error());
    auto b = member(members, *p);
    if (!b) return std::unexpected(b.error());
    auto nv = parse(**b, *p);
    if (!nv) return std::unexpected(nv.error());
    cur = std::move(*nv);
  }
  const auto& man = cur.as_object();
  auto* cfgd = man.if_contains("config");
  if (!cfgd || !cfgd->is_object()) return fail(Code::kInvalidArgument, "manifest has no config");
  auto cp = blob_path(str(cfgd->as_object(), "digest"));
  if (!cp) return std::unexpected(cp.error());
  auto c = member(members, *cp);
  if (!c) return std::unexpected(c.error());
  std::vector<std::string> diff_ids;
  auto d = parse_image_config(**c, &diff_ids);
  if (!d) return std::unexpected(d.error());
  plan.defaults = std::move(*d);
  auto* layers = man.if_contains("layers");
  if (!layers || !layers->is_array()) return fail(Code::kInvalidArgument, "manifest has no layers");
  const auto& la = layers->as_array();
  if (!diff_ids.empty() && diff_ids.size() != la.size())
    return fail(Code::kInvalidArgument, "config lists " + std::to_string(diff_ids.size()) +
                                            " diff_ids for " + std::to_string(la.size()) +
                                            " layers");
  for (size_t i = 0; i < la.size(); ++i) {
    if (!la[i].is_object()) return fail(Code::kInvalidArgument, "manifest layer is not an object");
    std::string mt = str(la[i].as_object(), "mediaType");
    if (mt.find("nondistributable") != std::string::npos || mt.find("foreign") != std::string::npos)
      return fail(Code::kInvalidArgument, "foreign layer " + mt + " is not supported");
    auto lp = blob_path(str(la[i].as_object(), "digest"));
    if (!lp) return std::unexpected(lp.error());
    plan.layers.push_back({*lp, diff_ids.empty() ? "" : diff_ids[i]});
  }
  return plan;
}

}  // namespace tp::image
