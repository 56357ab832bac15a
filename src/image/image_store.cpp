#include "image/image_store.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "common/ids.h"
#include "common/log.h"
#include "sys/fd.h"

namespace tp::image {
namespace {

namespace json = boost::json;
using sys::UniqueFd;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

Result<void> ensure_dir(const std::string& p, mode_t mode, uid_t uid = 0) {
  if (::mkdir(p.c_str(), mode) != 0 && errno != EEXIST) return sys_fail("mkdir(" + p + ")");
  struct stat st {};
  if (::lstat(p.c_str(), &st) != 0) return sys_fail("lstat(" + p + ")");
  if (!S_ISDIR(st.st_mode)) return fail(Code::kInternal, p + " is not a directory");
  if (::chmod(p.c_str(), mode) != 0) return sys_fail("chmod(" + p + ")");
  if (::lchown(p.c_str(), uid, uid) != 0) return sys_fail("lchown(" + p + ")");
  return {};
}

Result<void> write_file_atomic(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd) return sys_fail("open(" + tmp + ")");
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    ssize_t w = ::write(fd.get(), p, left);
    if (w < 0) {
      if (errno == EINTR) continue;
      return sys_fail("write(" + tmp + ")");
    }
    p += w;
    left -= static_cast<size_t>(w);
  }
  if (::fsync(fd.get()) != 0) return sys_fail("fsync(" + tmp + ")");
  fd.reset();
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    return sys_fail("rename(" + tmp + ", " + path + ")");
  return {};
}

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return sys_fail("open(" + path + ")", errno ? errno : ENOENT);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Result<void> remove_path(const std::string& path) {
  auto slash = path.rfind('/');
  std::string dir = path.substr(0, slash), leaf = path.substr(slash + 1);
  UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!d) return sys_fail("open(" + dir + ")");
  return remove_tree_at(d.get(), leaf);
}

ImageDefaults defaults_from(const json::object& o) {
  ImageDefaults d;
  if (auto* e = o.if_contains("env"); e && e->is_object())
    for (const auto& [k, v] : e->as_object())
      if (v.is_string()) d.env[std::string(k)] = std::string(v.as_string());
  if (auto* w = o.if_contains("workdir"); w && w->is_string())
    d.workdir = std::string(w->as_string());
  if (auto* u = o.if_contains("user"); u && u->is_string()) d.user = std::string(u->as_string());
  if (auto* c = o.if_contains("cmd"); c && c->is_array())
    for (const auto& x : c->as_array())
      if (x.is_string()) d.cmd.emplace_back(x.as_string());
  return d;
}

// Upper defaults override lower ones; env is merged.
void merge_defaults(ImageDefaults* into, const ImageDefaults& upper) {
  for (const auto& [k, v] : upper.env) into->env[k] = v;
  if (!upper.workdir.empty()) into->workdir = upper.workdir;
  if (!upper.user.empty()) into->user = upper.user;
  if (!upper.cmd.empty()) into->cmd = upper.cmd;
}

struct ArchiveFree {
  void operator()(archive* a) const { archive_read_free(a); }
};

std::unique_ptr<archive, ArchiveFree> open_outer(const std::string& path, Error* err) {
  std::unique_ptr<archive, ArchiveFree> a(archive_read_new());
  archive_read_support_filter_gzip(a.get());
  archive_read_support_filter_bzip2(a.get());
  archive_read_support_filter_xz(a.get());
  archive_read_support_filter_zstd(a.get());
  archive_read_support_format_tar(a.get());
  if (archive_read_open_filename(a.get(), path.c_str(), 1 << 16) != ARCHIVE_OK) {
    const char* s = archive_error_string(a.get());
    *err = Error{Code::kInvalidArgument, 0,
                 "open archive " + path + ": " + (s ? s : "not a tar archive")};
    return nullptr;
  }
  return a;
}

// Calls fn(archive, entry, normalized member name) for each member of the tar at
// `path`, in order; fn's error stops the walk and is returned.
Result<void> for_each_member(
    const std::string& path,
    const std::function<Result<void>(archive*, archive_entry*, const std::string&)>& fn) {
  Error err;
  auto a = open_outer(path, &err);
  if (!a) return std::unexpected(err);
  archive_entry* e = nullptr;
  for (;;) {
    int r = archive_read_next_header(a.get(), &e);
    if (r == ARCHIVE_EOF) return {};
    if (r < ARCHIVE_WARN)
      return fail(Code::kInvalidArgument,
                  std::string("read archive: ") + (archive_error_string(a.get()) ?: "?"));
    TP_TRY(fn(a.get(), e,
              normalize_member(archive_entry_pathname(e) ? archive_entry_pathname(e) : "")));
  }
}

}  // namespace

