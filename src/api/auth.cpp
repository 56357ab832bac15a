#include "api/auth.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <boost/json.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "common/ids.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/sha256.h"
#include "sys/fd.h"
#include "sys/file_lock.h"
#include "sys/sys_api.h"

namespace tp::api {

namespace json = boost::json;

namespace {

Result<std::string> read_file(const std::string& path, bool* missing) {
  auto text = sys::read_whole_file(path, O_NOFOLLOW);
  *missing = !text && text.error().sys_errno == ENOENT;
  if (*missing) return std::string();
  return text;
}

Result<std::vector<ApiKey>> parse_keys(const std::string& text, const std::string& path) {
  std::vector<ApiKey> keys;
  if (text.empty()) return keys;
  auto o = json_util::parse_object(text);
  if (!o) return fail(Code::kInternal, path + ": " + o.error().message());
  const auto* arr = o->if_contains("keys");
  if (!arr || !arr->is_array()) return fail(Code::kInternal, path + ": no \"keys\" array");
  for (const auto& v : arr->get_array()) {
    if (!v.is_object()) return fail(Code::kInternal, path + ": a key is not an object");
    const auto& k = v.get_object();
    ApiKey key;
    auto str = [&](const char* f) -> std::string {
      const auto* x = k.if_contains(f);
      return x && x->is_string() ? std::string(x->get_string()) : std::string();
    };
    key.id = str("id");
    key.scope = str("scope");
    key.name = str("name");
    key.sha256 = str("sha256");
    if (const auto* c = k.if_contains("created_ms"); c && c->is_int64())
      key.created_ms = c->get_int64();
    if (key.id.empty() || key.sha256.size() != 64 || (key.scope != "admin" && key.scope != "user"))
      return fail(Code::kInternal, path + ": malformed key entry '" + key.id + "'");
    keys.push_back(std::move(key));
  }
  return keys;
}

// Serializes edits of the key file between `tidepoold keys` processes.
Result<sys::UniqueFd> lock_keys(const std::string& path) {
  return sys::lock_file(path + ".lock", /*wait=*/true);
}

int64_t now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

}  // namespace

Result<std::vector<ApiKey>> KeyFile::load() const {
  bool missing = false;
  auto text = read_file(path_, &missing);
  if (!text) return std::unexpected(text.error());
  return parse_keys(*text, path_);
}

Result<void> KeyFile::save(const std::vector<ApiKey>& keys) const {
  json::array arr;
  for (const auto& k : keys) {
    json::object o;
    o["id"] = k.id;
    o["scope"] = k.scope;
    o["name"] = k.name;
    o["sha256"] = k.sha256;
    o["created_ms"] = k.created_ms;
    arr.emplace_back(std::move(o));
  }
  json::object root;
  root["keys"] = std::move(arr);
  std::string text = json::serialize(root) + "\n";
  std::string tmp = path_ + ".tmp";
  ::unlink(tmp.c_str());
  sys::UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd) return sys_fail("open(" + tmp + ")");
  size_t off = 0;
  while (off < text.size()) {
    ssize_t w = ::write(fd.get(), text.data() + off, text.size() - off);
    if (w < 0) {
      if (errno == EINTR) continue;
      ::unlink(tmp.c_str());
      return sys_fail("write(" + tmp + ")");
    }
    off += static_cast<size_t>(w);
  }
  if (::fsync(fd.get()) != 0) {
    ::unlink(tmp.c_str());
    return sys_fail("fsync(" + tmp + ")");
  }
  fd.reset();
  if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return sys_fail("rename(" + tmp + ", " + path_ + ")");
  }
  return {};
}

Result<std::pair<ApiKey, std::string>> KeyFile::create(const std::string& scope,
                                                       const std::string& name) {
  if (scope != "admin" && scope != "user")
    return fail(Code::kInvalidArgument, "scope must be admin or user, got '" + scope + "'");
  auto lock = lock_keys(path_);
  if (!lock) return std::unexpected(lock.error());
  auto keys = load();
  if (!keys) return std::unexpected(keys.error());
  ApiKey k;
  k.id = "k" + ids::random_hex(5);
  // The id is the key's visible prefix, so a leaked key can be told apart in
  // logs and revoked by id; the rest (32 random bytes) is the secret.
  std::string secret = "tpk_" + k.id + "_" + ids::random_hex(32);
  k.scope = scope;
  k.name = name;
  k.sha256 = sha256_hex(secret);
  k.created_ms = now_ms();
  keys->push_back(k);
  TP_TRY(save(*keys));
  return std::pair{k, secret};
}

