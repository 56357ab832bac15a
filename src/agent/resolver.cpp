#include "agent/resolver.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <deque>
#include <vector>

namespace tp::agent {
namespace {

constexpr int kMaxSymlinks = 40;  // as the kernel's MAXSYMLINKS

long sys_openat2(int dirfd, const char* path, const open_how* how) {
  return ::syscall(SYS_openat2, dirfd, path, how, sizeof(*how));
}

std::unexpected<Error> path_error(std::string_view call, std::string_view path, int e) {
  return sys_fail(std::string(call) + " " + std::string(path), e);
}

// Splits on '/', dropping empty components (repeated or trailing slashes).
void push_components(std::string_view path, std::deque<std::string>* out, bool front) {
  std::vector<std::string> parts;
  size_t i = 0;
  while (i < path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string_view::npos) j = path.size();
    if (j > i) parts.emplace_back(path.substr(i, j - i));
    i = j + 1;
  }
  if (front) {
    out->insert(out->begin(), parts.begin(), parts.end());
  } else {
    out->insert(out->end(), parts.begin(), parts.end());
  }
}

}  // namespace

Result<Resolver> Resolver::open_root(const std::string& root_dir, Mode mode) {
  int fd = ::open(root_dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return path_error("open", root_dir, errno);
  sys::UniqueFd root(fd);
  bool use = mode != Mode::kWalk;
  if (mode == Mode::kAuto) {
    open_how how{};
    how.flags = O_PATH | O_CLOEXEC;
    how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
    long r = sys_openat2(root.get(), ".", &how);
    if (r >= 0) {
      ::close(static_cast<int>(r));
    } else if (errno == ENOSYS || errno == EPERM) {
      use = false;  // old kernel, or a seccomp filter that does not know openat2
    }
  }
  return Resolver(std::move(root), use);
}

Result<void> Resolver::check_path(std::string_view path) {
  if (path.empty()) return fail(Code::kInvalidArgument, "empty path");
  if (path.find('\0') != std::string_view::npos)
    return fail(Code::kInvalidArgument, "path contains a NUL byte");
  if (path[0] != '/')
    return fail(Code::kInvalidArgument, "path is not absolute: " + std::string(path));
  return {};
}

std::pair<std::string, std::string> Resolver::split_last(std::string_view path) {
  size_t end = path.size();
  while (end > 1 && path[end - 1] == '/') --end;
  std::string_view p = path.substr(0, end);
  size_t slash = p.rfind('/');
  if (slash == std::string_view::npos) return {"/", std::string(p)};
  std::string name(p.substr(slash + 1));
  if (name.empty() || name == "." || name == "..") return {std::string(p.empty() ? "/" : p), ""};
  size_t dir_end = slash;
  while (dir_end > 0 && p[dir_end - 1] == '/') --dir_end;
  return {dir_end == 0 ? std::string("/") : std::string(p.substr(0, dir_end)), name};
}

Result<sys::UniqueFd> Resolver::open(std::string_view path, int flags, mode_t mode) const {
  TP_TRY(check_path(path));
  return use_openat2_ ? open_openat2(path, flags, mode) : open_walk(path, flags, mode);
}

Result<sys::UniqueFd> Resolver::open_openat2(std::string_view path, int flags, mode_t mode) const {
  std::string p(path);
  open_how how{};
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
  if (flags & (O_CREAT | O_TMPFILE)) how.mode = mode;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
  for (int again = 0;;) {
    long r = sys_openat2(root_.get(), p.c_str(), &how);
    if (r >= 0) return sys::UniqueFd(static_cast<int>(r));
    if (errno == EINTR) continue;
    // EAGAIN: a rename anywhere on the host raced a ".." of this lookup (the in-root
    // check) and the kernel asks to retry. A command that keeps renaming, with a path
    // of many "..", could make that endless, and the agent would serve nothing else:
    // after a few tries the walk resolves it, component by component.
    if (errno == EAGAIN) {
      if (++again < kOpenat2Retries) continue;
      return open_walk(path, flags, mode);
    }
    return path_error("openat2", path, errno);
  }
}

// Component-wise resolution over directory fds. Every component is opened
// with O_PATH|O_NOFOLLOW relative to the directory found so far; symlinks are
// read and their target spliced into the remaining components (absolute
// targets restart at the root), ".." pops to the previous directory and stops
// at the root. Magic links read as their text, which is then resolved inside
// the root like any other symlink.
Result<sys::UniqueFd> Resolver::open_walk(std::string_view path, int flags, mode_t mode) const {
  std::deque<std::string> todo;
  push_components(path, &todo, false);
  std::vector<sys::UniqueFd> stack;  // directories below the root; empty = at the root
  int links = 0;
  auto cur = [&] { return stack.empty() ? root_.get() : stack.back().get(); };
  while (!todo.empty()) {
    std::string c = std::move(todo.front());
    todo.pop_front();
    if (c == ".") continue;
    if (c == "..") {
      if (!stack.empty()) stack.pop_back();
      continue;
    }
    bool last = todo.empty();
    int fd = ::openat(cur(), c.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      int e = errno;
      if (last && e == ENOENT && (flags & O_CREAT)) {
        int nfd = ::openat(cur(), c.c_str(), flags | O_NOFOLLOW | O_CLOEXEC, mode);
        if (nfd < 0) return path_error("openat", path, errno);
        return sys::UniqueFd(nfd);
      }
      return path_error("openat", path, e);
    }
    sys::UniqueFd f(fd);
    struct stat st {};
    if (::fstat(f.get(), &st) != 0) return path_error("fstat", path, errno);
    if (S_ISLNK(st.st_mode)) {
      if (++links > kMaxSymlinks) return path_error("resolve", path, ELOOP);
      std::string target(4096, '\0');
      ssize_t n = ::readlinkat(f.get(), "", target.data(), target.size());
      if (n < 0) return path_error("readlinkat", path, errno);
      target.resize(static_cast<size_t>(n));
      if (!target.empty() && target[0] == '/') stack.clear();
      push_components(target, &todo, true);
      continue;
    }
    if (last) {
      // Reopen the final component with the caller's flags from its parent,
      // still without following: it was not a symlink a moment ago.
      if ((flags & O_PATH) && !(flags & O_DIRECTORY)) return f;
      int nfd = ::openat(cur(), c.c_str(), flags | O_NOFOLLOW | O_CLOEXEC, mode);
      if (nfd < 0) return path_error("openat", path, errno);
      return sys::UniqueFd(nfd);
    }
    if (!S_ISDIR(st.st_mode)) return path_error("openat", path, ENOTDIR);
    stack.push_back(std::move(f));
  }
  // The path named a directory reached through "/", "." or "..".
  int nfd = ::openat(cur(), ".", (flags & ~(O_CREAT | O_EXCL | O_TRUNC)) | O_CLOEXEC, mode);
  if (nfd < 0) return path_error("openat", path, errno);
  return sys::UniqueFd(nfd);
}

Result<Resolver::Parent> Resolver::parent(std::string_view path) const {
  TP_TRY(check_path(path));
  auto [dir, name] = split_last(path);
  if (name.empty()) {
    auto fd = open(path, O_PATH);
    if (!fd) return std::unexpected(fd.error());
    return Parent{std::move(*fd), ""};
  }
  auto fd = open(dir, O_PATH | O_DIRECTORY);
  if (!fd) return std::unexpected(fd.error());
  return Parent{std::move(*fd), std::move(name)};
}

}  // namespace tp::agent
