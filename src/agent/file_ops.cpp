#include "agent/file_ops.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace tp::agent {
namespace {

using proto::Message;
using proto::MsgType;
using proto::Tag;

constexpr mode_t kDefaultFileMode = 0644;
constexpr mode_t kDefaultDirMode = 0755;
// Room left in a kFileList answer for the header and one more entry.
constexpr size_t kListBudget = proto::kMaxFrame - (64u << 10);

std::unexpected<Error> call_error(std::string_view call, std::string_view path, int e) {
  return std::unexpected(Error{code_from_errno(e), e, std::string(call) + " " + std::string(path)});
}

Result<std::string> read_link(int dirfd, const std::string& name, std::string_view path) {
  std::string buf(256, '\0');
  for (;;) {
    ssize_t n = ::readlinkat(dirfd, name.c_str(), buf.data(), buf.size());
    if (n < 0) return call_error("readlinkat", path, errno);
    if (static_cast<size_t>(n) < buf.size()) {
      buf.resize(static_cast<size_t>(n));
      return buf;
    }
    if (buf.size() >= 65536) return call_error("readlinkat", path, ENAMETOOLONG);
    buf.resize(buf.size() * 4);
  }
}

Result<void> write_all(int fd, std::string_view data, std::string_view path) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return call_error("write", path, errno);
    }
    off += static_cast<size_t>(n);
  }
  return {};
}

// Names of a directory's entries (without "." and ".."), sorted. Takes `fd`.
Result<std::vector<std::string>> read_names(sys::UniqueFd fd, std::string_view path) {
  DIR* d = ::fdopendir(fd.get());
  if (!d) return call_error("fdopendir", path, errno);
  fd.release();
  std::vector<std::string> names;
  errno = 0;
  while (dirent* de = ::readdir(d)) {
    std::string_view n(de->d_name);
    if (n != "." && n != "..") names.emplace_back(n);
    errno = 0;
  }
  int e = errno;
  ::closedir(d);
  if (e != 0) return call_error("readdir", path, e);
  std::sort(names.begin(), names.end());
  return names;
}

// Removes `name` in `dirfd` and everything below it. Never follows symlinks:
// every directory is opened with O_NOFOLLOW relative to its parent's fd.
Result<void> remove_tree(int dirfd, const std::string& name, const std::string& path) {
  struct stat st {};
  if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return {};
    return call_error("fstatat", path, errno);
  }
  if (!S_ISDIR(st.st_mode)) {
    if (::unlinkat(dirfd, name.c_str(), 0) != 0 && errno != ENOENT)
      return call_error("unlinkat", path, errno);
    return {};
  }
  int fd = ::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return call_error("openat", path, errno);
  sys::UniqueFd dir(fd);
  sys::UniqueFd list_fd(::dup(dir.get()));
  if (!list_fd) return call_error("dup", path, errno);
  auto names = read_names(std::move(list_fd), path);
  if (!names) return std::unexpected(names.error());
  for (const auto& n : *names) TP_TRY(remove_tree(dir.get(), n, join_path(path, n)));
  if (::unlinkat(dirfd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT)
    return call_error("rmdir", path, errno);
  return {};
}

Message ok(uint32_t id) { return Message(MsgType::kOk, id); }

}  // namespace

const char* file_type_name(mode_t mode) {
  if (S_ISREG(mode)) return "file";
  if (S_ISDIR(mode)) return "dir";
  if (S_ISLNK(mode)) return "symlink";
  return "other";
}

std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty() || dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

std::vector<std::pair<Tag, std::string>> entry_fields(const std::string& name,
                                                      const std::string& path,
                                                      const struct stat& st,
                                                      const std::string& link_target) {
  Message m;
  m.add(Tag::kName, name);
  m.add(Tag::kPath, path);
  m.add(Tag::kFileType, file_type_name(st.st_mode));
  m.add_u64(Tag::kSize, static_cast<uint64_t>(st.st_size));
  m.add_u64(Tag::kMode, st.st_mode & 07777);
  m.add_u64(Tag::kMtimeNs, static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000000000ull +
                               static_cast<uint64_t>(st.st_mtim.tv_nsec));
  m.add_u64(Tag::kFileUid, st.st_uid);
  m.add_u64(Tag::kFileGid, st.st_gid);
  if (S_ISLNK(st.st_mode)) m.add(Tag::kLinkTarget, link_target);
  return std::move(m.fields);
}

