#include "image/host_image.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <mutex>

#include "common/ids.h"
#include "sys/fd.h"

namespace tp::image {
namespace {

namespace fs = std::filesystem;
constexpr const char* kMarker = ".tp-host-image-v1";

Result<void> mkdir_owned(const std::string& p, mode_t mode, uint32_t uid) {
  if (::mkdir(p.c_str(), mode) != 0 && errno != EEXIST) return sys_fail("mkdir(" + p + ")");
  // Through an fd opened without following links: never chmod or chown what a
  // symlink in the skeleton points at.
  sys::UniqueFd fd(::open(p.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) return sys_fail("open(" + p + ", O_DIRECTORY|O_NOFOLLOW)");
  if (::fchmod(fd.get(), mode) != 0) return sys_fail("fchmod(" + p + ")");
  if (::fchown(fd.get(), uid, uid) != 0)
    return sys_fail("fchown(" + p + ", " + std::to_string(uid) + ")");
  return {};
}

Result<void> write_owned(const std::string& p, const std::string& text, mode_t mode, uint32_t uid) {
  sys::UniqueFd fd(::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode));
  if (!fd) return sys_fail("open(" + p + ", O_CREAT)");
  if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()))
    return sys_fail("write(" + p + ")");
  if (::fchmod(fd.get(), mode) != 0) return sys_fail("fchmod(" + p + ")");
  if (::fchown(fd.get(), uid, uid) != 0) return sys_fail("fchown(" + p + ")");
  return {};
}

Result<void> symlink_owned(const std::string& target, const std::string& p, uint32_t uid) {
  if (::symlink(target.c_str(), p.c_str()) != 0)
    return sys_fail("symlink(" + target + ", " + p + ")");
  if (::lchown(p.c_str(), uid, uid) != 0) return sys_fail("lchown(" + p + ")");
  return {};
}

// Copies regular files, directories and symlinks (as links); skips anything else.
Result<void> copy_tree(const std::string& src, const std::string& dst, uint32_t uid) {
  struct stat st {};
  if (::lstat(src.c_str(), &st) != 0) {
    if (errno == ENOENT) return {};
    return sys_fail("lstat(" + src + ")");
  }
  if (S_ISLNK(st.st_mode)) {
    char buf[4096];
    ssize_t n = ::readlink(src.c_str(), buf, sizeof buf - 1);
    if (n < 0) return sys_fail("readlink(" + src + ")");
    return symlink_owned(std::string(buf, static_cast<size_t>(n)), dst, uid);
  }
  if (S_ISDIR(st.st_mode)) {
    TP_TRY(mkdir_owned(dst, st.st_mode & 07777, uid));
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(src, ec)) {
      TP_TRY(copy_tree(e.path().string(), dst + "/" + e.path().filename().string(), uid));
    }
    if (ec) return std::unexpected(Error{Code::kInternal, ec.value(), "readdir(" + src + ")"});
    return {};
  }
  if (S_ISREG(st.st_mode)) {
    sys::UniqueFd in(::open(src.c_str(), O_RDONLY | O_CLOEXEC));
    if (!in) return sys_fail("open(" + src + ")");
    std::string data;
    char buf[65536];
    for (;;) {
      ssize_t n = ::read(in.get(), buf, sizeof buf);
      if (n < 0) return sys_fail("read(" + src + ")");
      if (n == 0) break;
      data.append(buf, static_cast<size_t>(n));
    }
    return write_owned(dst, data, st.st_mode & 0777, uid);
  }
  return {};
}

