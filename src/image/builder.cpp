#include "image/builder.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/filter.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include "common/ids.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/sha256.h"
#include "image/layer_unpack.h"
#include "sys/fd.h"
#include "sys/seccomp.h"

namespace tp::image {
namespace {

namespace json = boost::json;

bool safe_token(const std::string& s) {
  if (s.empty() || s.size() > 200) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '+' ||
          c == '_' || c == ':' || c == '=' || c == '~'))
      return false;
  return true;
}

std::string sh_quote(const std::string& s) {
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return o + "'";
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
  TP_TRY(json_util::only_keys(*o, {"name", "version", "suite", "variant", "mirror", "packages",
                                   "files", "run", "env", "workdir", "user", "cmd"}));
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
  if (!valid_image_name(s.name))
    return fail(Code::kInvalidArgument, "field 'name': invalid image name '" + s.name + "'");
  if (!s.version.empty() && !valid_image_version(s.version))
    return fail(Code::kInvalidArgument, "field 'version': invalid version '" + s.version + "'");
  if (!safe_token(s.suite)) return fail(Code::kInvalidArgument, "field 'suite': invalid suite");
  if (!safe_token(s.variant))
    return fail(Code::kInvalidArgument, "field 'variant': invalid variant");
  if (s.mirror.rfind("http://", 0) != 0 && s.mirror.rfind("https://", 0) != 0 &&
      s.mirror.rfind("file://", 0) != 0)
    return fail(Code::kInvalidArgument, "field 'mirror' must be an http(s):// or file:// URL");
  if (s.mirror.find_first_of(" \t\n'\"") != std::string::npos)
    return fail(Code::kInvalidArgument, "field 'mirror' must not contain spaces or quotes");
  auto arr = [&](const char* k) { return json_util::get_string_list(*o, k); };
  auto pk = arr("packages");
  if (!pk) return std::unexpected(pk.error());
  for (const auto& p : *pk)
    if (!safe_token(p))
      return fail(Code::kInvalidArgument, "field 'packages': invalid package '" + p + "'");
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
    if (!f->is_array())
      return fail(Code::kInvalidArgument, "field 'files' must be a list of {src, dst}");
    for (const auto& x : f->as_array()) {
      if (!x.is_object())
        return fail(Code::kInvalidArgument, "field 'files' must be a list of {src, dst}");
      auto src = json_util::get_string(x.as_object(), "src", "");
      auto dst = json_util::get_string(x.as_object(), "dst", "");
      if (!src || !dst || src->empty() || (*src)[0] != '/' || dst->empty() || (*dst)[0] != '/' ||
          dst->find("..") != std::string::npos)
        return fail(Code::kInvalidArgument,
                    "field 'files': src and dst must be absolute paths (dst without '..')");
      s.files.emplace_back(*src, *dst);
    }
  }
  return s;
}

namespace {

// What a `run` step executes (with perl -e), already in new pid, mount, net,
// ipc and uts namespaces made by unshare(1): a /proc of its own pid namespace
// replaces mmdebstrap's (which would show mmdebstrap's processes and, through
// /proc/PID/root, its view), then pivot_root into the new root and detach
// everything else, so neither chroot tricks nor /proc lead outside the root.
constexpr const char* kRunStepPerl = R"PERL(use strict; use warnings;
require "syscall.ph";
my ($root, $cmd) = @ARGV;
my ($NOSUID, $NODEV, $NOEXEC, $BIND, $REC, $PRIVATE, $DETACH) = (2, 4, 8, 4096, 16384, 262144, 2);
sub call { my ($what, $nr, @args) = @_; syscall($nr, @args) == 0 or die "tp run step: $what: $!\n"; }
call("make mounts private", &SYS_mount, "none", "/", 0, $REC | $PRIVATE, 0);
my $proc = "$root/proc";
syscall(&SYS_umount2, $proc, $DETACH) == 0 or $!{EINVAL} or die "tp run step: umount proc: $!\n";
call("mount proc", &SYS_mount, "proc", "$root/proc", "proc", $NOSUID | $NODEV | $NOEXEC, 0);
call("bind the root", &SYS_mount, $root, $root, 0, $BIND | $REC, 0);
chdir $root or die "tp run step: chdir: $!\n";
call("pivot_root", &SYS_pivot_root, ".", ".");
call("detach the old root", &SYS_umount2, ".", $DETACH);
chdir "/" or die "tp run step: chdir /: $!\n";
exec { "/usr/bin/env" } "env", "-i", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
  "HOME=/root", "/bin/sh", "-c", $cmd;
die "tp run step: exec /usr/bin/env: $!\n";
)PERL";