Message FileService::handle(const Message& req) {
  auto answer_error = [&](const Error& e) {
    return proto::make_error(req.id, code_name(e.code), e.sys_errno, e.context);
  };
  switch (req.type) {
    case MsgType::kFileWrite: {
      auto r = write(req);
      if (!r) return answer_error(r.error());
      Message m = ok(req.id);
      m.add_u64(Tag::kSize, *r);
      return m;
    }
    case MsgType::kFileRead:
    case MsgType::kFileStat:
    case MsgType::kFileList: {
      auto r = req.type == MsgType::kFileRead   ? read(req)
               : req.type == MsgType::kFileStat ? stat(req)
                                                : list(req);
      if (!r) return answer_error(r.error());
      r->id = req.id;
      return std::move(*r);
    }
    case MsgType::kFileRemove:
    case MsgType::kMkdir: {
      auto r = req.type == MsgType::kFileRemove ? remove(req) : mkdir(req);
      if (!r) return answer_error(r.error());
      return ok(req.id);
    }
    default:
      return proto::make_error(req.id, code_name(Code::kInvalidArgument), 0, "not a file request");
  }
}

Result<uint64_t> FileService::write(const Message& req) {
  std::string path = req.str(Tag::kPath);
  TP_TRY(Resolver::check_path(path));
  bool append = req.flag(Tag::kAppend);
  mode_t mode =
      req.has(Tag::kMode) ? static_cast<mode_t>(req.u64(Tag::kMode) & 07777) : kDefaultFileMode;
  if (req.flag(Tag::kParents)) {
    auto [dir, name] = Resolver::split_last(path);
    if (!name.empty()) TP_TRY(mkdir_parents(dir, kDefaultDirMode));
  }
  // O_NONBLOCK: opening a FIFO for writing must not wait for a reader.
  int flags = O_WRONLY | O_CREAT | O_NOCTTY | O_NONBLOCK | (append ? O_APPEND : O_TRUNC);
  auto fd = resolver_.open(path, flags, mode);
  if (!fd) return std::unexpected(fd.error());
  struct stat st {};
  if (::fstat(fd->get(), &st) != 0) return call_error("fstat", path, errno);
  if (!S_ISREG(st.st_mode)) return fail(Code::kInvalidArgument, "not a regular file: " + path);
  if (req.has(Tag::kMode) && (st.st_mode & 07777) != mode && ::fchmod(fd->get(), mode) != 0)
    return call_error("fchmod", path, errno);
  TP_TRY(write_all(fd->get(), req.get(Tag::kData).value_or(""), path));
  if (::fstat(fd->get(), &st) != 0) return call_error("fstat", path, errno);
  return static_cast<uint64_t>(st.st_size);
}

