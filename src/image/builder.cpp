#include "image/builder.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/json.hpp>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/ids.h"
#include "common/json_util.h"
#include "common/log.h"

extern char** environ;

namespace tp::image {
namespace {

namespace json = boost::json;

bool safe_token(const std::string& s) {
  if (s.empty() || s.size() > 200) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '+' || c == '_' || c == ':' ||
          c == '=' || c == '~'))
      return false;
  return true;
}

std::string sh_quote(const std::string& s) {
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return o + "'";
}

std::string sha256_hex(const std::string& s) {
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  EVP_Digest(s.data(), s.size(), d, &len, EVP_sha256(), nullptr);
  static const char* hex = "0123456789abcdef";
  std::string h;
  for (unsigned i = 0; i < len; ++i) {
    h += hex[d[i] >> 4];
    h += hex[d[i] & 15];
  }
  return h;
}

std::string tail_of(const std::string& path, size_t n) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  return s.size() > n ? s.substr(s.size() - n) : s;
}

}  // namespace

Result<BuildSpec> parse_build_spec(const std::string& text) {
  auto o = json_util::parse_object(text);
  if (!o) return std::unexpected(o.error());
  TP_TRY(json_util::only_keys(*o, {"name", "version", "suite", "variant", "mirror", "packages", "files", "run", "env",
                                   "workdir", "user", "cmd"}));
  BuildSpec s;
  auto str = [&](const char* k, std::string* out) -> Result<void> {
    auto v = json_util::get_string(*o, k, *out);
    if (!v) return std::unexpected(v.error());
    *out = *v;
    return {};
  };
  TP_TRY(str("name", &s.name));
  TP_TRY(str("version", &s.version));
  TP_TRY(str("suite", &s.suite));
  TP_TRY(str("variant", &s.variant));
  TP_TRY(str("mirror", &s.mirror));
  TP_TRY(str("workdir", &s.defaults.workdir));
  TP_TRY(str("user", &s.defaults.user));
  if (!valid_image_name(s.name)) return fail(Code::kInvalidArgument, "field 'name': invalid image name '" + s.name + "'");
  if (!s.version.empty() && !valid_image_version(s.version))
    return fail(Code::kInvalidArgument, "field 'version': invalid version '" + s.version + "'");
  if (!safe_token(s.suite)) return fail(Code::kInvalidArgument, "field 'suite': invalid suite");
  if (!safe_token(s.variant)) return fail(Code::kInvalidArgument, "field 'variant': invalid variant");
  if (s.mirror.rfind("http://", 0) != 0 && s.mirror.rfind("https://", 0) != 0 && s.mirror.rfind("file://", 0) != 0)
    return fail(Code::kInvalidArgument, "field 'mirror' must be an http(s):// or file:// URL");
  if (s.mirror.find_first_of(" \t\n'\"") != std::string::npos)
    return fail(Code::kInvalidArgument, "field 'mirror' must not contain spaces or quotes");
  auto arr = [&](const char* k) { return json_util::get_string_list(*o, k); };
  auto pk = arr("packages");
  if (!pk) return std::unexpected(pk.error());
  for (const auto& p : *pk)
    if (!safe_token(p)) return fail(Code::kInvalidArgument, "field 'packages': invalid package '" + p + "'");
  s.packages = *pk;
  auto run = arr("run");
  if (!run) return std::unexpected(run.error());
  s.run = *run;
  auto cmd = arr("cmd");
  if (!cmd) return std::unexpected(cmd.error());
  s.defaults.cmd = *cmd;
  auto env = json_util::get_string_map(*o, "env");
  if (!env) return std::unexpected(env.error());
  s.defaults.env = *env;
  if (auto* f = o->if_contains("files"); f && !f->is_null()) {
    if (!f->is_array()) return fail(Code::kInvalidArgument, "field 'files' must be a list of {src, dst}");
    for (const auto& x : f->as_array()) {
      if (!x.is_object()) return fail(Code::kInvalidArgument, "field 'files' must be a list of {src, dst}");
      auto src = json_util::get_string(x.as_object(), "src", "");
      auto dst = json_util::get_string(x.as_object(), "dst", "");
      if (!src || !dst || src->empty() || (*src)[0] != '/' || dst->empty() || (*dst)[0] != '/' ||
          dst->find("..") != std::string::npos)
        return fail(Code::kInvalidArgument, "field 'files': src and dst must be absolute paths (dst without '..')");
      s.files.emplace_back(*src, *dst);
    }
  }
  return s;
}

Result<std::string> build_cache_key(const BuildSpec& s) {
  json::object k;
  k["suite"] = s.suite;
  k["variant"] = s.variant;
  k["mirror"] = s.mirror;
  json::array p;
  for (const auto& x : s.packages) p.emplace_back(x);
  k["packages"] = std::move(p);
  json::array f;
  for (const auto& [src, dst] : s.files) {
    struct stat st {};
    if (::stat(src.c_str(), &st) != 0) return sys_fail("stat(" + src + ")");
    f.emplace_back(json::array{json::value(src), json::value(dst), json::value(static_cast<int64_t>(st.st_size)),
                               json::value(static_cast<int64_t>(st.st_mtim.tv_sec)),
                               json::value(static_cast<int64_t>(st.st_mtim.tv_nsec))});
  }
  k["files"] = std::move(f);
  json::array r;
  for (const auto& x : s.run) r.emplace_back(x);
  k["run"] = std::move(r);
  return sha256_hex(json::serialize(k));
}

