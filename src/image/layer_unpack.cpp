#include "image/layer_unpack.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <memory>

#include "common/sha256.h"
#include "sys/fd.h"

namespace tp::image {
namespace {

using sys::UniqueFd;

constexpr uint64_t kResolve =
    RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
constexpr uint64_t kSpaceCheckEvery = 8ull << 20;
constexpr const char* kWhPrefix = ".wh.";
constexpr const char* kWhMeta = ".wh..wh.";
constexpr const char* kOpaque = ".wh..wh..opq";

int open_dir_beneath(int dirfd, const char* path) {
  struct open_how how {};
  how.flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW;
  how.resolve = kResolve;
  return static_cast<int>(::syscall(SYS_openat2, dirfd, path, &how, sizeof how));
}

std::string join(const std::vector<std::string>& c, size_t n) {
  std::string s;
  for (size_t i = 0; i < n && i < c.size(); ++i) s += (i ? "/" : "") + c[i];
  return s;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

struct ArchiveFree {
  void operator()(archive* a) const { archive_read_free(a); }
};

class Unpacker {
 public:
  Unpacker(const ByteSource& src, int root, const UnpackLimits& lim)
      : src_(src), root_(root), lim_(lim) {
    if (lim_.max_stream_bytes == 0) lim_.max_stream_bytes = lim_.max_bytes + (1ull << 30);
  }

  Result<UnpackStats> run() {
    if (!md_.ok()) return fail(Code::kInternal, "sha256 of the layer stream: setup failed");
    raw_.reset(archive_read_new());
    tar_.reset(archive_read_new());
    if (!raw_ || !tar_) return fail(Code::kResourceExhausted, "archive_read_new: out of memory");
    // Decompression only (libarchive's own decoders; no external programs).
    archive_read_support_filter_gzip(raw_.get());
    archive_read_support_filter_bzip2(raw_.get());
    archive_read_support_filter_xz(raw_.get());
    archive_read_support_filter_zstd(raw_.get());
    archive_read_support_filter_lz4(raw_.get());
    archive_read_support_format_raw(raw_.get());
    archive_read_support_format_empty(raw_.get());
    if (archive_read_open(raw_.get(), this, nullptr, &Unpacker::raw_read, nullptr) != ARCHIVE_OK)
      return archive_fail(raw_.get(), "open layer stream");
    archive_entry* re = nullptr;
    int rr = archive_read_next_header(raw_.get(), &re);
    if (rr == ARCHIVE_EOF) {
      raw_eof_ = true;  // an empty file: an empty layer
    } else if (rr != ARCHIVE_OK) {
      return archive_fail(raw_.get(), "read layer stream");
    }
    archive_read_support_format_tar(tar_.get());
    archive_read_support_format_empty(tar_.get());
    if (archive_read_open(tar_.get(), this, nullptr, &Unpacker::tar_read, nullptr) != ARCHIVE_OK)
      return tar_fail("open tar");
    for (;;) {
      archive_entry* e = nullptr;
      int r = archive_read_next_header(tar_.get(), &e);
      if (r == ARCHIVE_EOF) break;
      if (r < ARCHIVE_WARN) return tar_fail("read tar header");
      if (++stats_.entries > lim_.max_entries)
        return fail(Code::kPayloadTooLarge,
                    "layer has more than " + std::to_string(lim_.max_entries) + " entries (limit)");
      TP_TRY(entry(e));
    }
    // Hash the rest of the stream (tar end blocks) so diff_id covers all of it.
    char buf[65536];
    for (;;) {
      la_ssize_t n = pull(buf, sizeof buf);
      if (n < 0) return tar_fail("read tar trailer");
      if (n == 0) break;
    }
    std::string h = md_.hex_digest();
    if (h.empty()) return fail(Code::kInternal, "sha256 of the layer stream failed");
    stats_.diff_id = "sha256:" + h;
    return stats_;
  }

 private:
  static la_ssize_t raw_read(archive*, void* ud, const void** buf) {
    auto* u = static_cast<Unpacker*>(ud);
    ssize_t n = u->src_(u->rbuf_, sizeof u->rbuf_);
    if (n < 0) {
      u->stream_error_ = "reading the layer source failed";
      return -1;
    }
    *buf = u->rbuf_;
    return n;
  }
  // Decompressed bytes for the tar reader, hashed and counted on the way.
  la_ssize_t pull(void* buf, size_t n) {
    if (raw_eof_) return 0;
    la_ssize_t got = archive_read_data(raw_.get(), buf, n);
    if (got < 0) {
      stream_error_ = std::string("decompress: ") + (archive_error_string(raw_.get()) ?: "error");
      return -1;
    }
    if (got == 0) {
      raw_eof_ = true;
      return 0;
    }
    stream_bytes_ += static_cast<uint64_t>(got);
    if (stream_bytes_ > lim_.max_stream_bytes) {
      stream_error_ =
          "decompressed layer exceeds " + std::to_string(lim_.max_stream_bytes) + " bytes (limit)";
      stream_limit_ = true;
      return -1;
    }
    md_.update(buf, static_cast<size_t>(got));
    return got;
  }
  static la_ssize_t tar_read(archive*, void* ud, const void** buf) {
    auto* u = static_cast<Unpacker*>(ud);
    *buf = u->tbuf_;
    return u->pull(u->tbuf_, sizeof u->tbuf_);
  }

  std::unexpected<Error> archive_fail(archive* a, const std::string& what) {
    if (!stream_error_.empty()) return fail(Code::kInvalidArgument, what + ": " + stream_error_);
    const char* s = archive_error_string(a);
    return fail(Code::kInvalidArgument, what + ": " + (s ? s : "malformed archive"));
  }
  std::unexpected<Error> tar_fail(const std::string& what) {
    if (stream_limit_) return fail(Code::kPayloadTooLarge, stream_error_);
    if (!stream_error_.empty()) return fail(Code::kInvalidArgument, what + ": " + stream_error_);
    const char* s = archive_error_string(tar_.get());
    return fail(Code::kInvalidArgument, what + " (entry " + std::to_string(stats_.entries) +
                                            "): " + (s ? s : "malformed tar"));
  }
  std::unexpected<Error> bad(const std::string& name, const std::string& why) {
    return fail(Code::kInvalidArgument, "layer entry '" + name + "': " + why);
  }
  std::unexpected<Error> sysbad(const std::string& name, const std::string& call, int e = errno) {
    return sys_fail("layer entry '" + name + "': " + call, e);
  }

  // Directory fd of comps[0..n), created (owned by uid_base) when missing if `create`.
  Result<int> dir_of(const std::vector<std::string>& comps, size_t n, bool create,
                     const std::string& name) {
    if (n == 0) return root_;
    std::string key = join(comps, n);
    if (cache_fd_ && key == cache_key_) return cache_fd_.get();
    UniqueFd fd(open_dir_beneath(root_, key.c_str()));
    if (!fd) {
      if (errno == ELOOP || errno == ENOTDIR || errno == EXDEV)
        return bad(name,
                   "its directory '" + key +
                       "' is a symlink or not a directory (writing through links is refused)");
      if (errno != ENOENT || !create) return sysbad(name, "openat2(" + key + ")");
      // Walk and create the missing directories one by one.
      UniqueFd cur;
      int at = root_;
      for (size_t i = 0; i < n; ++i) {
        int f = open_dir_beneath(at, comps[i].c_str());
        if (f < 0 && errno == ENOENT) {
          if (::mkdirat(at, comps[i].c_str(), 0755) != 0 && errno != EEXIST)
            return sysbad(name, "mkdirat(" + join(comps, i + 1) + ")");
          f = open_dir_beneath(at, comps[i].c_str());
          if (f >= 0 && ::fchown(f, lim_.uid_base, lim_.uid_base) != 0) {
            int e = errno;
            ::close(f);
            return sysbad(name, "fchown(" + join(comps, i + 1) + ")", e);
          }
        }
        if (f < 0) {
          if (errno == ELOOP || errno == ENOTDIR)
            return bad(
                name, "its directory '" + join(comps, i + 1) + "' is a symlink or not a directory");
          return sysbad(name, "openat2(" + join(comps, i + 1) + ")");
        }
        cur.reset(f);
        at = f;
      }
      fd = std::move(cur);
    }
    cache_fd_ = std::move(fd);
    cache_key_ = key;
    return cache_fd_.get();
  }

  // Makes room for a new entry `leaf` in `pfd`; returns true when an existing
  // directory should be kept (a directory entry over a directory).
  Result<bool> clear_slot(int pfd, const std::string& leaf, bool new_is_dir,
                          const std::string& name) {
    struct stat st {};
    if (::fstatat(pfd, leaf.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) return false;
      return sysbad(name, "fstatat");
    }
    if (S_ISDIR(st.st_mode)) {
      if (new_is_dir) return true;
      cache_fd_.reset();  // the cached directory may be inside the removed tree
      cache_key_.clear();
      TP_TRY(remove_tree_at(pfd, leaf));
      return false;
    }
    if (::unlinkat(pfd, leaf.c_str(), 0) != 0) return sysbad(name, "unlinkat");
    return false;
  }

  Result<std::pair<uid_t, gid_t>> owner(archive_entry* e, const std::string& name) {
    la_int64_t u = archive_entry_uid(e), g = archive_entry_gid(e);
    if (u < 0 || g < 0 || u >= lim_.id_count || g >= lim_.id_count)
      return bad(name, "owner " + std::to_string(u) + ":" + std::to_string(g) + " is outside the " +
                           std::to_string(lim_.id_count) + " ids of a sandbox");
    return std::pair<uid_t, gid_t>(lim_.uid_base + static_cast<uid_t>(u),
                                   lim_.uid_base + static_cast<gid_t>(g));
  }

  void set_xattrs(int fd, archive_entry* e) {
    const char* xn = nullptr;
    const void* xv = nullptr;
    size_t xs = 0;
    archive_entry_xattr_reset(e);
    while (archive_entry_xattr_next(e, &xn, &xv, &xs) == ARCHIVE_OK) {
      std::string_view n = xn ? xn : "";
      if (fd < 0 || !starts_with(n, "user.") || starts_with(n, "user.overlay.") ||
          ::fsetxattr(fd, xn, xv, xs, 0) != 0)
        ++stats_.xattrs_dropped;
    }
  }

  Result<void> check_space(uint64_t upcoming, const std::string& name) {
    since_check_ += upcoming;
    if (since_check_ < kSpaceCheckEvery && upcoming < kSpaceCheckEvery) return {};
    since_check_ = 0;
    struct statvfs sv {};
    if (::fstatvfs(root_, &sv) != 0) return sysbad(name, "fstatvfs");
    uint64_t avail = static_cast<uint64_t>(sv.f_bavail) * sv.f_frsize;
    if (avail < lim_.reserve_bytes + upcoming)
      return fail(Code::kInsufficientStorage,
                  "layer entry '" + name + "' (" + std::to_string(upcoming) +
                      " bytes) would leave less than " + std::to_string(lim_.reserve_bytes) +
                      " bytes free on the image store's file system");
    return {};
  }

  Result<void> write_file(int fd, archive_entry* e, const std::string& name) {
    la_int64_t size = archive_entry_size(e);
    const void* buf = nullptr;
    size_t len = 0;
    la_int64_t off = 0;
    for (;;) {
      int r = archive_read_data_block(tar_.get(), &buf, &len, &off);
      if (r == ARCHIVE_EOF) break;
      if (r < ARCHIVE_WARN) return tar_fail("read data of '" + name + "'");
      if (off < 0 || off + static_cast<la_int64_t>(len) > size)
        return bad(name, "data beyond its declared size");
      const char* p = static_cast<const char*>(buf);
      while (len > 0) {
        ssize_t w = ::pwrite(fd, p, len, off);
        if (w < 0) {
          if (errno == EINTR) continue;
          return sysbad(name, "pwrite");
        }
        p += w;
        off += w;
        len -= static_cast<size_t>(w);
      }
    }
    if (::ftruncate(fd, size) != 0) return sysbad(name, "ftruncate");
    return {};
  }

  Result<void> entry(archive_entry* e) {
    const char* pn = archive_entry_pathname(e);
    if (!pn) pn = archive_entry_pathname_utf8(e);
    std::string name = pn ? pn : "";
    auto sp = split_entry_path(name);
    if (!sp) return bad(name, sp.error().context);
    std::vector<std::string>& comps = *sp;
    const char* hl = archive_entry_hardlink(e);
    mode_t type = archive_entry_filetype(e);
    if (comps.empty()) {  // the layer root itself
      if (hl || type != AE_IFDIR) return bad(name, "the layer root must be a directory");
      auto own = owner(e, name);
      if (!own) return std::unexpected(own.error());
      if (::fchown(root_, own->first, own->second) != 0) return sysbad(name, "fchown");
      if (::fchmod(root_, archive_entry_perm(e) & 0777) != 0) return sysbad(name, "fchmod");
      return {};
    }
    const std::string leaf = comps.back();
    const size_t depth = comps.size() - 1;

    // Whiteouts: OCI names to overlayfs objects.
    if (starts_with(leaf, kWhPrefix)) {
      if (leaf == kOpaque) {
        auto d = dir_of(comps, depth, true, name);
        if (!d) return std::unexpected(d.error());
        if (::fsetxattr(*d, "user.overlay.opaque", "y", 1, 0) != 0)
          return sysbad(name, "fsetxattr(user.overlay.opaque)");
        ++stats_.opaque_dirs;
        return {};
      }
      if (starts_with(leaf, kWhMeta)) return bad(name, "unsupported whiteout meta entry");
      std::string target = leaf.substr(std::string_view(kWhPrefix).size());
      if (target.empty() || target == "." || target == "..") return bad(name, "invalid whiteout");
      auto d = dir_of(comps, depth, true, name);
      if (!d) return std::unexpected(d.error());
      TP_TRY(clear_slot(*d, target, false, name));
      return make_whiteout(*d, target, name);
    }

    auto own = owner(e, name);
    if (!own) return std::unexpected(own.error());
    mode_t perm = archive_entry_perm(e) & 07777;
    if ((perm & (S_ISUID | S_ISGID)) && lim_.refuse_setuid && type == AE_IFREG)
      return bad(name, "setuid/setgid files are refused by this store's policy");

    auto d = dir_of(comps, depth, true, name);
    if (!d) return std::unexpected(d.error());
    int pfd = *d;

    if (hl) {
      auto tsp = split_entry_path(hl);
      if (!tsp || tsp->empty())
        return bad(name, "invalid hard link target '" + std::string(hl) + "'");
      std::vector<std::string> tc = *tsp;
      std::string tleaf = tc.back();
      UniqueFd tdir;
      int tfd = root_;
      if (tc.size() > 1) {
        std::string tk = join(tc, tc.size() - 1);
        tdir.reset(open_dir_beneath(root_, tk.c_str()));
        if (!tdir)
          return bad(name, "hard link target '" + std::string(hl) + "' is not inside the layer");
        tfd = tdir.get();
      }
      struct stat st {};
      if (::fstatat(tfd, tleaf.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || S_ISDIR(st.st_mode))
        return bad(name, "hard link target '" + std::string(hl) + "' is missing or a directory");
      TP_TRY(clear_slot(pfd, leaf, false, name));
      if (::linkat(tfd, tleaf.c_str(), pfd, leaf.c_str(), 0) != 0) return sysbad(name, "linkat");
      return {};
    }

    switch (type) {
      case AE_IFREG: {
        la_int64_t size = archive_entry_size(e);
        if (size < 0) return bad(name, "negative size");
        stats_.bytes += static_cast<uint64_t>(size);
        if (stats_.bytes > lim_.max_bytes)
          return fail(Code::kPayloadTooLarge, "layer entry '" + name + "': unpacked files exceed " +
                                                  std::to_string(lim_.max_bytes) +
                                                  " bytes (limit)");
        TP_TRY(check_space(static_cast<uint64_t>(size), name));
        TP_TRY(clear_slot(pfd, leaf, false, name));
        UniqueFd fd(::openat(pfd, leaf.c_str(),
                             O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
        if (!fd) return sysbad(name, "openat(O_CREAT|O_EXCL)");
        TP_TRY(write_file(fd.get(), e, name));
        return finish_fd(fd.get(), e, *own, perm, name);
      }
      case AE_IFDIR: {
        auto keep = clear_slot(pfd, leaf, true, name);
        if (!keep) return std::unexpected(keep.error());
        if (!*keep && ::mkdirat(pfd, leaf.c_str(), 0700) != 0) return sysbad(name, "mkdirat");
        UniqueFd fd(open_dir_beneath(pfd, leaf.c_str()));
        if (!fd) return sysbad(name, "openat2(directory)");
        return finish_fd(fd.get(), e, *own, perm, name);
      }
      case AE_IFLNK: {
        const char* t = archive_entry_symlink(e);
        if (!t || !*t) return bad(name, "symlink without target");
        TP_TRY(clear_slot(pfd, leaf, false, name));
        if (::symlinkat(t, pfd, leaf.c_str()) != 0) return sysbad(name, "symlinkat");
        if (::fchownat(pfd, leaf.c_str(), own->first, own->second, AT_SYMLINK_NOFOLLOW) != 0)
          return sysbad(name, "fchownat(symlink)");
        set_times_at(pfd, leaf, e);
        return {};
      }
      case AE_IFIFO: {
        TP_TRY(clear_slot(pfd, leaf, false, name));
        if (::mknodat(pfd, leaf.c_str(), S_IFIFO | 0600, 0) != 0)
          return sysbad(name, "mknodat(fifo)");
        if (::fchownat(pfd, leaf.c_str(), own->first, own->second, AT_SYMLINK_NOFOLLOW) != 0)
          return sysbad(name, "fchownat(fifo)");
        if (::fchmodat(pfd, leaf.c_str(), perm & 0777, 0) != 0)
          return sysbad(name, "fchmodat(fifo)");
        return {};
      }
      case AE_IFCHR:
        if (archive_entry_rdevmajor(e) == 0 &&
            archive_entry_rdevminor(e) == 0) {  // overlay-style whiteout
          TP_TRY(clear_slot(pfd, leaf, false, name));
          return make_whiteout(pfd, leaf, name);
        }
        [[fallthrough]];
      case AE_IFBLK:
        return bad(name, std::string(type == AE_IFBLK ? "block" : "character") + " device " +
                             std::to_string(archive_entry_rdevmajor(e)) + ":" +
                             std::to_string(archive_entry_rdevminor(e)) +
                             " refused (device nodes are not allowed in layers)");
      case AE_IFSOCK:
        return bad(name, "socket entries are refused");
      default:
        return bad(name, "unknown entry type");
    }
  }

  Result<void> make_whiteout(int pfd, const std::string& leaf, const std::string& name) {
    if (::mknodat(pfd, leaf.c_str(), S_IFCHR | 0000, makedev(0, 0)) != 0)
      return sysbad(name, "mknodat(whiteout 0/0)");
    if (::fchownat(pfd, leaf.c_str(), lim_.uid_base, lim_.uid_base, AT_SYMLINK_NOFOLLOW) != 0)
      return sysbad(name, "fchownat(whiteout)");
    ++stats_.whiteouts;
    return {};
  }

  Result<void> finish_fd(int fd, archive_entry* e, std::pair<uid_t, gid_t> own, mode_t perm,
                         const std::string& name) {
    if (::fchown(fd, own.first, own.second) != 0) return sysbad(name, "fchown");
    // After chown, which clears setuid bits.
    if (::fchmod(fd, perm) != 0) return sysbad(name, "fchmod");
    set_xattrs(fd, e);
    if (archive_entry_mtime_is_set(e)) {
      struct timespec ts[2];
      ts[0] = {archive_entry_mtime(e), archive_entry_mtime_nsec(e)};
      ts[1] = ts[0];
      ::futimens(fd, ts);
    }
    return {};
  }

  void set_times_at(int pfd, const std::string& leaf, archive_entry* e) {
    if (!archive_entry_mtime_is_set(e)) return;
    struct timespec ts[2];
    ts[0] = {archive_entry_mtime(e), archive_entry_mtime_nsec(e)};
    ts[1] = ts[0];
    ::utimensat(pfd, leaf.c_str(), ts, AT_SYMLINK_NOFOLLOW);
  }

  const ByteSource& src_;
  int root_;
  UnpackLimits lim_;
  UnpackStats stats_;
  std::unique_ptr<archive, ArchiveFree> raw_, tar_;
  Sha256 md_;
  bool raw_eof_ = false;
  bool stream_limit_ = false;
  std::string stream_error_;
  uint64_t stream_bytes_ = 0;
  uint64_t since_check_ = kSpaceCheckEvery;  // check on the first file
  UniqueFd cache_fd_;
  std::string cache_key_;
  char rbuf_[65536];
  char tbuf_[65536];
};

}  // namespace

Result<std::vector<std::string>> split_entry_path(std::string_view name) {
  if (name.empty()) return fail(Code::kInvalidArgument, "empty name");
  if (name.size() > 4096) return fail(Code::kInvalidArgument, "name longer than 4096 bytes");
  if (name.find('\0') != std::string_view::npos) return fail(Code::kInvalidArgument, "NUL in name");
  if (name[0] == '/') return fail(Code::kInvalidArgument, "absolute path refused");
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= name.size()) {
    size_t j = name.find('/', i);
    if (j == std::string_view::npos) j = name.size();
    std::string_view c = name.substr(i, j - i);
    if (c == "..") return fail(Code::kInvalidArgument, "'..' component refused");
    if (!c.empty() && c != ".") {
      if (c.size() > 255) return fail(Code::kInvalidArgument, "component longer than 255 bytes");
      out.emplace_back(c);
      if (out.size() > 256) return fail(Code::kInvalidArgument, "deeper than 256 levels");
    }
    i = j + 1;
  }
  return out;
}

Result<void> remove_tree_at(int dir_fd, const std::string& name) {
  struct stat st {};
  if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return {};
    return sys_fail("fstatat(" + name + ")");
  }
  if (!S_ISDIR(st.st_mode)) {
    if (::unlinkat(dir_fd, name.c_str(), 0) != 0 && errno != ENOENT)
      return sys_fail("unlinkat(" + name + ")");
    return {};
  }
  int fd = ::openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return sys_fail("openat(" + name + ")");
  DIR* d = ::fdopendir(fd);
  if (!d) {
    int e = errno;
    ::close(fd);
    return sys_fail("fdopendir(" + name + ")", e);
  }
  std::vector<std::string> kids;
  while (dirent* de = ::readdir(d)) {
    std::string n = de->d_name;
    if (n != "." && n != "..") kids.push_back(n);
  }
  Result<void> r;
  for (const auto& k : kids) {
    r = remove_tree_at(fd, k);
    if (!r) break;
  }
  ::closedir(d);
  if (!r) return r;
  if (::unlinkat(dir_fd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT)
    return sys_fail("rmdir(" + name + ")");
  return {};
}

Result<UnpackStats> unpack_layer(const ByteSource& src, int dir_fd, const UnpackLimits& lim) {
  auto u = std::make_unique<Unpacker>(src, dir_fd, lim);  // 128 KiB of buffers: not on the stack
  return u->run();
}

ByteSource fd_source(int fd) {
  return [fd](void* buf, size_t n) -> ssize_t {
    for (;;) {
      ssize_t r = ::read(fd, buf, n);
      if (r < 0 && errno == EINTR) continue;
      return r;
    }
  };
}

Result<UnpackStats> unpack_layer_file(const std::string& path, int dir_fd,
                                      const UnpackLimits& lim) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return sys_fail("open(" + path + ")");
  ByteSource src = fd_source(fd.get());
  return unpack_layer(src, dir_fd, lim);
}

}  // namespace tp::image