bool valid_image_name(const std::string& s) {
  if (s.empty() || s.size() > 128 || !std::isalnum(static_cast<unsigned char>(s[0]))) return false;
  if (s == "host" || s == "layers" || s == "image") return false;
  return std::all_of(s.begin(), s.end(), name_char);
}

bool valid_image_version(const std::string& s) {
  if (s.empty() || s.size() > 64 || !std::isalnum(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(), name_char);
}

bool valid_layer_digest(const std::string& d) {
  if (d.size() != 71 || d.rfind("sha256:", 0) != 0) return false;
  return std::all_of(d.begin() + 7, d.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

Result<std::pair<std::string, std::string>> parse_image_ref(const std::string& ref) {
  auto colon = ref.find(':');
  std::string name = ref.substr(0, colon),
              version = colon == std::string::npos ? "" : ref.substr(colon + 1);
  if (!valid_image_name(name))
    return fail(Code::kInvalidArgument,
                "invalid image name '" + name +
                    "' (1-128 of [A-Za-z0-9._-], starting alphanumeric; not host/layers/image)");
  if (colon != std::string::npos && !valid_image_version(version))
    return fail(Code::kInvalidArgument,
                "invalid image version '" + version + "' (1-64 of [A-Za-z0-9._-])");
  return std::pair{name, version};
}

ImageStore::ImageStore(StoreOptions o, std::shared_ptr<control::ImageRecordStore> records)
    : opts_(std::move(o)), root_(opts_.data_dir + "/images"), records_(std::move(records)) {}

Result<std::shared_ptr<ImageStore>> ImageStore::open(
    StoreOptions opts, std::shared_ptr<control::ImageRecordStore> records) {
  if (!records) return fail(Code::kInvalidArgument, "image store needs a record store");
  std::shared_ptr<ImageStore> s(new ImageStore(std::move(opts), std::move(records)));
  if (s->opts_.data_dir.empty() || s->opts_.data_dir[0] != '/')
    return fail(Code::kInvalidArgument,
                "image store data dir must be absolute: '" + s->opts_.data_dir + "'");
  std::error_code ec;
  std::filesystem::create_directories(s->opts_.data_dir, ec);
  if (ec) return fail(Code::kInternal, "create " + s->opts_.data_dir + ": " + ec.message());
  TP_TRY(ensure_dir(s->root_, 0711));
  TP_TRY(ensure_dir(s->root_ + "/layers", 0711));
  TP_TRY(ensure_dir(s->root_ + "/layers/sha256", 0711));
  TP_TRY(ensure_dir(s->root_ + "/tmp", 0700));
  TP_TRY(s->load_layers());
  TP_TRY(s->import_json());
  return s;
}

Result<void> ImageStore::load_layers() {
  // Unfinished unpacks and interrupted gc runs.
  {
    UniqueFd t(::open((root_ + "/tmp").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!t) return sys_fail("open(" + root_ + "/tmp)");
    DIR* d = ::fdopendir(::dup(t.get()));
    std::vector<std::string> names;
    while (d) {
      dirent* de = ::readdir(d);
      if (!de) break;
      std::string n = de->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    if (d) ::closedir(d);
    for (const auto& n : names) {
      auto r = remove_tree_at(t.get(), n);
      if (!r)
        spdlog::warn("image store: cannot remove leftover {}/tmp/{}: {}", root_, n,
                     r.error().message());
    }
  }
  std::string ldir = root_ + "/layers/sha256";
  DIR* d = ::opendir(ldir.c_str());
  if (!d) return sys_fail("opendir(" + ldir + ")");
  std::vector<std::string> hexes;
  while (dirent* de = ::readdir(d)) {
    std::string n = de->d_name;
    if (n != "." && n != "..") hexes.push_back(n);
  }
  ::closedir(d);
  for (const auto& h : hexes) {
    std::string digest = "sha256:" + h;
    auto text = read_file(ldir + "/" + h + "/layer.json");
    boost::system::error_code ec;
    json::value v = text ? json::parse(*text, ec) : json::value();
    if (!valid_layer_digest(digest) || !text || ec || !v.is_object()) {
      spdlog::warn("image store: removing incomplete layer {}", ldir + "/" + h);
      (void)remove_path(ldir + "/" + h);
      continue;
    }
    const auto& o = v.as_object();
    LayerInfo li;
    li.digest = digest;
    li.path = layer_path(digest);
    if (auto* b = o.if_contains("bytes"); b && b->is_int64())
      li.bytes = static_cast<uint64_t>(b->as_int64());
    if (auto* b = o.if_contains("entries"); b && b->is_int64())
      li.entries = static_cast<uint64_t>(b->as_int64());
    if (auto* b = o.if_contains("created_ms"); b && b->is_int64()) li.created_ms = b->as_int64();
    if (auto* b = o.if_contains("source"); b && b->is_string())
      li.source = std::string(b->as_string());
    layers_[digest] = li;
  }
  return {};
}

Result<void> ImageStore::import_json() {
  const std::string path = root_ + "/images.json";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return {};  // a fresh store, or imported already
    return sys_fail("stat(" + path + ")");
  }
  auto text = read_file(path);
  if (!text) return std::unexpected(text.error());
  boost::system::error_code ec;
  json::value v = json::parse(*text, ec);
  // Left in place: nothing is lost, and the daemon says why it cannot start.
  if (ec || !v.is_object())
    return fail(Code::kInternal, path + " is corrupt: " + ec.message() + " (fix or remove it)");
  int imported = 0, kept = 0;
  if (auto* arr = v.as_object().if_contains("images"); arr && arr->is_array()) {
    for (const auto& x : arr->as_array()) {
      if (!x.is_object()) continue;
      const auto& o = x.as_object();
      ImageRecord r;
      r.name = o.contains("name") && o.at("name").is_string()
                   ? std::string(o.at("name").as_string())
                   : "";
      r.version = o.contains("version") && o.at("version").is_string()
                      ? std::string(o.at("version").as_string())
                      : "";
      if (!valid_image_name(r.name) || !valid_image_version(r.version)) {
        spdlog::warn("image store: {}: skipping a record with an invalid name '{}:{}'", path,
                     r.name, r.version);
        continue;
      }
      if (auto* p = o.if_contains("parts"); p && p->is_array())
        for (const auto& s : p->as_array())
          if (s.is_string()) r.parts.emplace_back(s.as_string());
      if (auto* dd = o.if_contains("defaults"); dd && dd->is_object())
        r.defaults = defaults_from(dd->as_object());
      if (auto* s = o.if_contains("source"); s && s->is_string())
        r.source = std::string(s->as_string());
      if (auto* c = o.if_contains("created_ms"); c && c->is_int64()) r.created_ms = c->as_int64();
      // Stored as they were (parts unchecked), as the old store loaded them:
      // resolve() reports a missing part when the image is used.
      auto put = records_->put(r);
      if (put) {
        ++imported;
      } else if (put.error().code == Code::kConflict) {
        ++kept;  // a previous, interrupted import (or a newer record) wins
      } else {
        Error e = put.error();
        e.context = "import " + path + ": " + e.context;
        return std::unexpected(e);
      }
    }
  }
  // Only after every record is stored: a crash before this imports again.
  const std::string done = path + ".migrated";
  if (::rename(path.c_str(), done.c_str()) != 0)
    return sys_fail("rename(" + path + ", " + done + ")");
  spdlog::info("image store: imported {} image records from {} ({} already stored), renamed to {}",
               imported, path, kept, done);
  return {};
}

std::string ImageStore::layer_path(const std::string& digest) const {
  return root_ + "/layers/sha256/" + digest.substr(7) + "/root";
}

std::string ImageStore::make_tmp_dir(const std::string& prefix) {
  return root_ + "/tmp/" + prefix + "-" + ids::random_hex(8);
}

uint64_t ImageStore::used_bytes() {
  std::lock_guard lk(mu_);
  uint64_t n = 0;
  for (const auto& [d, l] : layers_) n += l.bytes;
  return n;
}

std::shared_ptr<void> ImageStore::pin_locked(const std::vector<std::string>& digests) {
  for (const auto& d : digests) ++pins_[d];
  auto self = shared_from_this();
  // The deleter keeps the store alive and releases the pins.
  return std::shared_ptr<void>(new int(0), [self, digests](void* p) {
    delete static_cast<int*>(p);
    std::lock_guard lk(self->mu_);
    for (const auto& d : digests) {
      auto it = self->pins_.find(d);
      if (it != self->pins_.end() && --it->second == 0) self->pins_.erase(it);
    }
  });
}

Result<LayerInfo> ImageStore::add_layer_stream(const ByteSource& src, const std::string& expect,
                                               const std::string& source,
                                               std::vector<std::shared_ptr<void>>* pins) {
  if (!expect.empty()) {
    if (!valid_layer_digest(expect))
      return fail(Code::kInvalidArgument, "invalid layer digest '" + expect + "'");
    std::lock_guard lk(mu_);
    if (auto it = layers_.find(expect); it != layers_.end()) {
      if (pins) pins->push_back(pin_locked({expect}));
      return it->second;
    }
  }
  const uint32_t ub = opts_.limits.uid_base;
  std::string tmp = make_tmp_dir("unpack");
  TP_TRY(ensure_dir(tmp, 0700, ub));
  struct Cleanup {
    std::string p;
    ~Cleanup() {
      if (!p.empty()) (void)remove_path(p);
    }
  } cleanup{tmp};
  TP_TRY(ensure_dir(tmp + "/root", 0755, ub));
  UniqueFd rootfd(::open((tmp + "/root").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
  if (!rootfd) return sys_fail("open(" + tmp + "/root)");
  UnpackLimits lim = opts_.limits;
  if (opts_.budget_bytes) {
    uint64_t used = used_bytes();
    if (used >= opts_.budget_bytes)
      return fail(Code::kInsufficientStorage, "image store budget of " +
                                                  std::to_string(opts_.budget_bytes) +
                                                  " bytes is used up (run gc or remove images)");
    lim.max_bytes = std::min(lim.max_bytes, opts_.budget_bytes - used);
  }
  auto st = unpack_layer(src, rootfd.get(), lim);
  if (!st) return std::unexpected(st.error());
  if (!expect.empty() && st->diff_id != expect)
    return fail(Code::kInvalidArgument,
                "layer content has " + st->diff_id + " but the image config says " + expect);
  LayerInfo li;
  li.digest = st->diff_id;
  li.path = layer_path(li.digest);
  li.bytes = st->bytes;
  li.entries = st->entries;
  li.created_ms = now_ms();
  li.source = source;
  json::object meta;
  meta["digest"] = li.digest;
  meta["bytes"] = li.bytes;
  meta["entries"] = li.entries;
  meta["created_ms"] = li.created_ms;
  meta["source"] = li.source;
  meta["whiteouts"] = st->whiteouts;
  meta["opaque_dirs"] = st->opaque_dirs;
  meta["xattrs_dropped"] = st->xattrs_dropped;
  TP_TRY(write_file_atomic(tmp + "/layer.json", json::serialize(meta)));
  std::lock_guard lk(mu_);
  if (auto it = layers_.find(li.digest); it != layers_.end()) {
    // Someone stored the same content meanwhile: ours is discarded by cleanup.
    if (pins) pins->push_back(pin_locked({li.digest}));
    return it->second;
  }
  std::string final_dir = root_ + "/layers/sha256/" + li.digest.substr(7);
  if (::rename(tmp.c_str(), final_dir.c_str()) != 0)
    return sys_fail("rename(" + tmp + ", " + final_dir + ")");
  cleanup.p.clear();
  layers_[li.digest] = li;
  if (pins) pins->push_back(pin_locked({li.digest}));
  spdlog::info("image store: stored layer {} ({} bytes, {} entries, from {})", li.digest, li.bytes,
               li.entries, source);
  return li;
}

Result<LayerInfo> ImageStore::add_layer_file(const std::string& path, const std::string& source,
                                             std::vector<std::shared_ptr<void>>* pins) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return sys_fail("open(" + path + ")");
  ByteSource src = fd_source(fd.get());
  return add_layer_stream(src, "", source, pins);
}

Result<LayerInfo> ImageStore::add_layer_dir(const std::string& dir, const std::string& source,
                                            std::vector<std::shared_ptr<void>>* pins) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return sys_fail("stat(" + dir + ")");
  if (!S_ISDIR(st.st_mode)) return fail(Code::kInvalidArgument, dir + " is not a directory");
  std::string base = dir;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  std::string tar = make_tmp_dir("dir") + ".tar";
  struct Cleanup {
    std::string p;
    ~Cleanup() { ::unlink(p.c_str()); }
  } cleanup{tar};
  {
    std::unique_ptr<archive, decltype(&archive_read_free)> disk(archive_read_disk_new(),
                                                                archive_read_free);
    std::unique_ptr<archive, decltype(&archive_write_free)> w(archive_write_new(),
                                                              archive_write_free);
    archive_read_disk_set_symlink_physical(disk.get());
    archive_read_disk_set_behavior(disk.get(), ARCHIVE_READDISK_NO_TRAVERSE_MOUNTS);
    archive_write_set_format_pax_restricted(w.get());
    if (archive_write_open_filename(w.get(), tar.c_str()) != ARCHIVE_OK)
      return fail(Code::kInternal,
                  std::string("archive_write_open(") + tar + "): " + archive_error_string(w.get()));
    if (archive_read_disk_open(disk.get(), base.c_str()) != ARCHIVE_OK)
      return fail(Code::kInvalidArgument, "read " + base + ": " + archive_error_string(disk.get()));
    std::unique_ptr<archive_entry_linkresolver, decltype(&archive_entry_linkresolver_free)> lr(
        archive_entry_linkresolver_new(), archive_entry_linkresolver_free);
    archive_entry_linkresolver_set_strategy(lr.get(), archive_format(w.get()));
    std::unique_ptr<archive_entry, decltype(&archive_entry_free)> e(archive_entry_new(),
                                                                    archive_entry_free);
    for (;;) {
      archive_entry_clear(e.get());
      int r = archive_read_next_header2(disk.get(), e.get());
      if (r == ARCHIVE_EOF) break;
      if (r < ARCHIVE_WARN)
        return fail(Code::kInvalidArgument,
                    "read " + base + ": " + archive_error_string(disk.get()));
      archive_read_disk_descend(disk.get());
      std::string p = archive_entry_pathname(e.get());
      std::string rel = p.size() > base.size() ? p.substr(base.size() + 1) : ".";
      if (rel.empty()) rel = ".";
      archive_entry_set_pathname(e.get(), rel.c_str());
      archive_entry* out = e.get();
      archive_entry* spare = nullptr;
      archive_entry_linkify(lr.get(), &out, &spare);
      if (!out) continue;
      if (archive_write_header(w.get(), out) != ARCHIVE_OK)
        return fail(Code::kInternal, "write tar of " + base + ": " + archive_error_string(w.get()));
      if (archive_entry_filetype(out) == AE_IFREG && !archive_entry_hardlink(out) &&
          archive_entry_size(out) > 0) {
        const void* buf = nullptr;
        size_t len = 0;
        la_int64_t off = 0;
        while (archive_read_data_block(disk.get(), &buf, &len, &off) == ARCHIVE_OK)
          if (archive_write_data(w.get(), buf, len) < 0)
            return fail(Code::kInternal,
                        "write tar of " + base + ": " + archive_error_string(w.get()));
      }
    }
    if (archive_write_close(w.get()) != ARCHIVE_OK)
      return fail(Code::kInternal, "close tar of " + base + ": " + archive_error_string(w.get()));
  }
  return add_layer_file(tar, source.empty() ? "dir:" + base : source, pins);
}

Result<ImageRecord> ImageStore::import_archive(const std::string& path, std::string name,
                                               std::string version, ArchiveKind kind,
                                               PutMode mode) {
  if (!name.empty() && !valid_image_name(name))
    return fail(Code::kInvalidArgument, "invalid image name '" + name + "'");
  if (!version.empty() && !valid_image_version(version))
    return fail(Code::kInvalidArgument, "invalid image version '" + version + "'");
  constexpr uint64_t kSmall = 8ull << 20, kSmallTotal = 64ull << 20;
  std::map<std::string, std::string> small;
  std::set<std::string> members;
  if (kind != ArchiveKind::kLayer) {
    uint64_t total = 0;
    TP_TRY(for_each_member(
        path, [&](archive* a, archive_entry* e, const std::string& n) -> Result<void> {
          if (members.size() > 100000)
            return fail(Code::kPayloadTooLarge, "archive has too many members");
          members.insert(n);
          la_int64_t sz = archive_entry_size(e);
          bool meta_like = n.ends_with(".json") || n == "oci-layout" || n == "repositories" ||
                           n.rfind("blobs/", 0) == 0;
          if (archive_entry_filetype(e) == AE_IFREG && meta_like && sz >= 0 &&
              static_cast<uint64_t>(sz) <= kSmall &&
              total + static_cast<uint64_t>(sz) <= kSmallTotal) {
            std::string data(static_cast<size_t>(sz), '\0');
            la_ssize_t got = sz ? archive_read_data(a, data.data(), data.size()) : 0;
            if (got != sz)
              return fail(Code::kInvalidArgument, "read archive member " + n + ": truncated");
            total += static_cast<uint64_t>(sz);
            small[n] = std::move(data);
          }
          return {};
        }));
    if (kind == ArchiveKind::kAuto) {
      if (small.contains("manifest.json"))
        kind = ArchiveKind::kDocker;
      else if (small.contains("index.json") && members.contains("oci-layout"))
        kind = ArchiveKind::kOci;
      else
        kind = ArchiveKind::kLayer;
    }
  }
  ImageRecord rec;
  std::vector<std::shared_ptr<void>> pins;
  if (kind == ArchiveKind::kLayer) {
    if (name.empty()) return fail(Code::kInvalidArgument, "a plain tar layer needs an image name");
    auto li = add_layer_file(path, "tar", &pins);
    if (!li) return std::unexpected(li.error());
    rec.parts = {li->digest};
    rec.source = "tar";
  } else {
    auto plan = kind == ArchiveKind::kDocker ? plan_docker(small) : plan_oci(small);
    if (!plan) return std::unexpected(plan.error());
    if (plan->layers.empty()) return fail(Code::kInvalidArgument, "the image has no layers");
    if (name.empty() && !plan->tags.empty()) {
      std::string t = plan->tags[0];
      auto slash = t.rfind('/');
      if (slash != std::string::npos) t = t.substr(slash + 1);
      auto c = t.find(':');
      name = t.substr(0, c);
      if (version.empty() && c != std::string::npos) version = t.substr(c + 1);
      if (!valid_image_name(name) || (!version.empty() && !valid_image_version(version)))
        return fail(Code::kInvalidArgument,
                    "the archive's tag '" + plan->tags[0] + "' is not a valid name: give one");
    }
    if (name.empty())
      return fail(Code::kInvalidArgument, "the archive has no tag: give the image a name");
    // Layers already stored (known diff_id) are pinned without reading them.
    std::map<std::string, std::string> digest_of;  // member -> digest
    std::map<std::string, std::string> needed;     // member -> expected diff id
    for (const auto& l : plan->layers) {
      if (!members.contains(l.member))
        return fail(Code::kInvalidArgument, "layer member '" + l.member + "' is missing");
      if (!l.diff_id.empty()) {
        std::lock_guard lk(mu_);
        if (layers_.contains(l.diff_id)) {
          pins.push_back(pin_locked({l.diff_id}));
          digest_of[l.member] = l.diff_id;
          continue;
        }
      }
      needed[l.member] = l.diff_id;
    }
    if (!needed.empty()) {
      TP_TRY(for_each_member(
          path, [&](archive* outer, archive_entry*, const std::string& n) -> Result<void> {
            auto it = needed.find(n);
            if (it == needed.end() || digest_of.contains(n)) return {};
            ByteSource src = [outer](void* buf, size_t len) -> ssize_t {
              return archive_read_data(outer, buf, len);
            };
            auto li = add_layer_stream(src, it->second, "archive:" + n, &pins);
            if (!li) {
              Error er = li.error();
              er.context = "layer " + n + ": " + er.context;
              return std::unexpected(er);
            }
            digest_of[n] = li->digest;
            return {};
          }));
      for (const auto& [m, d] : needed)
        if (!digest_of.contains(m))
          return fail(Code::kInvalidArgument, "layer member '" + m + "' could not be read");
    }
    for (auto it = plan->layers.rbegin(); it != plan->layers.rend(); ++it) {
      const std::string& d = digest_of[it->member];
      if (std::find(rec.parts.begin(), rec.parts.end(), d) == rec.parts.end())
        rec.parts.push_back(d);
    }
    rec.defaults = plan->defaults;
    rec.source = kind == ArchiveKind::kDocker ? "docker-archive" : "oci-archive";
  }
  rec.name = name;
  rec.version = version;
  return put_image(std::move(rec), mode);
}

Result<std::string> ImageStore::next_version(const std::string& name) {
  std::lock_guard lk(mu_);
  return next_version_locked(name);
}

Result<std::string> ImageStore::next_version_locked(const std::string& name) {
  control::ImageQuery q;
  q.name = name;
  auto recs = records_->list(q);
  if (!recs) return std::unexpected(recs.error());
  uint64_t mx = 0;
  for (const auto& r : *recs) {
    const std::string& v = r.version;
    if (!v.empty() && std::all_of(v.begin(), v.end(), ::isdigit) && v.size() < 18)
      mx = std::max<uint64_t>(mx, std::stoull(v));
  }
  return std::to_string(mx + 1);
}

Result<ImageRecord> ImageStore::find_locked(const std::string& ref, const ImageRecord* pending) {
  auto nv = parse_image_ref(ref);
  if (!nv) return std::unexpected(nv.error());
  const auto& [name, version] = *nv;
  auto got = version.empty() ? records_->latest(name) : records_->get(name, version);
  if (!got) return std::unexpected(got.error());
  if (pending && pending->name == name) {
    if (!version.empty() && pending->version == version) return *pending;
    // Latest: the pending record against the stored one it would replace or join.
    if (version.empty() &&
        (!*got || (*got)->version == pending->version || pending->created_ms > (*got)->created_ms ||
         (pending->created_ms == (*got)->created_ms && pending->version > (*got)->version)))
      return *pending;
  }
  if (!*got)
    return fail(Code::kNotFound, version.empty() ? "image '" + name + "' not found"
                                                 : "image '" + ref + "' not found");
  return std::move(**got);
}

Result<void> ImageStore::expand_locked(const ImageRecord& r, int depth,
                                       std::vector<std::string>* digests, ImageDefaults* d,
                                       const ImageRecord* pending) {
  if (depth > 16)
    return fail(Code::kInvalidArgument, "image '" + r.name + "' is composed too deep (a cycle?)");
  ImageDefaults acc;
  // parts are top first; defaults merge bottom to top.
  std::vector<ImageDefaults> part_defaults;
  std::vector<std::string> out;
  for (const auto& p : r.parts) {
    if (p.rfind("sha256:", 0) == 0) {
      if (!layers_.contains(p))
        return fail(Code::kNotFound, "layer " + p + " of image " + r.name + " is missing");
      out.push_back(p);
    } else if (p.rfind("image:", 0) == 0) {
      auto sub = find_locked(p.substr(6), pending);
      if (!sub) return std::unexpected(sub.error());
      ImageDefaults sd;
      TP_TRY(expand_locked(*sub, depth + 1, &out, &sd, pending));
      part_defaults.push_back(std::move(sd));
    } else {
      return fail(Code::kInvalidArgument, "invalid part '" + p + "' of image " + r.name);
    }
  }
  for (auto it = part_defaults.rbegin(); it != part_defaults.rend(); ++it)
    merge_defaults(&acc, *it);
  merge_defaults(&acc, r.defaults);
  for (auto& x : out)
    if (std::find(digests->begin(), digests->end(), x) == digests->end()) digests->push_back(x);
  *d = std::move(acc);
  return {};
}

Result<ImageRecord> ImageStore::put_image(ImageRecord r, PutMode mode) {
  if (!valid_image_name(r.name))
    return fail(Code::kInvalidArgument, "invalid image name '" + r.name + "'");
  if (!r.version.empty() && !valid_image_version(r.version))
    return fail(Code::kInvalidArgument, "invalid image version '" + r.version + "'");
  if (r.parts.empty())
    return fail(Code::kInvalidArgument, "an image needs at least one layer or image part");
  if (r.parts.size() > 128) return fail(Code::kInvalidArgument, "at most 128 parts");
  for (const auto& [k, v] : r.defaults.env)
    if (k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos ||
        v.find('\0') != std::string::npos)
      return fail(Code::kInvalidArgument, "invalid environment variable '" + k + "'");
  if (!r.defaults.workdir.empty() && r.defaults.workdir[0] != '/')
    return fail(Code::kInvalidArgument, "workdir must be absolute");
  std::lock_guard lk(mu_);
  for (const auto& p : r.parts) {
    if (p.rfind("sha256:", 0) == 0) {
      if (!valid_layer_digest(p))
        return fail(Code::kInvalidArgument, "invalid layer digest '" + p + "'");
      if (!layers_.contains(p)) return fail(Code::kNotFound, "layer " + p + " not found");
    } else if (p.rfind("image:", 0) == 0) {
      auto nv = parse_image_ref(p.substr(6));
      if (!nv) return std::unexpected(nv.error());
      if (nv->first == r.name)
        return fail(Code::kInvalidArgument, "image " + r.name + " cannot contain itself");
      auto sub = find_locked(p.substr(6));
      if (!sub) return std::unexpected(sub.error());
    } else {
      return fail(Code::kInvalidArgument,
                  "part '" + p + "' must be sha256:<hex> or image:<name>[:<version>]");
    }
  }
  if (r.created_ms == 0) r.created_ms = now_ms();
  const bool auto_version = r.version.empty();
  // Another writer of the same record store (another daemon) can win a race:
  // an automatic version then moves on, a replace reads the record again.
  for (int attempt = 0;; ++attempt) {
    r.row_version = 0;
    if (auto_version) {
      auto v = next_version_locked(r.name);
      if (!v) return std::unexpected(v.error());
      r.version = *v;
    } else if (mode == PutMode::kReplace) {
      auto old = records_->get(r.name, r.version);
      if (!old) return std::unexpected(old.error());
      if (*old) r.row_version = (*old)->row_version;
    }
    // A composition must resolve (no cycles through other images).
    std::vector<std::string> ds;
    ImageDefaults dd;
    TP_TRY(expand_locked(r, 0, &ds, &dd, &r));
    auto stored = records_->put(r);
    if (stored) {
      r.row_version = *stored;
      return r;
    }
    bool retry = stored.error().code == Code::kConflict &&
                 (auto_version || mode == PutMode::kReplace) && attempt < 8;
    if (!retry) {
      if (stored.error().code == Code::kConflict && mode == PutMode::kCreate)
        return fail(Code::kConflict, "image " + r.name + ":" + r.version +
                                         " already exists (remove it first, or replace it)");
      return std::unexpected(stored.error());
    }
  }
}

Result<ImageRecord> ImageStore::get_image(const std::string& ref) {
  std::lock_guard lk(mu_);
  return find_locked(ref);
}

Result<std::vector<ImageRecord>> ImageStore::images() {
  std::lock_guard lk(mu_);
  return records_->list({});
}

Result<void> ImageStore::remove_image(const std::string& ref) {
  std::lock_guard lk(mu_);
  auto r = find_locked(ref);
  if (!r) return std::unexpected(r.error());
  // Who is made of it: parts naming this version, and parts naming the name
  // alone while this version is the latest.
  std::vector<std::string> names = {"image:" + r->name + ":" + r->version};
  auto latest = records_->latest(r->name);
  if (!latest) return std::unexpected(latest.error());
  if (*latest && (*latest)->version == r->version) names.push_back("image:" + r->name);
  for (const auto& part : names) {
    control::ImageQuery q;
    q.part = part;
    auto users = records_->list(q);
    if (!users) return std::unexpected(users.error());
    for (const auto& u : *users)
      if (!(u.name == r->name && u.version == r->version))
        return fail(Code::kConflict, "image " + u.name + ":" + u.version + " is composed of " +
                                         r->name + ":" + r->version);
  }
  return records_->remove(r->name, r->version, r->row_version);
}

Result<ResolvedLayers> ImageStore::resolve(const std::string& ref) {
  std::lock_guard lk(mu_);
  ResolvedLayers out;
  if (ref.rfind("layers:", 0) == 0) {
    std::string list = ref.substr(7);
    size_t i = 0;
    while (i <= list.size()) {
      size_t j = list.find(',', i);
      if (j == std::string::npos) j = list.size();
      std::string d = list.substr(i, j - i);
      if (!valid_layer_digest(d))
        return fail(Code::kInvalidArgument, "invalid layer digest '" + d + "' in '" + ref + "'");
      if (!layers_.contains(d)) return fail(Code::kNotFound, "layer " + d + " not found");
      if (std::find(out.digests.begin(), out.digests.end(), d) == out.digests.end())
        out.digests.push_back(d);
      i = j + 1;
    }
    if (out.digests.empty()) return fail(Code::kInvalidArgument, "empty layer list");
  } else {
    auto r = find_locked(ref);
    if (!r) return std::unexpected(r.error());
    TP_TRY(expand_locked(*r, 0, &out.digests, &out.defaults));
  }
  if (out.digests.size() > 128) return fail(Code::kInvalidArgument, "more than 128 layers");
  for (const auto& d : out.digests) {
    out.paths.push_back(layer_path(d));
    out.bytes += layers_.at(d).bytes;
  }
  out.pin = pin_locked(out.digests);
  return out;
}

Result<std::string> ImageStore::layer_dir(const std::string& digest) {
  if (!valid_layer_digest(digest))
    return fail(Code::kInvalidArgument, "invalid layer digest '" + digest + "'");
  std::lock_guard lk(mu_);
  if (!layers_.contains(digest)) return fail(Code::kNotFound, "layer " + digest + " not found");
  return layer_path(digest);
}

Result<LayerInfo> ImageStore::layer(const std::string& digest) {
  std::lock_guard lk(mu_);
  auto it = layers_.find(digest);
  if (it == layers_.end()) return fail(Code::kNotFound, "layer " + digest + " not found");
  auto refs = records_->part_counts();
  if (!refs) return std::unexpected(refs.error());
  LayerInfo li = it->second;
  li.image_refs = refs->contains(digest) ? refs->at(digest) : 0;
  li.pins = pins_.contains(digest) ? pins_[digest] : 0;
  return li;
}

Result<std::vector<LayerInfo>> ImageStore::layers() {
  std::lock_guard lk(mu_);
  auto refs = records_->part_counts();
  if (!refs) return std::unexpected(refs.error());
  std::vector<LayerInfo> out;
  for (const auto& [d, l] : layers_) {
    LayerInfo li = l;
    li.image_refs = refs->contains(d) ? refs->at(d) : 0;
    li.pins = pins_.contains(d) ? pins_[d] : 0;
    out.push_back(li);
  }
  return out;
}

Result<GcReport> ImageStore::gc() {
  GcReport rep;
  std::vector<std::string> doomed;
  {
    std::lock_guard lk(mu_);
    // Under the lock: no record naming a layer can be written meanwhile.
    auto counted = records_->part_counts();
    if (!counted) return std::unexpected(counted.error());
    const auto& refs = *counted;
    for (auto it = layers_.begin(); it != layers_.end();) {
      const std::string& d = it->first;
      bool pinned = pins_.contains(d) && pins_[d] > 0;
      if (refs.contains(d) || pinned) {
        ++rep.kept;
        if (!refs.contains(d)) ++rep.pinned_unreferenced;
        ++it;
        continue;
      }
      // Out of the store first (under the lock), deleted afterwards.
      std::string from = root_ + "/layers/sha256/" + d.substr(7);
      std::string to = make_tmp_dir("gc");
      if (::rename(from.c_str(), to.c_str()) != 0)
        return sys_fail("rename(" + from + ", " + to + ")");
      rep.removed.push_back(d);
      rep.freed_bytes += it->second.bytes;
      doomed.push_back(to);
      it = layers_.erase(it);
    }
  }
  for (const auto& p : doomed) {
    auto r = remove_path(p);
    if (!r) spdlog::warn("image gc: cannot remove {}: {}", p, r.error().message());
  }
  if (!rep.removed.empty())
    spdlog::info("image gc: removed {} layers, {} bytes", rep.removed.size(), rep.freed_bytes);
  return rep;
}

}  // namespace tp::image
