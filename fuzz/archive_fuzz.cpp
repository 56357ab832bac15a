// libFuzzer harness for image import (src/image): hostile layer tarballs and
// hostile image archives.
//
// The first input byte picks the path; the rest is the archive:
//  even: image::unpack_layer of the bytes (any compression) into a fresh
//        directory that has an empty sibling; afterwards the sibling must still
//        be empty and nothing but the two may exist in the base directory
//        (nothing written outside the target);
//  odd:  ImageStore::import_archive of the bytes as an archive file (docker
//        save / OCI layout / plain layer: plan_docker, plan_oci, the image
//        config and every layer) into a private data directory.
// Everything lives under one temporary directory that is emptied after every
// input and removed at exit. Runs as root (unpacking chowns and mknods).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "common/log.h"
#include "control/memory_image_store.h"
#include "image/image_store.h"
#include "image/layer_unpack.h"
#include "image/oci_archive.h"

namespace {

namespace fs = std::filesystem;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "archive_fuzz: oracle failed: %s\n", what);
    std::abort();
  }
}

struct Scratch {
  std::string base;
  Scratch() {
    // /dev/shm when it exists: the harness writes and removes trees at a high rate.
    std::string parent = fs::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
    std::string tmpl = parent + "/tp-archive-fuzz-XXXXXX";
    if (!::mkdtemp(tmpl.data())) std::abort();
    base = tmpl;
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(base, ec);
  }
  void clear() {
    std::error_code ec;
    for (auto& e : fs::directory_iterator(base, ec)) {
      // remove_tree_at does not follow symlinks (a fuzzed layer may plant them).
      int fd = ::open(base.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      auto r = tp::image::remove_tree_at(fd, e.path().filename().string());
      ::close(fd);
      check(r.has_value(), "cleanup of the scratch directory failed");
    }
  }
};

Scratch& scratch() {
  static Scratch s;
  return s;
}

tp::image::UnpackLimits limits() {
  tp::image::UnpackLimits lim;
  lim.max_bytes = 16u << 20;
  lim.max_entries = 20000;
  lim.reserve_bytes = 0;
  return lim;
}

void unpack(const uint8_t* data, size_t size) {
  const std::string& base = scratch().base;
  ::mkdir((base + "/root").c_str(), 0755);
  ::mkdir((base + "/outside").c_str(), 0755);
  int fd = ::open((base + "/root").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  check(fd >= 0, "open root");
  size_t off = 0;
  tp::image::ByteSource src = [&](void* buf, size_t n) -> ssize_t {
    size_t k = std::min(n, size - off);
    std::memcpy(buf, data + off, k);
    off += k;
    return static_cast<ssize_t>(k);
  };
  auto r = tp::image::unpack_layer(src, fd, limits());
  ::close(fd);
  if (r) check(r->diff_id.size() == 71 && r->diff_id.rfind("sha256:", 0) == 0, "diff_id format");
  check(fs::is_empty(base + "/outside"), "unpack wrote outside its directory");
  size_t n = 0;
  for (auto& e : fs::directory_iterator(base)) {
    (void)e;
    ++n;
  }
  check(n == 2, "unpack created something next to its directory");
  scratch().clear();
}

void import(const uint8_t* data, size_t size) {
  const std::string& base = scratch().base;
  std::string file = base + "/in.tar";
  {
    std::ofstream out(file, std::ios::binary);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  tp::image::StoreOptions opts;
  opts.data_dir = base + "/data";
  opts.limits = limits();
  auto st =
      tp::image::ImageStore::open(opts, std::make_shared<tp::control::MemoryImageRecordStore>());
  check(st.has_value(), "ImageStore::open");
  auto rec = (*st)->import_archive(file, "", "", tp::image::ArchiveKind::kAuto,
                                   tp::image::PutMode::kReplace);
  if (!rec)
    rec = (*st)->import_archive(file, "fuzz", "1", tp::image::ArchiveKind::kLayer,
                                tp::image::PutMode::kReplace);
  st->reset();
  scratch().clear();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tp::log::init("off");
  if (::geteuid() != 0) {
    std::fprintf(stderr, "archive_fuzz: needs root (unpacking chowns and mknods)\n");
    std::exit(2);
  }
  (void)scratch();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > (4u << 20)) return -1;
  if (data[0] & 1)
    import(data + 1, size - 1);
  else
    unpack(data + 1, size - 1);
  return 0;
}
