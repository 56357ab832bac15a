#include "runtime/container/run_state.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "common/log.h"
#include "runtime/sandbox_state.h"

namespace tp::runtime::container {
namespace {

using sys::UniqueFd;

constexpr const char* kXattr = "trusted.tidepool.init";

std::string identity_text(pid_t pid, uint64_t start) {
  return "pid " + std::to_string(pid) + "\nstarttime " + std::to_string(start) + "\n";
}

bool parse_identity(const std::string& text, RunState::Found* out) {
  std::istringstream in(text);
  std::string key;
  uint64_t v;
  while (in >> key >> v) {
    if (key == "pid") out->pid = static_cast<pid_t>(v);
    if (key == "starttime") out->start = v;
  }
  return out->pid > 0 && out->start != 0;
}

bool slurp(const std::string& path, std::string* out) {
  std::ifstream f(path);
  if (!f) return false;
  std::stringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  return true;
}

bool ends_with(const std::string& s, const char* suffix, std::string* stem) {
  size_t n = std::strlen(suffix);
  if (s.size() <= n || s.compare(s.size() - n, n, suffix) != 0) return false;
  *stem = s.substr(0, s.size() - n);
  return true;
}

// Adds the ids with an entry in `dir` (either layout) to `out`.
void list_into(const std::string& dir, std::set<std::string>* out) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name, stem;
    if (name == "." || name == "..") continue;
    if (ends_with(name, ".sock", &stem) || ends_with(name, ".state", &stem) ||
        ends_with(name, ".state.tmp", &stem))
      out->insert(stem);
    else if (e->d_type == DT_DIR || e->d_type == DT_UNKNOWN)
      out->insert(name);  // the legacy layout
  }
  ::closedir(d);
}

}  // namespace

Result<UniqueFd> RunState::make_socket(const std::string& id) const {
  std::string path = socket_path(id);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  UniqueFd dir_fd;
  if (path.size() >= sizeof(sa.sun_path)) {
    // A deep run dir: bind through the directory's fd (clients do the same).
    dir_fd.reset(::open(dir_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!dir_fd) return sys_fail("open(" + dir_ + ", O_PATH)");
    path = "/proc/self/fd/" + std::to_string(dir_fd.get()) + "/" + id + ".sock";
    if (path.size() >= sizeof(sa.sun_path))
      return fail(Code::kInvalidArgument, "socket path of " + id + " is too long");
  }
  std::memcpy(sa.sun_path, path.data(), path.size());
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return sys_fail("socket(AF_UNIX) for " + path);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof(sa)) != 0) {
    if (errno != EADDRINUSE) return sys_fail("bind(" + path + ")");
    // A stale one of an earlier sandbox with this id (ids are random: rare).
    remove(id);
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof(sa)) != 0)
      return sys_fail("bind(" + path + ")");
  }
  if (::listen(fd.get(), 4) != 0) return sys_fail("listen(" + path + ")");
  return fd;
}

Result<void> RunState::record(const std::string& id, pid_t pid) const {
  uint64_t start = runtime::proc_start_time(pid);
  if (!start)
    return fail(Code::kInternal, "no start time in /proc/" + std::to_string(pid) + "/stat");
  const std::string text = identity_text(pid, start);
  const std::string sock = socket_path(id);
  if (::setxattr(sock.c_str(), kXattr, text.data(), text.size(), 0) == 0) {
    int unknown = -1;
    xattrs_.compare_exchange_strong(unknown, 1);
    return {};
  }
  if (errno != ENOTSUP && errno != EOPNOTSUPP && errno != EPERM)
    return sys_fail(std::string("setxattr(") + sock + ", " + kXattr + ")");
  xattrs_.store(0);
  // No trusted xattrs here: a file beside it, written atomically.
  const std::string state = dir_ + "/" + id + ".state", tmp = state + ".tmp";
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd) return sys_fail("open(" + tmp + ")");
  if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()))
    return sys_fail("write(" + tmp + ")");
  fd.reset();
  if (::rename(tmp.c_str(), state.c_str()) != 0) return sys_fail("rename(" + tmp + ")");
  return {};
}

Result<RunState::Found> RunState::find(const std::string& id) const {
  auto f = find_in(dir_, id);
  for (size_t i = 0; !f && f.error().code == Code::kNotFound && i < earlier_.size(); ++i) {
    auto g = find_in(earlier_[i], id);
    if (g) return g;
  }
  return f;
}

Result<RunState::Found> RunState::find_in(const std::string& dir, const std::string& id) const {
  Found f;
  const std::string sock = dir + "/" + id + ".sock";
  struct stat st {};
  if (::lstat(sock.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return fail(Code::kNotFound, sock + " is not a socket");
    f.socket = sock;
    char buf[128];
    ssize_t n = ::getxattr(sock.c_str(), kXattr, buf, sizeof buf);
    std::string text;
    if (n > 0) {
      text.assign(buf, static_cast<size_t>(n));
    } else if (!slurp(dir + "/" + id + ".state", &text)) {
      return fail(Code::kNotFound, "no init recorded for " + sock);
    }
    if (!parse_identity(text, &f)) return fail(Code::kNotFound, "malformed init record of " + sock);
    return f;
  }
  // The layout of earlier versions: a directory per sandbox.
  const std::string legacy = dir + "/" + id;
  auto saved = runtime::read_state(legacy);
  if (!saved) return fail(Code::kNotFound, "no agent socket or state file of " + id + " in " + dir);
  f.pid = saved->pid;
  f.start = saved->start;
  f.socket = legacy + "/agent.sock";
  if (::lstat(f.socket.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode))
    return fail(Code::kNotFound, "agent socket of sandbox " + id + " is missing");
  return f;
}

void RunState::remove(const std::string& id) const {
  // The usual case: this layout, in dir_, its init in the socket's xattr. Anything
  // else (a .state file, an earlier layout or directory) gets the full sweep below.
  if (::unlink(socket_path(id).c_str()) == 0 && xattrs_.load() == 1) return;
  std::vector<std::string> dirs{dir_};
  dirs.insert(dirs.end(), earlier_.begin(), earlier_.end());
  for (const auto& dir : dirs) {
    const std::string base = dir + "/" + id;
    for (const char* s : {".sock", ".state", ".state.tmp"}) (void)::unlink((base + s).c_str());
    // The legacy directory, when there is one.
    for (const char* f : {"/agent.sock", "/state", "/state.tmp"})
      (void)::unlink((base + f).c_str());
    if (::rmdir(base.c_str()) != 0 && errno != ENOENT && errno != ENOTDIR)
      spdlog::warn("rmdir({}): {}", base, std::strerror(errno));
  }
}

std::vector<std::string> RunState::ids() const {
  std::set<std::string> out;
  std::vector<std::string> dirs{dir_};
  dirs.insert(dirs.end(), earlier_.begin(), earlier_.end());
  for (const auto& dir : dirs) list_into(dir, &out);
  return {out.begin(), out.end()};
}

}  // namespace tp::runtime::container