Result<ApiKey> KeyFile::revoke(const std::string& id) {
  auto lock = lock_keys(path_);
  if (!lock) return std::unexpected(lock.error());
  auto keys = load();
  if (!keys) return std::unexpected(keys.error());
  for (auto it = keys->begin(); it != keys->end(); ++it) {
    if (it->id == id) {
      ApiKey k = *it;
      keys->erase(it);
      TP_TRY(save(*keys));
      return k;
    }
  }
  return fail(Code::kNotFound, "no API key with id '" + id + "'");
}

Auth::Auth(AuthOptions opts) : opts_(std::move(opts)) {}

Result<ApiKey> Auth::find_key(const std::string& secret) {
  std::lock_guard lk(mu_);
  struct stat st {};
  Stamp now;
  if (::stat(opts_.key_file.c_str(), &st) == 0) {
    now = Stamp{st.st_ino, static_cast<uint64_t>(st.st_size),
                st.st_mtim.tv_sec * 1'000'000'000ll + st.st_mtim.tv_nsec};
  }
  if (!(now == stamp_)) {
    // Changed (or first use): reload. A broken file refuses every key rather
    // than keeping keys that may have been revoked.
    auto keys = KeyFile(opts_.key_file).load();
    if (keys) {
      keys_ = std::move(*keys);
      spdlog::info("API keys: loaded {} from {}", keys_.size(), opts_.key_file);
    } else {
      keys_.clear();
      spdlog::error("API keys: {}; no key is accepted until it is fixed", keys.error().message());
    }
    stamp_ = now;
  }
  std::string h = sha256_hex(secret);
  const ApiKey* found = nullptr;
  for (const auto& k : keys_) {
    if (CRYPTO_memcmp(k.sha256.data(), h.data(), h.size()) == 0) found = &k;
  }
  if (!found) return fail(Code::kUnauthenticated, "invalid or revoked API key");
  return *found;
}

Result<void> Auth::authenticate(Request& req) {
  Caller& c = req.caller;
  c.key_id.clear();
  c.scope.clear();
  c.import_roots.clear();
  if (c.unix_socket()) return {};
  std::string secret;
  if (auto it = req.headers.find("authorization"); it != req.headers.end()) {
    std::string_view v = it->second;
    if (v.size() > 7 && (v.substr(0, 7) == "Bearer " || v.substr(0, 7) == "bearer ")) {
      v.remove_prefix(7);
      while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
      while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
      secret = std::string(v);
    } else if (v.size() > 6 && (v.substr(0, 6) == "Basic " || v.substr(0, 6) == "basic ")) {
      // HTTP Basic with the key as password (any user name): what clients that only take a
      // URL send for http://user:KEY@host/... (SandboxFusion clients such as verl's).
      v.remove_prefix(6);
      while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
      auto decoded = json_util::base64_decode(v);
      auto colon = decoded ? decoded->find(':') : std::string::npos;
      if (colon == std::string::npos)
        return fail(Code::kUnauthenticated,
                    "the Authorization header's Basic credentials are malformed");
      secret = decoded->substr(colon + 1);
      if (secret.empty())
        return fail(Code::kUnauthenticated, "Basic credentials carry the API key as password");
    } else {
      return fail(Code::kUnauthenticated,
                  "the Authorization header must be 'Bearer <API key>' (or Basic with the key as "
                  "password)");
    }
  } else if (auto x = req.headers.find("x-api-key"); x != req.headers.end()) {
    secret = x->second;
  }
  if (!secret.empty()) {
    auto k = find_key(secret);
    if (!k) return std::unexpected(k.error());
    c.key_id = k->id;
    c.scope = k->scope;
    if (k->scope == "admin") c.import_roots = opts_.import_roots;
    return {};
  }
  if (opts_.insecure_tcp) return {};
  if (req.method == "GET" && (req.path == "/health" || req.path == "/version")) return {};
  return fail(Code::kUnauthenticated,
              "an API key is required on TCP (Authorization: Bearer <key>; create one with "
              "`tidepoold keys create`), or use the unix socket");
}

void Auth::handle(Request& req, std::shared_ptr<Responder> res, const Handler& next) {
  if (auto r = authenticate(req); !r) {
    if (r.error().code == Code::kUnauthenticated) res->add_header("WWW-Authenticate", "Bearer");
    res->send_error(r.error());
    return;
  }
  if (req.path == "/v1/whoami") {
    if (req.method != "GET") {
      res->send_error(Error{Code::kInvalidArgument, 0, "method not allowed on /v1/whoami"});
      return;
    }
    const Caller& c = req.caller;
    json::object o;
    o["transport"] = c.unix_socket() ? "unix" : "tcp";
    if (c.unix_socket()) {
      o["uid"] = c.uid;
      o["gid"] = c.gid;
      json::array g;
      for (gid_t x : c.groups) g.emplace_back(x);
      o["groups"] = std::move(g);
    }
    o["key_id"] = c.key_id.empty() ? json::value(nullptr) : json::value(c.key_id);
    o["scope"] = c.scope.empty() ? json::value(nullptr) : json::value(c.scope);
    auto hr = host_reader(req);
    o["host_paths"] = !hr.refused.empty() ? "refused" : hr.uid ? "as_caller" : "import_roots";
    res->send_json(200, o);
    return;
  }
  next(req, std::move(res));
}

sys::HostReader host_reader(const Request& req) {
  const Caller& c = req.caller;
  if (c.unix_socket()) return sys::HostReader::peer(c.uid, c.gid, c.groups);
  if (c.scope == "admin") return sys::HostReader::under(c.import_roots);
  if (c.scope == "user")
    return sys::HostReader::refuse("naming a host path needs an admin API key");
  return sys::HostReader::refuse("naming a host path needs the unix socket or an admin API key");
}

int keys_main(int argc, char** argv) {
  CLI::App app{"tidepoold keys: manage the API keys TCP clients present", "tidepoold keys"};
  std::string data_dir = "/var/lib/tidepool";
  app.add_option("--data-dir", data_dir, "the daemon's data directory")->capture_default_str();
  app.require_subcommand(1);
  std::string scope = "user", name, id;
  auto* create = app.add_subcommand("create", "create a key and print it (shown only this once)");
  create->add_option("--scope", scope, "admin or user")
      ->capture_default_str()
      ->check(CLI::IsMember({"admin", "user"}));
  create->add_option("--name", name, "a label for the key");
  auto* list = app.add_subcommand("list", "list keys (id, scope, name, created)");
  auto* revoke =
      app.add_subcommand("revoke", "revoke a key by id; a running daemon stops accepting it");
  revoke->add_option("id", id, "key id")->required();
  for (auto* s : {create, list, revoke})
    s->add_option("--data-dir", data_dir, "the daemon's data directory");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  auto die = [](const std::string& msg) {
    std::cerr << "tidepoold keys: " << msg << "\n";
    return 1;
  };
  std::error_code ec;
  std::filesystem::create_directories(data_dir, ec);
  if (ec) return die("cannot create data dir " + data_dir + ": " + ec.message());
  KeyFile f(KeyFile::in_data_dir(data_dir));
  if (create->parsed()) {
    auto r = f.create(scope, name);
    if (!r) return die(r.error().message());
    std::cerr << "created key " << r->first.id << " (scope " << scope
              << "); it is shown only once:\n";
    std::cout << r->second << std::endl;
    return 0;
  }
  if (list->parsed()) {
    auto keys = f.load();
    if (!keys) return die(keys.error().message());
    std::printf("%-12s %-6s %-25s %s\n", "ID", "SCOPE", "CREATED", "NAME");
    for (const auto& k : *keys)
      std::printf("%-12s %-6s %-25s %s\n", k.id.c_str(), k.scope.c_str(),
                  json_util::rfc3339(k.created_ms).c_str(), k.name.c_str());
    return 0;
  }
  auto r = f.revoke(id);
  if (!r) return die(r.error().message());
  std::cout << "revoked " << r->id << "\n";
  return 0;
}

}  // namespace tp::api
