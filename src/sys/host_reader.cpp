#include "sys/host_reader.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>

extern char** environ;

namespace tp::sys {
namespace {

// What the child runs before its command when it reads as a client: that
// client's ids, no capabilities at all, and no way to regain any.
std::vector<std::string> as_reader(const HostReader& who) {
  std::vector<std::string> a = {"setpriv", "--reuid=" + std::to_string(*who.uid),
                                "--regid=" + std::to_string(who.gid)};
  if (who.groups.empty()) {
    a.push_back("--clear-groups");
  } else {
    std::string g = "--groups=";
    for (size_t i = 0; i < who.groups.size(); ++i)
      g += (i ? "," : "") + std::to_string(who.groups[i]);
    a.push_back(g);
  }
  for (const char* s : {"--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"})
    a.emplace_back(s);
  return a;
}

Result<HostRead> spawn_reader(const HostReader& who, std::vector<std::string> argv,
                              const std::string& what) {
  // A root peer reads as root: it could read the path itself, and dropping
  // its capabilities would refuse it files it owns no more than it can read.
  if (who.uid && *who.uid != 0) {
    auto pre = as_reader(who);
    argv.insert(argv.begin(), pre.begin(), pre.end());
  }
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return sys_fail("pipe2");
  UniqueFd out_r(out[0]), out_w(out[1]);
  // stderr goes to a file, not a pipe: nobody reads it while stdout is being
  // consumed, and a reader with many errors must not block on a full pipe.
  UniqueFd err_r(::memfd_create("host-reader-stderr", MFD_CLOEXEC));
  if (!err_r) return sys_fail("memfd_create");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out_w.get(), 1);
  posix_spawn_file_actions_adddup2(&fa, err_r.get(), 2);
  // The child runs with the client's ids: it must hold none of the daemon's
  // descriptors (another client's connection, the state database), whatever
  // their close-on-exec flag says.
  posix_spawn_file_actions_addclosefrom_np(&fa, 3);
  posix_spawnattr_t at;
  posix_spawnattr_init(&at);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&at, &none);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK);
  std::vector<char*> av;
  for (auto& s : argv) av.push_back(s.data());
  av.push_back(nullptr);
  const char* env[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C", nullptr};
  pid_t pid = -1;
  int rc = ::posix_spawnp(&pid, av[0], &fa, &at, av.data(), const_cast<char**>(env));
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  if (rc != 0) return sys_fail("posix_spawnp(" + argv[0] + ")", rc);
  return HostRead(pid, std::move(out_r), std::move(err_r), what);
}

}  // namespace

HostRead::HostRead(HostRead&& o) noexcept
    : pid_(std::exchange(o.pid_, -1)),
      out_(std::move(o.out_)),
      err_(std::move(o.err_)),
      what_(std::move(o.what_)) {}

HostRead& HostRead::operator=(HostRead&& o) noexcept {
  if (this != &o) {
    this->~HostRead();
    new (this) HostRead(std::move(o));
  }
  return *this;
}

HostRead::~HostRead() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int st;
  while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
  }
}

Result<void> HostRead::finish() {
  if (pid_ <= 0) return fail(Code::kInternal, "host reader of " + what_ + " already finished");
  out_.reset();  // a child still writing gets EPIPE instead of blocking
  int st = 0;
  while (::waitpid(pid_, &st, 0) < 0) {
    if (errno != EINTR) return sys_fail("waitpid(host reader)");
  }
  pid_ = -1;
  // The first lines of its stderr (a file the child wrote to; read from the start).
  std::string msg;
  char buf[512];
  ssize_t n;
  off_t off = 0;
  while (err_ && msg.size() < 2048 && (n = ::pread(err_.get(), buf, sizeof buf, off)) != 0) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    msg.append(buf, static_cast<size_t>(n));
    off += n;
  }
  err_.reset();
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return {};
  while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
  Code code = Code::kInvalidArgument;
  if (msg.find("Permission denied") != std::string::npos)
    code = Code::kPermissionDenied;
  else if (msg.find("No such file") != std::string::npos)
    code = Code::kNotFound;
  return fail(code, "cannot read host path " + what_ + (msg.empty() ? "" : ": " + msg));
}

Result<std::string> check_host_path(const HostReader& who, const std::string& path) {
  if (path.empty() || path[0] != '/' || path.find('\0') != std::string::npos)
    return fail(Code::kInvalidArgument, "host path must be absolute: " + path);
  if (!who.refused.empty())
    return fail(Code::kPermissionDenied, "host path " + path + " refused: " + who.refused);
  if (who.uid) return path;
  char real[PATH_MAX];
  if (!::realpath(path.c_str(), real)) {
    if (errno == ENOENT || errno == ENOTDIR)
      return fail(Code::kNotFound, "host path " + path + " not found");
    return sys_fail("realpath(" + path + ")");
  }
  std::string canon = real;
  for (const auto& root : who.roots) {
    if (canon == root || (canon.starts_with(root) && (root == "/" || canon[root.size()] == '/')))
      return canon;
  }
  return fail(Code::kPermissionDenied, "host path " + path + " is not under an import root");
}

Result<HostRead> read_host_tar(const HostReader& who, const std::string& path) {
  auto p = check_host_path(who, path);
  if (!p) return std::unexpected(p.error());
  // The child decides file or directory itself: the daemon does not even stat
  // a path on the client's behalf.
  return spawn_reader(who,
                      {"sh", "-c",
                       "if [ -d \"$1\" ]; then exec tar --format=posix --numeric-owner "
                       "--one-file-system -c -f - -C \"$1\" .; "
                       "else exec tar --format=posix --numeric-owner --one-file-system -c -f - -C "
                       "\"$(dirname -- \"$1\")\" -- "
                       "\"./$(basename -- \"$1\")\"; fi",
                       "sh", *p},
                      *p);
}

Result<HostRead> read_host_file(const HostReader& who, const std::string& path) {
  auto p = check_host_path(who, path);
  if (!p) return std::unexpected(p.error());
  return spawn_reader(
      who,
      // A path it cannot even stat is left to cat, whose error says why
      // (permission denied, not found); a FIFO or device is never opened.
      {"sh", "-c",
       "if [ -e \"$1\" ] && [ ! -f \"$1\" ]; then echo \"$1: not a regular file\" >&2; exit 3; fi; "
       "exec cat -- \"$1\"",
       "sh", *p},
      *p);
}

}  // namespace tp::sys
