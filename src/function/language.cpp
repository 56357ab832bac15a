#include "function/language.h"

#include <algorithm>
#include <boost/json.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/json_util.h"

namespace tp::function {

namespace json = boost::json;

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool valid_lang_name(std::string_view n) {
  if (n.empty() || n.size() > 32) return false;
  return std::all_of(n.begin(), n.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '+' || c == '-';
  });
}

// "{bootstrap:NAME}" -> the bundled file's text.
Result<std::string> resolve_bootstrap(const std::string& arg,
                                      const std::map<std::string, std::string>& assets) {
  const std::string open = "{bootstrap:";
  auto at = arg.find(open);
  if (at == std::string::npos) return arg;
  auto end = arg.find('}', at);
  if (end == std::string::npos)
    return fail(Code::kInvalidArgument, "field 'prestart': unterminated {bootstrap:...}");
  std::string name = arg.substr(at + open.size(), end - at - open.size());
  auto it = assets.find(name);
  if (it == assets.end())
    return fail(Code::kInvalidArgument, "field 'prestart': no bundled bootstrap '" + name + "'");
  return arg.substr(0, at) + it->second + arg.substr(end + 1);
}

}  // namespace

Result<LanguageDef> parse_language(std::string_view text, const std::string& source,
                                   const std::map<std::string, std::string>& assets) {
  auto o = json_util::parse_object(text);
  if (!o) return fail(Code::kInvalidArgument, source + ": " + o.error().message());
  auto in = [&](const Error& e) { return fail(e.code, source + ": " + e.message()); };
  if (auto r = json_util::only_keys(
          *o, {"name", "aliases", "sandbox_fusion", "extensions", "image", "file", "compile",
               "binary", "run", "mode", "preload", "prestart", "env"});
      !r)
    return in(r.error());
  LanguageDef d;
  d.source = source;
  auto str = [&](std::string_view k, std::string* out, const std::string& dflt) -> Result<void> {
    auto v = json_util::get_string(*o, k, dflt);
    if (!v) return std::unexpected(v.error());
    *out = *v;
    return {};
  };
  auto list = [&](std::string_view k, std::vector<std::string>* out) -> Result<void> {
    auto v = json_util::get_string_list(*o, k);
    if (!v) return std::unexpected(v.error());
    *out = *v;
    return {};
  };
  std::string mode;
  for (auto r : {str("name", &d.name, ""), str("image", &d.image, "host"), str("file", &d.file, ""),
                 str("binary", &d.binary, ""), str("mode", &mode, "exec"),
                 list("aliases", &d.aliases), list("sandbox_fusion", &d.sandbox_fusion),
                 list("extensions", &d.extensions), list("compile", &d.compile),
                 list("run", &d.run), list("preload", &d.preload), list("prestart", &d.prestart)})
    if (!r) return in(r.error());
  auto env = json_util::get_string_map(*o, "env");
  if (!env) return in(env.error());
  d.env = *env;
  if (!valid_lang_name(d.name))
    return fail(
        Code::kInvalidArgument,
        source + ": field 'name' must be 1-32 characters of [a-z0-9_+-], got '" + d.name + "'");
  for (const auto& a : d.aliases)
    if (!valid_lang_name(lower(a)))
      return fail(Code::kInvalidArgument, source + ": invalid alias '" + a + "'");
  if (d.image.empty()) d.image = "host";
  if (d.file.empty() || d.file.find('/') != std::string::npos || d.file == "." || d.file == "..")
    return fail(Code::kInvalidArgument,
                source + ": field 'file' must be a plain file name, got '" + d.file + "'");
  if (d.run.empty()) return fail(Code::kInvalidArgument, source + ": field 'run' is required");
  if (mode == "python") {
    d.mode = RunMode::kPython;
    if (d.compiled() || d.prestarted())
      return fail(Code::kInvalidArgument,
                  source + ": mode 'python' takes neither 'compile' nor 'prestart'");
  } else if (mode != "exec") {
    return fail(Code::kInvalidArgument,
                source + ": field 'mode' must be 'exec' or 'python', got '" + mode + "'");
  }
  if (d.compiled() &&
      (d.binary.empty() || d.binary.find('/') != std::string::npos || d.binary == d.file))
    return fail(Code::kInvalidArgument,
                source +
                    ": a language with 'compile' needs 'binary', a plain file name other "
                    "than 'file'");
  if (!d.compiled() && !d.binary.empty())
    return fail(Code::kInvalidArgument, source + ": 'binary' needs 'compile'");
  if (d.compiled() && d.prestarted())
    return fail(Code::kInvalidArgument, source + ": 'compile' and 'prestart' exclude each other");
  for (auto& a : d.prestart) {
    auto r = resolve_bootstrap(a, assets);
    if (!r) return in(r.error());
    a = *r;
  }
  for (const auto& e : d.extensions)
    if (e.size() < 2 || e[0] != '.')
      return fail(Code::kInvalidArgument, source + ": extension '" + e + "' must start with '.'");
  return d;
}