Result<Message> FileService::read(const Message& req) {
  std::string path = req.str(Tag::kPath);
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below.
  auto fd = resolver_.open(path, O_RDONLY | O_NOCTTY | O_NONBLOCK);
  if (!fd) return std::unexpected(fd.error());
  struct stat st {};
  if (::fstat(fd->get(), &st) != 0) return call_error("fstat", path, errno);
  if (!S_ISREG(st.st_mode)) return fail(Code::kInvalidArgument, "not a regular file: " + path);
  uint64_t offset = req.u64(Tag::kOffset, 0);
  uint64_t length = std::min<uint64_t>(req.u64(Tag::kLength, proto::kMaxChunk), proto::kMaxChunk);
  std::string data(length, '\0');
  size_t got = 0;
  while (got < length) {
    ssize_t n =
        ::pread(fd->get(), data.data() + got, length - got, static_cast<off_t>(offset + got));
    if (n < 0) {
      if (errno == EINTR) continue;
      return call_error("pread", path, errno);
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  data.resize(got);
  Message m = ok(req.id);
  m.add_moved(Tag::kData, std::move(data));
  m.add_u64(Tag::kSize, static_cast<uint64_t>(st.st_size));
  return m;
}

Result<Message> FileService::stat(const Message& req) {
  std::string path = req.str(Tag::kPath);
  auto p = resolver_.parent(path);
  if (!p) return std::unexpected(p.error());
  struct stat st {};
  std::string target;
  if (p->name.empty()) {
    if (::fstatat(p->dir.get(), "", &st, AT_EMPTY_PATH) != 0)
      return call_error("fstat", path, errno);
  } else {
    if (::fstatat(p->dir.get(), p->name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
      return call_error("fstatat", path, errno);
    if (S_ISLNK(st.st_mode)) {
      auto t = read_link(p->dir.get(), p->name, path);
      if (!t) return std::unexpected(t.error());
      target = std::move(*t);
    }
  }
  std::string name = p->name;
  if (name.empty()) {
    // "/", "/x/." or "/x/..": name it by its last lexical component.
    std::string_view v = path;
    while (v.size() > 1 && v.back() == '/') v.remove_suffix(1);
    name = v == "/" ? "/" : std::string(v.substr(v.rfind('/') + 1));
  }
  Message m = ok(req.id);
  m.fields = entry_fields(name, path, st, target);
  return m;
}

Result<Message> FileService::list(const Message& req) {
  std::string path = req.str(Tag::kPath);
  auto fd = resolver_.open(path, O_RDONLY | O_DIRECTORY);
  if (!fd) return std::unexpected(fd.error());
  sys::UniqueFd stat_fd(::dup(fd->get()));
  if (!stat_fd) return call_error("dup", path, errno);
  auto names = read_names(std::move(*fd), path);
  if (!names) return std::unexpected(names.error());
  // Entry paths are built from the path as given, minus trailing slashes.
  std::string base = path;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  Message m = ok(req.id);
  size_t total = 0;
  for (const auto& n : *names) {
    struct stat st {};
    if (::fstatat(stat_fd.get(), n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;  // removed while listing
      return call_error("fstatat", join_path(base, n), errno);
    }
    std::string target;
    if (S_ISLNK(st.st_mode)) {
      auto t = read_link(stat_fd.get(), n, join_path(base, n));
      if (t) target = std::move(*t);
    }
    std::string entry = proto::encode_fields(entry_fields(n, join_path(base, n), st, target));
    total += entry.size() + 6;
    if (total > kListBudget)
      return fail(Code::kPayloadTooLarge, "directory has too many entries to list: " + path);
    m.add(Tag::kEntry, entry);
  }
  return m;
}

Result<void> FileService::remove(const Message& req) {
  std::string path = req.str(Tag::kPath);
  auto p = resolver_.parent(path);
  if (!p) return std::unexpected(p.error());
  if (p->name.empty())
    return fail(Code::kInvalidArgument, "refusing to remove " + path + " (root, '.' or '..')");
  struct stat st {};
  if (::fstatat(p->dir.get(), p->name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
    return call_error("fstatat", path, errno);
  if (S_ISDIR(st.st_mode)) {
    if (req.flag(Tag::kRecursive)) return remove_tree(p->dir.get(), p->name, path);
    if (::unlinkat(p->dir.get(), p->name.c_str(), AT_REMOVEDIR) != 0)
      return call_error("rmdir", path, errno);
    return {};
  }
  if (::unlinkat(p->dir.get(), p->name.c_str(), 0) != 0) return call_error("unlink", path, errno);
  return {};
}

Result<void> FileService::mkdir(const Message& req) {
  std::string path = req.str(Tag::kPath);
  TP_TRY(Resolver::check_path(path));
  mode_t mode =
      req.has(Tag::kMode) ? static_cast<mode_t>(req.u64(Tag::kMode) & 07777) : kDefaultDirMode;
  if (req.flag(Tag::kParents)) return mkdir_parents(path, mode);
  auto p = resolver_.parent(path);
  if (!p) return std::unexpected(p.error());
  if (p->name.empty()) return call_error("mkdir", path, EEXIST);
  if (::mkdirat(p->dir.get(), p->name.c_str(), mode) != 0) return call_error("mkdir", path, errno);
  return {};
}

Result<void> FileService::mkdir_parents(const std::string& path, mode_t mode) {
  TP_TRY(Resolver::check_path(path));
  // Every prefix is resolved from the root again, so symlinks and ".." in the
  // path mean what they mean to the kernel, and creation happens in the
  // resolved parent's fd.
  size_t pos = 0;
  while (pos < path.size()) {
    size_t next = path.find('/', pos + 1);
    if (next == std::string::npos) next = path.size();
    std::string prefix = path.substr(0, next);
    pos = next;
    if (prefix.back() == '/') continue;
    auto fd = resolver_.open(prefix, O_PATH | O_DIRECTORY);
    if (fd) continue;
    int e = fd.error().sys_errno;
    if (e == ENOTDIR)
      return std::unexpected(
          Error{Code::kConflict, ENOTDIR, "mkdir " + prefix + " (exists, not a directory)"});
    if (e != ENOENT) return std::unexpected(fd.error());
    auto p = resolver_.parent(prefix);
    if (!p) return std::unexpected(p.error());
    if (p->name.empty()) return call_error("mkdir", prefix, ENOENT);
    if (::mkdirat(p->dir.get(), p->name.c_str(), mode) != 0 && errno != EEXIST)
      return call_error("mkdir", prefix, errno);
    auto again = resolver_.open(prefix, O_PATH | O_DIRECTORY);
    if (!again) {
      if (again.error().sys_errno == ENOTDIR)
        return std::unexpected(
            Error{Code::kConflict, ENOTDIR, "mkdir " + prefix + " (exists, not a directory)"});
      return std::unexpected(again.error());
    }
  }
  return {};
}

}  // namespace tp::agent