constexpr const char* kPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

// The basename copy-in gives a staged file or tree: that of src without
// trailing slashes.
Result<std::string> staged_name(const std::string& src) {
  std::string p = src;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  std::string n = p.substr(p.rfind('/') + 1);
  if (n.empty() || n == "." || n == "..")
    return fail(Code::kInvalidArgument,
                "field 'files': src " + src + " names no file or directory");
  return n;
}

// Whether a tar from read_host_tar holds a directory (its first member is the
// directory itself, "./") rather than one file ("./NAME").
Result<bool> tar_is_directory(const std::string& tar) {
  std::unique_ptr<archive, int (*)(archive*)> a(archive_read_new(), archive_read_free);
  archive_read_support_format_tar(a.get());
  if (archive_read_open_filename(a.get(), tar.c_str(), 1 << 16) != ARCHIVE_OK)
    return fail(Code::kInternal,
                std::string("reading staged files: ") + archive_error_string(a.get()));
  archive_entry* e = nullptr;
  int r = archive_read_next_header(a.get(), &e);
  if (r == ARCHIVE_EOF)
    return fail(Code::kInvalidArgument, "field 'files': an empty archive was read");
  if (r != ARCHIVE_OK && r != ARCHIVE_WARN)
    return fail(Code::kInternal,
                std::string("reading staged files: ") + archive_error_string(a.get()));
  std::string n = archive_entry_pathname(e) ? archive_entry_pathname(e) : "";
  return n == "." || n == "./";
}

// Gives every entry under `dir` to the build's root and digests the tree in
// name order: relative path, type, permission bits, link target, bytes.
Result<std::string> own_and_digest(const std::string& dir, const std::string& src) {
  namespace fs = std::filesystem;
  std::vector<std::string> rels = {""};
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, fs::directory_options::none, ec), end;
       !ec && it != end; it.increment(ec))
    rels.push_back(fs::relative(it->path(), dir).string());
  if (ec) return fail(Code::kInternal, "walking staged files of " + src + ": " + ec.message());
  std::sort(rels.begin(), rels.end());
  Sha256 md;
  auto put = [&](const std::string& x) { md.update(x.data(), x.size() + 1); };  // with the NUL
  for (const auto& rel : rels) {
    std::string p = rel.empty() ? dir : dir + "/" + rel;
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0) return sys_fail("lstat(" + p + ")");
    if (::lchown(p.c_str(), kBuildIdBase, kBuildIdBase) != 0) return sys_fail("lchown(" + p + ")");
    put(rel);
    put(std::to_string(st.st_mode & 07777));
    if (S_ISDIR(st.st_mode)) {
      put("d");
    } else if (S_ISLNK(st.st_mode)) {
      char t[4096];
      ssize_t n = ::readlink(p.c_str(), t, sizeof t);
      if (n < 0) return sys_fail("readlink(" + p + ")");
      put("l");
      put(std::string(t, static_cast<size_t>(n)));
    } else if (S_ISREG(st.st_mode)) {
      put("f");
      sys::UniqueFd fd(::open(p.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
      if (!fd) return sys_fail("open(" + p + ")");
      char buf[1 << 16];
      ssize_t n;
      while ((n = ::read(fd.get(), buf, sizeof buf)) != 0) {
        if (n < 0) {
          if (errno == EINTR) continue;
          return sys_fail("read(" + p + ")");
        }
        md.update(buf, static_cast<size_t>(n));
      }
    } else {
      // Whiteouts: unpack_layer turns ".wh.NAME" members into 0/0 devices.
      return fail(Code::kInvalidArgument,
                  "field 'files': " + src + " holds " + rel +
                      ", which cannot be copied into an image (.wh. names)");
    }
  }
  std::string h = md.hex_digest();
  if (h.empty()) return fail(Code::kInternal, "sha256 of the staged files of " + src + " failed");
  return h;
}

Result<void> make_build_dir(const std::string& p) {
  if (::mkdir(p.c_str(), 0700) != 0) return sys_fail("mkdir(" + p + ")");
  if (::chown(p.c_str(), kBuildIdBase, kBuildIdBase) != 0) return sys_fail("chown(" + p + ")");
  return {};
}