Result<void> build(const std::string& root, uint32_t uid, std::vector<std::string>* binds) {
  TP_TRY(mkdir_owned(root, 0755, uid));
  struct D {
    const char* p;
    mode_t m;
  };
  for (D d : {D{"usr", 0755}, D{"etc", 0755}, D{"proc", 0555}, D{"dev", 0755}, D{"sys", 0555},
              D{"tmp", 01777}, D{"root", 0700}, D{"home", 0755}, D{"var", 0755},
              D{"var/tmp", 01777}, D{"var/log", 0755}, D{"var/cache", 0755}, D{"var/lib", 0755},
              D{"run", 0755}, D{"mnt", 0755}, D{"opt", 0755}, D{"srv", 0755}, D{"etc/ssl", 0755}}) {
    TP_TRY(mkdir_owned(root + "/" + d.p, d.m, uid));
  }
  // Merged /usr: mirror the host's links; on split hosts bind the directory.
  for (const char* top : {"bin", "sbin", "lib", "lib32", "lib64", "libx32"}) {
    std::string h = std::string("/") + top;
    struct stat st {};
    if (::lstat(h.c_str(), &st) != 0) continue;
    if (S_ISLNK(st.st_mode)) {
      TP_TRY(copy_tree(h, root + "/" + top, uid));
    } else if (S_ISDIR(st.st_mode)) {
      TP_TRY(mkdir_owned(root + "/" + top, 0755, uid));
      binds->push_back(h);
    }
  }
  const std::string etc = root + "/etc/";
  TP_TRY(write_owned(etc + "passwd",
                     "root:x:0:0:root:/root:/bin/sh\n"
                     "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
                     0644, uid));
  TP_TRY(write_owned(etc + "group", "root:x:0:\ntty:x:5:\nnogroup:x:65534:\n", 0644, uid));
  TP_TRY(write_owned(etc + "hosts",
                     "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n", 0644,
                     uid));
  TP_TRY(write_owned(etc + "resolv.conf", "nameserver 127.0.0.1\n", 0644, uid));
  TP_TRY(
      write_owned(etc + "nsswitch.conf",
                  "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\n"
                  "protocols: files\nservices: files\n",
                  0644, uid));
  TP_TRY(write_owned(etc + "hostname", "sandbox\n", 0644, uid));
  // Public host files that dynamic programs, python3 and TLS clients need. No secrets:
  // shadow, gshadow, ssl/private, ssh and everything under /root and /home stay out.
  for (const char* f :
       {"ld.so.cache", "ld.so.conf",   "ld.so.conf.d",   "os-release",      "localtime",
        "timezone",    "alternatives", "ssl/certs",      "ssl/openssl.cnf", "ca-certificates.conf",
        "python3",     "python3.11",   "debian_version", "mime.types",      "profile",
        "bash.bashrc", "inputrc",      "protocols",      "services",        "login.defs",
        "environment"}) {
    TP_TRY(copy_tree(std::string("/etc/") + f, etc + f, uid));
  }
  return write_owned(root + "/" + kMarker, "1\n", 0644, uid);
}

std::mutex g_build_mu;

}  // namespace

Result<HostImage> ensure_host_image(const std::string& data_dir, uint32_t uid_base) {
  HostImage img;
  img.rootfs = data_dir + "/images/host/rootfs";
  img.ro_binds.push_back("/usr");
  for (const char* top : {"bin", "sbin", "lib", "lib32", "lib64", "libx32"}) {
    struct stat st {};
    std::string h = std::string("/") + top;
    if (::lstat(h.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) img.ro_binds.push_back(h);
  }
  std::lock_guard lock(g_build_mu);
  if (::access((img.rootfs + "/" + kMarker).c_str(), F_OK) == 0) return img;

  for (const std::string& d : {data_dir + "/images", data_dir + "/images/host"}) {
    if (::mkdir(d.c_str(), 0755) != 0 && errno != EEXIST) return sys_fail("mkdir(" + d + ")");
  }
  // Leftovers of a build that crashed midway.
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(data_dir + "/images/host", ec)) {
    if (e.path().filename().string().starts_with("rootfs.tmp-")) fs::remove_all(e.path(), ec);
  }
  std::string tmp = data_dir + "/images/host/rootfs.tmp-" + ids::random_hex(6);
  std::vector<std::string> binds;
  auto r = build(tmp, uid_base, &binds);
  if (r) {
    fs::remove_all(img.rootfs, ec);  // a rootfs without marker is a half-built leftover
    if (::rename(tmp.c_str(), img.rootfs.c_str()) != 0)
      r = sys_fail("rename(" + tmp + ", " + img.rootfs + ")");
  }
  if (!r) {
    fs::remove_all(tmp, ec);
    return std::unexpected(r.error());
  }
  return img;
}

}  // namespace tp::image
