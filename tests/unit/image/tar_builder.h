// Test helper: builds tar archives in memory with libarchive (hostile ones too).
#pragma once

#include <archive.h>
#include <archive_entry.h>

#include <string>
#include <utility>
#include <vector>

namespace tp::image::testing {

struct TarEntry {
  std::string name;
  unsigned type = AE_IFREG;
  unsigned perm = 0644;
  std::string data;
  std::string link;  // symlink target or hard link target
  bool hard = false;
  int64_t uid = 0, gid = 0;
  unsigned rmaj = 0, rmin = 0;
  std::vector<std::pair<std::string, std::string>> xattrs;
};

inline TarEntry file(std::string n, std::string d, unsigned perm = 0644) {
  TarEntry e;
  e.name = std::move(n);
  e.data = std::move(d);
  e.perm = perm;
  return e;
}
inline TarEntry dir(std::string n, unsigned perm = 0755) {
  TarEntry e;
  e.name = std::move(n);
  e.type = AE_IFDIR;
  e.perm = perm;
  return e;
}
inline TarEntry symlink(std::string n, std::string target) {
  TarEntry e;
  e.name = std::move(n);
  e.type = AE_IFLNK;
  e.perm = 0777;
  e.link = std::move(target);
  return e;
}
inline TarEntry hardlink(std::string n, std::string target) {
  TarEntry e;
  e.name = std::move(n);
  e.hard = true;
  e.link = std::move(target);
  return e;
}

// filter: "" (plain), "gzip", "zstd".
inline std::string make_tar(const std::vector<TarEntry>& entries, const std::string& filter = "") {
  std::string out;
  archive* a = archive_write_new();
  archive_write_set_format_pax(a);
  if (filter == "gzip") archive_write_add_filter_gzip(a);
  if (filter == "zstd") archive_write_add_filter_zstd(a);
  archive_write_set_bytes_in_last_block(a, 1);
  archive_write_open2(
      a, &out, nullptr,
      [](archive*, void* ud, const void* buf, size_t n) -> la_ssize_t {
        static_cast<std::string*>(ud)->append(static_cast<const char*>(buf), n);
        return static_cast<la_ssize_t>(n);
      },
      nullptr, nullptr);
  for (const auto& t : entries) {
    archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, t.name.c_str());
    archive_entry_set_uid(e, t.uid);
    archive_entry_set_gid(e, t.gid);
    archive_entry_set_mtime(e, 1700000000, 0);
    if (t.hard) {
      archive_entry_set_filetype(e, AE_IFREG);
      archive_entry_set_perm(e, t.perm);
      archive_entry_set_hardlink(e, t.link.c_str());
      archive_entry_set_size(e, 0);
    } else {
      archive_entry_set_filetype(e, t.type);
      archive_entry_set_perm(e, t.perm);
      if (t.type == AE_IFLNK) archive_entry_set_symlink(e, t.link.c_str());
      if (t.type == AE_IFCHR || t.type == AE_IFBLK) {
        archive_entry_set_rdevmajor(e, t.rmaj);
        archive_entry_set_rdevminor(e, t.rmin);
      }
      archive_entry_set_size(e, t.type == AE_IFREG ? static_cast<la_int64_t>(t.data.size()) : 0);
    }
    for (const auto& [k, v] : t.xattrs)
      archive_entry_xattr_add_entry(e, k.c_str(), v.data(), v.size());
    archive_write_header(a, e);
    if (!t.hard && t.type == AE_IFREG && !t.data.empty())
      archive_write_data(a, t.data.data(), t.data.size());
    archive_entry_free(e);
  }
  archive_write_close(a);
  archive_write_free(a);
  return out;
}

// An outer (docker-save / OCI) archive of named members.
inline std::string make_archive(const std::vector<std::pair<std::string, std::string>>& members) {
  std::vector<TarEntry> es;
  for (const auto& [n, d] : members) es.push_back(file(n, d));
  return make_tar(es);
}

}  // namespace tp::image::testing