// The mount namespace the build sees, prepared before fork so that the
// children only make system calls on ready strings.
struct Jail {
  struct Bind {
    std::string src, dst;
    unsigned long flags;  // MS_RDONLY / MS_NOSUID / MS_NODEV / MS_NOEXEC for the bind mount
    bool recursive;
  };
  std::string view;                // host path the view's tmpfs is mounted on
  std::vector<std::string> dirs;   // to create in the view, in order
  std::vector<std::string> files;  // empty files to bind device nodes on
  std::vector<std::pair<std::string, std::string>> links;  // target, path
  std::vector<Bind> binds;
  std::string proc;  // where the view's /proc is mounted
};

void add_dirs_to(Jail& j, const std::string& abs) {
  std::string cur = j.view;
  size_t i = 1;
  while (i <= abs.size()) {
    size_t k = abs.find('/', i);
    if (k == std::string::npos) k = abs.size();
    if (k > i) {
      cur += "/" + abs.substr(i, k - i);
      if (std::find(j.dirs.begin(), j.dirs.end(), cur) == j.dirs.end()) j.dirs.push_back(cur);
    }
    i = k + 1;
  }
}

Jail make_jail(const std::string& view, const std::string& build_dir,
               const std::string& mirror_dir) {
  Jail j;
  j.view = view;
  constexpr unsigned long kRo = MS_RDONLY | MS_NOSUID | MS_NODEV;
  for (const char* d : {"/usr", "/etc"}) {
    add_dirs_to(j, d);
    j.binds.push_back({d, view + d, kRo, true});
  }
  // /bin, /lib, ...: symlinks into /usr on merged-/usr hosts, read-only binds otherwise.
  for (const char* d : {"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}) {
    struct stat st {};
    if (::lstat(d, &st) != 0) continue;
    if (S_ISLNK(st.st_mode)) {
      char t[4096];
      ssize_t n = ::readlink(d, t, sizeof t - 1);
      if (n > 0) j.links.emplace_back(std::string(t, static_cast<size_t>(n)), view + d);
    } else if (S_ISDIR(st.st_mode)) {
      add_dirs_to(j, d);
      j.binds.push_back({d, view + d, kRo, true});
    }
  }
  add_dirs_to(j, "/dev/pts");
  for (const char* n : {"null", "zero", "full", "random", "urandom", "tty"}) {
    std::string d = std::string("/dev/") + n;
    j.files.push_back(view + d);
    j.binds.push_back({d, view + d, MS_RDONLY | MS_NOSUID, false});
  }
  add_dirs_to(j, "/proc");
  j.proc = view + "/proc";
  add_dirs_to(j, "/sys");
  j.binds.push_back({"/sys", view + "/sys", kRo | MS_NOEXEC, false});
  add_dirs_to(j, "/tmp");
  add_dirs_to(j, "/run");
  add_dirs_to(j, "/var/tmp");
  add_dirs_to(j, build_dir);
  j.binds.push_back({build_dir, view + build_dir, MS_NOSUID | MS_NODEV, false});
  if (!mirror_dir.empty()) {
    add_dirs_to(j, mirror_dir);
    j.binds.push_back({mirror_dir, view + mirror_dir, kRo, true});
  }
  return j;
}

// After fork: report a failed step on stderr (the build log) and exit.
[[noreturn]] void die(const char* what, int err) {
  char num[16];
  int i = sizeof num;
  num[--i] = '\n';
  unsigned e = static_cast<unsigned>(err);
  do num[--i] = static_cast<char>('0' + e % 10);
  while ((e /= 10) && i > 0);
  const char* pre = "tidepool build jail: ";
  (void)!::write(2, pre, strlen(pre));
  (void)!::write(2, what, strlen(what));
  (void)!::write(2, " failed: errno ", 15);
  (void)!::write(2, num + i, sizeof num - static_cast<size_t>(i));
  ::_exit(125);
}

struct MountAttr {
  uint64_t attr_set, attr_clr, propagation, userns_fd;
};

// Applies read-only/nosuid/nodev/noexec to a bind mount (and, when recursive,
// to every mount below it, which only mount_setattr can do at once).
void restrict_bind(const Jail::Bind& b) {
  if (b.recursive) {
    MountAttr a{};
    if (b.flags & MS_RDONLY) a.attr_set |= 0x1;  // MOUNT_ATTR_RDONLY
    if (b.flags & MS_NOSUID) a.attr_set |= 0x2;
    if (b.flags & MS_NODEV) a.attr_set |= 0x4;
    if (b.flags & MS_NOEXEC) a.attr_set |= 0x8;
    if (::syscall(SYS_mount_setattr, AT_FDCWD, b.dst.c_str(), 0x8000 /* AT_RECURSIVE */, &a,
                  sizeof a) == 0)
      return;
    if (errno != ENOSYS) die("mount_setattr", errno);
  }
  if (::mount(nullptr, b.dst.c_str(), nullptr, MS_REMOUNT | MS_BIND | b.flags, nullptr) != 0)
    die(b.dst.c_str(), errno);
}

// The build's pid 1 (after fork, before exec): builds the view, enters it,
// becomes root of a new user namespace once `ack` says the id maps are
// written, loads the filter and runs mmdebstrap.
[[noreturn]] void jail_child(const Jail& j, int sync_w, int ack_r,
                             const sys::SeccompProgram& filter, char* const* argv,
                             char* const* envp) {
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) die("prctl(PDEATHSIG)", errno);
  if (::unshare(CLONE_NEWNS) != 0) die("unshare(mount)", errno);
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
    die("make / private", errno);
  if (::mount("tmpfs", j.view.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m") != 0)
    die("mount view", errno);
  for (const auto& d : j.dirs)
    if (::mkdir(d.c_str(), 0755) != 0 && errno != EEXIST) die(d.c_str(), errno);
  for (const auto& f : j.files) {
    int fd = ::open(f.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) die(f.c_str(), errno);
    ::close(fd);
  }
  for (const auto& [target, path] : j.links)
    if (::symlink(target.c_str(), path.c_str()) != 0) die(path.c_str(), errno);
  for (const auto& b : j.binds) {
    if (::mount(b.src.c_str(), b.dst.c_str(), nullptr, MS_BIND | (b.recursive ? MS_REC : 0),
                nullptr) != 0)
      die(b.src.c_str(), errno);
    restrict_bind(b);
  }
  // A /proc of this pid namespace: mmdebstrap mounts its own for the new root,
  // which the kernel allows in a user namespace only if one is already visible.
  if (::mount("proc", j.proc.c_str(), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0)
    die("mount proc", errno);
  if (::mount(nullptr, j.view.c_str(), nullptr,
              MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, nullptr) != 0)
    die("remount view read-only", errno);
  if (::chdir(j.view.c_str()) != 0) die("chdir(view)", errno);
  if (::syscall(SYS_pivot_root, ".", ".") != 0) die("pivot_root", errno);
  if (::umount2(".", MNT_DETACH) != 0) die("detach host root", errno);
  if (::chdir("/") != 0) die("chdir(/)", errno);
  if (::unshare(CLONE_NEWUSER) != 0) die("unshare(user)", errno);
  char c = 'u';
  if (::write(sync_w, &c, 1) != 1) die("sync", errno);
  if (::read(ack_r, &c, 1) != 1) die("id maps", EPROTO);
  ::close(sync_w);
  ::close(ack_r);
  if (::syscall(SYS_setresgid, 0, 0, 0) != 0) die("setresgid", errno);
  if (::syscall(SYS_setgroups, 0, nullptr) != 0) die("setgroups", errno);
  if (::syscall(SYS_setresuid, 0, 0, 0) != 0) die("setresuid", errno);
  if (::syscall(SYS_close_range, 3, ~0U, 0) != 0) die("close_range", errno);
  if (long r = sys::load_filter_raw(filter); r < 0) die("seccomp", static_cast<int>(-r));
  ::execve("/usr/bin/mmdebstrap", argv, envp);
  die("execve(/usr/bin/mmdebstrap)", errno);
}

bool write_all(const char* path, const std::string& text) {
  int fd = ::open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  return ok;
}

// The first child (after fork): its own process group (a timeout kills it
// whole), stdio to the log, a new pid namespace for jail_child, whose id maps
// it writes from outside (it keeps the daemon's capabilities). Exits with
// the build's status.
[[noreturn]] void supervisor_child(const Jail& j, int null_fd, int log_fd,
                                   const sys::SeccompProgram& filter, char* const* argv,
                                   char* const* envp, const std::string& uid_map,
                                   const std::string& gid_map) {
  ::setpgid(0, 0);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int s = 1; s < NSIG; ++s) ::sigaction(s, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  if (::dup2(null_fd, 0) < 0 || ::dup2(log_fd, 1) < 0 || ::dup2(log_fd, 2) < 0) ::_exit(125);
  int sync[2], ack[2];
  if (::pipe2(sync, O_CLOEXEC) != 0 || ::pipe2(ack, O_CLOEXEC) != 0) die("pipe2", errno);
  if (::unshare(CLONE_NEWPID) != 0) die("unshare(pid)", errno);
  pid_t pid = ::fork();
  if (pid < 0) die("fork", errno);
  if (pid == 0) {
    ::close(sync[0]);
    ::close(ack[1]);
    jail_child(j, sync[1], ack[0], filter, argv, envp);
  }
  ::close(sync[1]);
  ::close(ack[0]);
  char c;
  if (::read(sync[0], &c, 1) == 1) {
    char path[64];
    char num[16];
    int i = sizeof num;
    num[--i] = 0;
    unsigned v = static_cast<unsigned>(pid);
    do num[--i] = static_cast<char>('0' + v % 10);
    while ((v /= 10) && i > 0);
    std::strcpy(path, "/proc/");
    std::strcat(path, num + i);
    size_t base = strlen(path);
    std::strcpy(path + base, "/uid_map");
    bool ok = write_all(path, uid_map);
    std::strcpy(path + base, "/gid_map");
    ok = ok && write_all(path, gid_map);
    if (!ok) {
      int e = errno;
      ::kill(pid, SIGKILL);
      die("writing the build's id maps", e);
    }
    if (::write(ack[1], &c, 1) != 1) die("ack", errno);
  }
  ::close(ack[1]);
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) ::_exit(125);
  ::_exit(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
}

std::string mirror_dir(const std::string& mirror) {
  return mirror.rfind("file://", 0) == 0 ? mirror.substr(7) : std::string();
}

}  // namespace

Result<std::vector<std::string>> stage_build_files(const BuildSpec& s, const sys::HostReader& who,
                                                   const std::string& stage_dir) {
  std::vector<std::string> digests;
  for (size_t i = 0; i < s.files.size(); ++i) {
    const std::string& src = s.files[i].first;
    auto name = staged_name(src);
    if (!name) return std::unexpected(name.error());
    std::string slot = stage_dir + "/" + std::to_string(i);
    std::string tar = stage_dir + "/" + std::to_string(i) + ".tar";
    TP_TRY(make_build_dir(slot));
    {
      auto rd = sys::read_host_tar(who, src);
      if (!rd) return std::unexpected(rd.error());
      sys::UniqueFd out(::open(tar.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
      if (!out) return sys_fail("open(" + tar + ")");
      char buf[1 << 16];
      for (;;) {
        ssize_t n = ::read(rd->fd(), buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return sys_fail("reading host path " + src);
        if (n == 0) break;
        for (ssize_t off = 0; off < n;) {
          ssize_t w = ::write(out.get(), buf + off, static_cast<size_t>(n - off));
          if (w < 0 && errno == EINTR) continue;
          if (w < 0) return sys_fail("write(" + tar + ")");
          off += w;
        }
      }
      TP_TRY(rd->finish());
    }
    auto is_dir = tar_is_directory(tar);
    if (!is_dir) return std::unexpected(is_dir.error());
    // A directory becomes slot/NAME; a single file's member is already "./NAME".
    std::string into = *is_dir ? slot + "/" + *name : slot;
    if (*is_dir) TP_TRY(make_build_dir(into));
    sys::UniqueFd dfd(::open(into.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!dfd) return sys_fail("open(" + into + ")");
    UnpackLimits lim;
    lim.uid_base = kBuildIdBase;
    lim.id_count =
        UINT32_MAX - kBuildIdBase;  // any owner: everything is given to the build's root below
    lim.refuse_setuid = true;
    auto st = unpack_layer_file(tar, dfd.get(), lim);
    ::unlink(tar.c_str());
    if (!st) {
      Error e = st.error();
      return fail(e.code == Code::kInternal ? Code::kInternal : e.code,
                  "field 'files': staging " + src + ": " + e.message());
    }
    auto d = own_and_digest(slot, src);
    if (!d) return std::unexpected(d.error());
    digests.push_back(*d);
  }
  return digests;
}

std::string build_cache_key(const BuildSpec& s, const std::vector<std::string>& file_digests) {
  json::object k;
  k["suite"] = s.suite;
  k["variant"] = s.variant;
  k["mirror"] = s.mirror;
  json::array p;
  for (const auto& x : s.packages) p.emplace_back(x);
  k["packages"] = std::move(p);
  json::array f;
  for (size_t i = 0; i < s.files.size(); ++i) {
    auto name = staged_name(s.files[i].first);
    f.emplace_back(json::array{json::value(name ? *name : ""), json::value(s.files[i].second),
                               json::value(i < file_digests.size() ? file_digests[i] : "")});
  }
  k["files"] = std::move(f);
  json::array r;
  for (const auto& x : s.run) r.emplace_back(x);
  k["run"] = std::move(r);
  k["isolation"] = 2;  // layers built before run steps were isolated as they are now are not reused
  return sha256_hex(json::serialize(k));
}

std::vector<std::string> mmdebstrap_argv(const BuildSpec& s, const std::string& out_tar,
                                         const std::string& stage_dir) {
  std::vector<std::string> a = {
      "mmdebstrap", "--mode=unshare",   "--variant=" + s.variant, "--format=tar",
      "--quiet",    "--skip=output/dev"};  // no device nodes: /dev is the runtime's
  if (!s.packages.empty()) {
    std::string inc = "--include=";
    for (size_t i = 0; i < s.packages.size(); ++i) inc += (i ? "," : "") + s.packages[i];
    a.push_back(inc);
  }
  for (size_t i = 0; i < s.files.size(); ++i) {
    const auto& [src, dst] = s.files[i];
    auto name = staged_name(src);
    a.push_back("--customize-hook=mkdir -p \"$1\"" + sh_quote(dst));
    a.push_back("--customize-hook=copy-in " +
                sh_quote(stage_dir + "/" + std::to_string(i) + "/" + (name ? *name : "")) + " " +
                sh_quote(dst));
  }
  for (const auto& cmd : s.run)
    a.push_back(
        "--customize-hook=unshare --fork --kill-child --pid --mount --net --ipc --uts perl -e " +
        sh_quote(kRunStepPerl) + " -- \"$1\" " + sh_quote(cmd));
  a.push_back(s.suite);
  a.push_back(out_tar);
  a.push_back(s.mirror);
  return a;
}

Result<BuildResult> build_image(ImageStore& store, const BuildSpec& s,
                                const sys::HostReader& files_reader, int timeout_s) {
  std::string mdir = mirror_dir(s.mirror);
  if (!mdir.empty()) {
    // A file:// mirror is a host path the caller names; the build reads it
    // with its own unprivileged ids, so only world-readable files are usable.
    auto p = sys::check_host_path(files_reader, mdir);
    if (!p) return std::unexpected(p.error());
    mdir = *p;
  }
  std::string tmp = store.root() + "/tmp";
  std::string tag = "build-" + ids::random_hex(8);
  std::string dir = tmp + "/" + tag;  // the build's private directory, owned by its root
  std::string view = tmp + "/" + tag + ".view";
  std::string log = tmp + "/" + tag + ".log";
  // Everything of the build goes, whatever happens: the process tree is dead
  // before this runs (waited for below), so nothing writes here any more.
  struct Cleanup {
    std::string tmp, tag, view, log;
    ~Cleanup() {
      sys::UniqueFd t(::open(tmp.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      if (t) {
        auto r = remove_tree_at(t.get(), tag);
        if (!r) spdlog::warn("image build: removing {}/{}: {}", tmp, tag, r.error().message());
      }
      ::rmdir(view.c_str());
      ::unlink(log.c_str());
    }
  } cleanup{tmp, tag, view, log};
  TP_TRY(make_build_dir(dir));
  std::string stage = dir + "/stage";
  TP_TRY(make_build_dir(stage));
  auto digests = stage_build_files(s, files_reader, stage);
  if (!digests) return std::unexpected(digests.error());
  std::string key = build_cache_key(s, *digests);

  std::string cache_dir = store.root() + "/build-cache";
  if (::mkdir(cache_dir.c_str(), 0700) != 0 && errno != EEXIST)
    return sys_fail("mkdir(" + cache_dir + ")");
  std::string cache_file = cache_dir + "/" + key;
  BuildResult out;
  std::vector<std::shared_ptr<void>> pins;
  std::string digest;
  {
    std::ifstream in(cache_file);
    std::string d;
    if (in >> d && valid_layer_digest(d) && store.layer_dir(d)) {
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
    std::string out_tar = dir + "/out.tar";
    TP_TRY(make_build_dir(dir + "/tmp"));
    if (::mkdir(view.c_str(), 0700) != 0) return sys_fail("mkdir(" + view + ")");
    Jail jail = make_jail(view, dir, mdir);
    // The sandboxes' policy without its ban on the mount calls, which mmdebstrap and
    // the run steps need in the namespaces the build owns. New user namespaces stay
    // refused: the build's root would get a fresh set of capabilities.
    auto filter = sys::build_sandbox_filter({.allow_mounts = true});
    if (!filter) return std::unexpected(filter.error());
    auto argv = mmdebstrap_argv(s, out_tar, stage);
    std::vector<char*> av;
    for (auto& x : argv) av.push_back(x.data());
    av.push_back(nullptr);
    std::vector<std::string> envs = {kPath, "TMPDIR=" + dir + "/tmp", "HOME=" + dir + "/tmp",
                                     "LC_ALL=C.UTF-8"};
    std::vector<char*> ev;
    for (auto& x : envs) ev.push_back(x.data());
    ev.push_back(nullptr);
    std::string uid_map =
        "0 " + std::to_string(kBuildIdBase) + " " + std::to_string(kBuildIdCount) + "\n";
    sys::UniqueFd null_fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    sys::UniqueFd log_fd(::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!null_fd || !log_fd) return sys_fail("open(" + log + ")");
    pid_t pid = ::fork();
    if (pid < 0) return sys_fail("fork");
    if (pid == 0)
      supervisor_child(jail, null_fd.get(), log_fd.get(), **filter, av.data(), ev.data(), uid_map,
                       uid_map);
    log_fd.reset();
    spdlog::info("image build {}: pid {} ({} {} +{} packages, {} files, {} run steps)", s.name, pid,
                 s.suite, s.variant, s.packages.size(), s.files.size(), s.run.size());
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    int status = 0;
    for (;;) {
      pid_t w = ::waitpid(pid, &status, WNOHANG);
      if (w == pid) break;
      if (w < 0 && errno != EINTR) {
        ::kill(-pid, SIGKILL);
        return sys_fail("waitpid(mmdebstrap)");
      }
      if (std::chrono::steady_clock::now() > deadline) {
        // The group holds the supervisor and the build's pid 1, whose death
        // ends every process of the build's pid namespace.
        ::kill(-pid, SIGKILL);
        while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
        return fail(Code::kDeadlineExceeded,
                    "image build took longer than " + std::to_string(timeout_s) + " s");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    // Nothing of the build outlives this point: the supervisor waited for the
    // build's pid 1, whose exit ended its pid namespace.
    out.log_tail = tail_of(log, 4000);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::string why = WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                                          : "signal " + std::to_string(WTERMSIG(status));
      return fail(Code::kInvalidArgument,
                  "image build failed (mmdebstrap " + why + "):\n" + out.log_tail);
    }
    // The build's root owns `dir`: open its output without following links.
    sys::UniqueFd tfd(::open(out_tar.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    struct stat st {};
    if (!tfd || ::fstat(tfd.get(), &st) != 0 || !S_ISREG(st.st_mode))
      return fail(Code::kInternal, "image build left no tar at " + out_tar);
    auto li = store.add_layer_stream(fd_source(tfd.get()), "",
                                     "mmdebstrap:" + s.suite + "/" + s.variant, &pins);
    if (!li) return std::unexpected(li.error());
    digest = li->digest;
    std::ofstream(cache_file) << digest << "\n";
  }
  ImageRecord rec;
  rec.name = s.name;
  rec.version = s.version;  // "" = the next integer
  rec.parts = {digest};
  rec.defaults = s.defaults;
  rec.source = "build:mmdebstrap:" + s.suite;
  // An explicit version replaces the image of that name:version, as it always did.
  auto r = store.put_image(rec, PutMode::kReplace);
  if (!r) return std::unexpected(r.error());
  out.image = *r;
  return out;
}

}  // namespace tp::image