Result<std::shared_ptr<const LanguageSet>> LanguageSet::from(std::vector<LanguageDef> defs) {
  auto s = std::make_shared<LanguageSet>();
  std::map<std::string, std::string> names;  // every name and alias -> definition
  for (const auto& d : defs) {
    std::vector<std::string> all{d.name};
    for (const auto& a : d.aliases) all.push_back(lower(a));
    for (const auto& n : all) {
      auto [it, fresh] = names.emplace(n, d.name);
      if (!fresh && it->second != d.name)
        return fail(Code::kInvalidArgument, "language name '" + n + "' is used by both '" +
                                                it->second + "' and '" + d.name + "'");
    }
  }
  std::map<std::string, std::string> sf;
  for (const auto& d : defs)
    for (const auto& n : d.sandbox_fusion) {
      auto [it, fresh] = sf.emplace(n, d.name);
      if (!fresh)
        return fail(Code::kInvalidArgument, "SandboxFusion language '" + n +
                                                "' is served by both '" + it->second + "' and '" +
                                                d.name + "'");
    }
  s->defs_ = std::move(defs);
  std::sort(s->defs_.begin(), s->defs_.end(),
            [](const LanguageDef& a, const LanguageDef& b) { return a.name < b.name; });
  return std::shared_ptr<const LanguageSet>(std::move(s));
}

Result<std::shared_ptr<const LanguageSet>> LanguageSet::load(const std::string& extra_dir) {
  const auto& assets = bundled_assets();
  std::map<std::string, LanguageDef> by_name;
  for (const auto& [file, text] : assets) {
    if (!file.starts_with("languages/") || !file.ends_with(".json")) continue;
    auto d = parse_language(text, "built-in " + file, assets);
    if (!d) return std::unexpected(d.error());
    d->source = "built-in";
    by_name[d->name] = std::move(*d);
  }
  if (!extra_dir.empty()) {
    std::error_code ec;
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(extra_dir, ec))
      if (e.path().extension() == ".json") files.push_back(e.path());
    if (ec)
      return fail(Code::kInvalidArgument, "--fn-languages " + extra_dir + ": " + ec.message());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::ifstream in(f);
      std::stringstream ss;
      ss << in.rdbuf();
      if (!in.good() && !in.eof()) return fail(Code::kInvalidArgument, "cannot read " + f.string());
      auto d = parse_language(ss.str(), f.string(), assets);
      if (!d) return std::unexpected(d.error());
      by_name[d->name] = std::move(*d);
    }
  }
  std::vector<LanguageDef> defs;
  for (auto& [_, d] : by_name) defs.push_back(std::move(d));
  return from(std::move(defs));
}

const LanguageDef* LanguageSet::find(std::string_view name) const {
  std::string n = lower(name);
  for (const auto& d : defs_) {
    if (d.name == n) return &d;
    for (const auto& a : d.aliases)
      if (lower(a) == n) return &d;
  }
  return nullptr;
}

const LanguageDef* LanguageSet::find_sandbox_fusion(std::string_view sf_name) const {
  for (const auto& d : defs_)
    for (const auto& n : d.sandbox_fusion)
      if (n == sf_name) return &d;
  return nullptr;
}

const LanguageDef* LanguageSet::find_extension(std::string_view ext) const {
  std::string e = lower(ext);
  for (const auto& d : defs_)
    for (const auto& x : d.extensions)
      if (lower(x) == e) return &d;
  return nullptr;
}

const std::vector<std::string>& sandbox_fusion_languages() {
  static const std::vector<std::string> kAll = {
      "python",  "cpp",        "nodejs", "go",         "go_test",       "java",
      "php",     "csharp",     "bash",   "typescript", "sql",           "rust",
      "cuda",    "lua",        "R",      "perl",       "D_ut",          "ruby",
      "scala",   "julia",      "pytest", "junit",      "kotlin_script", "jest",
      "verilog", "python_gpu", "lean",   "swift",      "racket",        "js",
      "ts"};
  return kAll;
}

}  // namespace tp::function
