// tidepool cp: copy one file between this host and a sandbox, binary-safe.
//   tidepool cp LOCAL ID:/path      upload ('-' as LOCAL reads stdin)
//   tidepool cp ID:/path LOCAL      download (written to a temporary file, then renamed)
//   tidepool cp ID:/path -          download to stdout
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <optional>

#include "cli/commands.h"
#include "cli/parse.h"

namespace tp::cli {
namespace {

struct RemotePath {
  std::string id;
  std::string path;
};

// "ID:/path" is remote when the part before the first ':' is non-empty and has no '/';
// so a local name with a colon can always be written as "./a:b".
std::optional<RemotePath> parse_remote(const std::string& s) {
  size_t colon = s.find(':');
  if (colon == std::string::npos || colon == 0) return std::nullopt;
  if (s.substr(0, colon).find('/') != std::string::npos) return std::nullopt;
  return RemotePath{s.substr(0, colon), s.substr(colon + 1)};
}

// Last path component, ignoring trailing slashes ("" for "/").
std::string base_name(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

std::string files_target(const RemotePath& r, const std::string& extra_query = "") {
  return sandbox_path(r.id) + "/files?path=" + url_encode(r.path) + extra_query;
}

int upload(Context& ctx, const std::string& local, RemotePath remote) {
  std::string data;
  unsigned mode = 0644;
  if (local == "-") {
    auto in = read_all(STDIN_FILENO, "stdin");
    if (!in) return report(in.error());
    data = std::move(*in);
  } else {
    int fd = ::open(local.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return report(sys_fail("open " + local).error());
    struct stat st {};
    if (::fstat(fd, &st) == 0) {
      if (S_ISDIR(st.st_mode)) {
        ::close(fd);
        return report(
            Error{Code::kInvalidArgument, 0, local + " is a directory (cp copies one file)"});
      }
      mode = st.st_mode & 0777;
    }
    auto in = read_all(fd, local);
    ::close(fd);
    if (!in) return report(in.error());
    data = std::move(*in);
  }
  // "ID:/dir/" means "into /dir", keeping the local name.
  if (!remote.path.empty() && remote.path.back() == '/' && local != "-")
    remote.path += base_name(local);
  char mode_text[8];
  std::snprintf(mode_text, sizeof mode_text, "%o", mode);
  auto client = ctx.client();
  if (!client) return report(client.error());
  auto r = (*client)->request(Method::kPut, files_target(remote, std::string("&mode=") + mode_text),
                              data, "application/octet-stream");
  if (!r) return report(r.error());
  return kExitOk;
}

int download(Context& ctx, const RemotePath& remote, std::string local) {
  auto client = ctx.client();
  if (!client) return report(client.error());
  if (local == "-") {
    bool broken = false;
    auto r = (*client)->stream(Method::kGet, files_target(remote), {}, {}, nullptr,
                               [&](std::string_view piece) -> Result<void> {
                                 if (!broken && !write_all(STDOUT_FILENO, piece)) broken = true;
                                 return {};
                               });
    if (!r) return report(r.error());
    return kExitOk;
  }
  struct stat st {};
  if (::stat(local.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    std::string name = base_name(remote.path);
    if (name.empty()) return report(Error{Code::kInvalidArgument, 0, "remote path names no file"});
    local += "/" + name;
  }
  // Write next to the target and rename at the end: a failed copy leaves no partial file.
  std::string tmp = local + ".tidepool-XXXXXX";
  int fd = -1;
  auto r = (*client)->stream(
      Method::kGet, files_target(remote), {}, {},
      [&](int, std::string_view) -> Result<void> {
        fd = ::mkstemp(tmp.data());
        if (fd < 0) return sys_fail("create " + local);
        return {};
      },
      [&](std::string_view piece) -> Result<void> {
        if (!write_all(fd, piece)) return sys_fail("write " + local);
        return {};
      });
  if (fd >= 0) {
    bool ok = r.has_value();
    if (ok && ::fchmod(fd, 0644) != 0) ok = false;
    if (::close(fd) != 0 && ok) r = sys_fail("write " + local);
    if (r && ::rename(tmp.c_str(), local.c_str()) != 0) r = sys_fail("rename to " + local);
    if (!r) ::unlink(tmp.c_str());
  }
  if (!r) return report(r.error());
  return kExitOk;
}

}  // namespace

Action add_cp(CLI::App& root, Context& ctx) {
  struct State {
    std::string src;
    std::string dst;
  };
  auto st = std::make_shared<State>();
  CLI::App* sub = root.add_subcommand(
      "cp", "Copy a file: cp LOCAL ID:/path (upload; '-' = stdin), cp ID:/path LOCAL|- (download)");
  sub->add_option("src", st->src, "source: local path, '-' or ID:/path")->required();
  sub->add_option("dst", st->dst, "destination: ID:/path, local path or '-'")->required();
  return [st, &ctx]() -> int {
    auto rs = parse_remote(st->src);
    auto rd = parse_remote(st->dst);
    if (rs && rd) return usage_error("copying between two sandboxes is not supported");
    if (!rs && !rd) return usage_error("one of SRC and DST must be ID:/path");
    const RemotePath& r = rs ? *rs : *rd;
    if (r.path.empty() || r.path.front() != '/') {
      return usage_error("sandbox path must be absolute: " + r.id + ":" + r.path);
    }
    return rd ? upload(ctx, st->src, *rd) : download(ctx, *rs, st->dst);
  };
}

}  // namespace tp::cli