std::vector<std::string> mmdebstrap_argv(const BuildSpec& s, const std::string& out_tar) {
  std::vector<std::string> a = {"mmdebstrap", "--mode=root", "--variant=" + s.variant, "--format=tar", "--quiet",
                                "--skip=output/dev"};  // no device nodes: /dev is the runtime's
  if (!s.packages.empty()) {
    std::string inc = "--include=";
    for (size_t i = 0; i < s.packages.size(); ++i) inc += (i ? "," : "") + s.packages[i];
    a.push_back(inc);
  }
  for (const auto& [src, dst] : s.files) {
    a.push_back("--customize-hook=mkdir -p \"$1\"" + sh_quote(dst));
    a.push_back("--customize-hook=copy-in " + sh_quote(src) + " " + sh_quote(dst));
  }
  for (const auto& cmd : s.run)
    a.push_back("--customize-hook=unshare --fork --pid --mount --net --ipc --uts chroot \"$1\" /usr/bin/env -i "
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root /bin/sh -c " +
                sh_quote(cmd));
  a.push_back(s.suite);
  a.push_back(out_tar);
  a.push_back(s.mirror);
  return a;
}

Result<BuildResult> build_image(ImageStore& store, const BuildSpec& s, int timeout_s) {
  auto key = build_cache_key(s);
  if (!key) return std::unexpected(key.error());
  std::string cache_dir = store.root() + "/build-cache";
  if (::mkdir(cache_dir.c_str(), 0700) != 0 && errno != EEXIST) return sys_fail("mkdir(" + cache_dir + ")");
  std::string cache_file = cache_dir + "/" + *key;
  BuildResult out;
  std::vector<std::shared_ptr<void>> pins;
  std::string digest;
  {
    std::ifstream in(cache_file);
    std::string d;
    if (in >> d && valid_layer_digest(d) && store.layer(d)) {
      // A known digest is pinned without reading the (empty) source.
      auto li = store.add_layer_stream([](void*, size_t) -> ssize_t { return 0; }, d, "", &pins);
      if (li && li->digest == d) {
        digest = d;
        out.cached = true;
      }
    }
  }
  if (digest.empty()) {
    pins.clear();
    std::string tag = ids::random_hex(8);
    std::string tar = store.root() + "/tmp/build-" + tag + ".tar";
    std::string log = store.root() + "/tmp/build-" + tag + ".log";
    struct Cleanup {
      std::string a, b;
      ~Cleanup() {
        ::unlink(a.c_str());
        ::unlink(b.c_str());
      }
    } cleanup{tar, log};
    auto argv = mmdebstrap_argv(s, tar);
    std::vector<char*> av;
    for (auto& x : argv) av.push_back(x.data());
    av.push_back(nullptr);
    std::string tmpdir = "TMPDIR=" + store.root() + "/tmp";
    std::vector<std::string> envs = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", tmpdir,
                                     "LC_ALL=C.UTF-8", "HOME=/root"};
    std::vector<char*> ev;
    for (auto& x : envs) ev.push_back(x.data());
    ev.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    posix_spawnattr_t at;
    posix_spawnattr_init(&at);
    // Its own process group, so a timeout kills mmdebstrap's children too.
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
    posix_spawnattr_setpgroup(&at, 0);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&at, &none);
    pid_t pid = -1;
    int rc = posix_spawnp(&pid, "mmdebstrap", &fa, &at, av.data(), ev.data());
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    if (rc != 0) return sys_fail("posix_spawnp(mmdebstrap)", rc);
    spdlog::info("image build {}: mmdebstrap pid {} ({} {} +{} packages)", s.name, pid, s.suite, s.variant,
                 s.packages.size());
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    int status = 0;
    for (;;) {
      pid_t w = ::waitpid(pid, &status, WNOHANG);
      if (w == pid) break;
      if (w < 0 && errno != EINTR) return sys_fail("waitpid(mmdebstrap)");
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(-pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        return fail(Code::kDeadlineExceeded, "mmdebstrap took longer than " + std::to_string(timeout_s) + " s");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    out.log_tail = tail_of(log, 4000);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      return fail(Code::kInvalidArgument, "mmdebstrap failed (status " + std::to_string(status) + "):\n" + out.log_tail);
    auto li = store.add_layer_file(tar, "mmdebstrap:" + s.suite + "/" + s.variant, &pins);
    if (!li) return std::unexpected(li.error());
    digest = li->digest;
    std::ofstream(cache_file) << digest << "\n";
  }
  ImageRecord rec;
  rec.name = s.name;
  rec.version = s.version.empty() ? store.next_version(s.name) : s.version;
  rec.parts = {digest};
  rec.defaults = s.defaults;
  rec.source = "build:mmdebstrap:" + s.suite;
  auto r = store.put_image(rec);
  if (!r) return std::unexpected(r.error());
  out.image = *r;
  return out;
}

}  // namespace tp::image
