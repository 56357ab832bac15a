// Safe layer unpacking (src/image/layer_unpack.h): path rules, whiteout
// conversion, ownership shifting, and hostile archives refused without
// writing outside the target. Unpacking needs root (chown, mknod).
#include "image/layer_unpack.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "sys/fd.h"
#include "tar_builder.h"

namespace tp::image {
namespace {

namespace fs = std::filesystem;
using namespace tp::image::testing;

std::string sha256(const std::string& s) {
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  EVP_Digest(s.data(), s.size(), d, &len, EVP_sha256(), nullptr);
  std::string h = "sha256:";
  static const char* hex = "0123456789abcdef";
  for (unsigned i = 0; i < len; ++i) {
    h += hex[d[i] >> 4];
    h += hex[d[i] & 15];
  }
  return h;
}

class UnpackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root";
    char tmpl[] = "/tmp/tp-unpack-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    base_ = tmpl;
    root_ = base_ + "/root";
    outside_ = base_ + "/outside";
    fs::create_directories(root_);
    fs::create_directories(outside_);
    fd_.reset(::open(root_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(fd_);
  }
  void TearDown() override {
    fd_.reset();
    if (!base_.empty()) fs::remove_all(base_);
  }
  Result<UnpackStats> unpack(const std::string& tar, UnpackLimits lim = {}) {
    size_t off = 0;
    ByteSource src = [&](void* buf, size_t n) -> ssize_t {
      size_t k = std::min(n, tar.size() - off);
      std::memcpy(buf, tar.data() + off, k);
      off += k;
      return static_cast<ssize_t>(k);
    };
    lim.reserve_bytes = 0;
    return unpack_layer(src, fd_.get(), lim);
  }
  bool outside_empty() { return fs::is_empty(outside_); }

  std::string base_, root_, outside_;
  sys::UniqueFd fd_;
};

TEST(SplitEntryPath, NormalizesAndRefuses) {
  EXPECT_EQ(*split_entry_path("./a//b/./c/"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_TRUE(split_entry_path("./")->empty());
  EXPECT_TRUE(split_entry_path(".")->empty());
  EXPECT_FALSE(split_entry_path("/etc/passwd"));
  EXPECT_FALSE(split_entry_path("a/../../b"));
  EXPECT_FALSE(split_entry_path(".."));
  EXPECT_FALSE(split_entry_path(""));
  EXPECT_FALSE(split_entry_path(std::string(300, 'x')));
  EXPECT_TRUE(split_entry_path("..a/b..")) << "names that merely contain dots are fine";
  std::string deep;
  for (int i = 0; i < 300; ++i) deep += "d/";
  EXPECT_FALSE(split_entry_path(deep));
}

TEST_F(UnpackTest, RegularTreeWithShiftedOwnersLinksAndDiffId) {
  TarEntry owned = file("home/u/f", "mine");
  owned.uid = owned.gid = 1000;
  TarEntry x = file("x", "xattr");
  x.xattrs = {{"user.keep", "1"},
              {"user.overlay.redirect", "/etc"},
              {"trusted.overlay.opaque", "y"},
              {"security.capability", "zz"}};
  std::string tar = make_tar({dir("bin"), file("bin/tool", "#!/bin/sh\n", 04755),
                              symlink("bin/sh", "/bin/busybox"), symlink("abs", "/etc/shadow"),
                              owned, hardlink("bin/tool2", "bin/tool"), x});
  auto st = unpack(tar);
  ASSERT_TRUE(st) << st.error().message();
  EXPECT_EQ(st->diff_id, sha256(tar));
  EXPECT_EQ(st->entries, 7u);
  struct stat s {};
  ASSERT_EQ(lstat((root_ + "/bin/tool").c_str(), &s), 0);
  EXPECT_EQ(s.st_uid, 100000u);
  EXPECT_EQ(s.st_mode & 07777, 04755u) << "setuid kept, owned by the shifted root";
  ASSERT_EQ(lstat((root_ + "/home/u/f").c_str(), &s), 0);
  EXPECT_EQ(s.st_uid, 101000u);
  EXPECT_EQ(s.st_gid, 101000u);
  ASSERT_EQ(lstat((root_ + "/home").c_str(), &s), 0);
  EXPECT_EQ(s.st_uid, 100000u) << "implicit parents belong to the sandbox root";
  ASSERT_EQ(lstat((root_ + "/bin/sh").c_str(), &s), 0);
  EXPECT_TRUE(S_ISLNK(s.st_mode));
  EXPECT_EQ(s.st_uid, 100000u);
  EXPECT_EQ(fs::read_symlink(root_ + "/abs"), "/etc/shadow") << "symlinks are kept as they are";
  struct stat a {
  }, b{};
  ASSERT_EQ(stat((root_ + "/bin/tool").c_str(), &a), 0);
  ASSERT_EQ(stat((root_ + "/bin/tool2").c_str(), &b), 0);
  EXPECT_EQ(a.st_ino, b.st_ino);
  char v[16];
  EXPECT_EQ(getxattr((root_ + "/x").c_str(), "user.keep", v, sizeof v), 1);
  EXPECT_LT(getxattr((root_ + "/x").c_str(), "user.overlay.redirect", v, sizeof v), 0);
  EXPECT_LT(getxattr((root_ + "/x").c_str(), "trusted.overlay.opaque", v, sizeof v), 0);
  EXPECT_GE(st->xattrs_dropped, 3u);  // pax archives may carry each twice (SCHILY and LIBARCHIVE)
}

TEST_F(UnpackTest, WhiteoutsAndOpaqueDirsBecomeOverlayObjects) {
  TarEntry wh0 = TarEntry{};
  wh0.name = "etc/gone-too";
  wh0.type = AE_IFCHR;  // an overlay-style whiteout in the tar itself
  auto st = unpack(make_tar({dir("etc"), file("etc/.wh.passwd", ""), dir("etc/conf"),
                             file("etc/conf/.wh..wh..opq", ""), file("etc/conf/new", "n"), wh0},
                            "gzip"));
  ASSERT_TRUE(st) << st.error().message();
  EXPECT_EQ(st->whiteouts, 2u);
  EXPECT_EQ(st->opaque_dirs, 1u);
  struct stat s {};
  ASSERT_EQ(lstat((root_ + "/etc/passwd").c_str(), &s), 0);
  EXPECT_TRUE(S_ISCHR(s.st_mode));
  EXPECT_EQ(s.st_rdev, makedev(0, 0));
  EXPECT_EQ(s.st_uid, 100000u);
  EXPECT_FALSE(fs::exists(root_ + "/etc/.wh.passwd"));
  char v[4] = {};
  EXPECT_EQ(getxattr((root_ + "/etc/conf").c_str(), "user.overlay.opaque", v, sizeof v), 1);
  EXPECT_EQ(v[0], 'y');
  EXPECT_FALSE(fs::exists(root_ + "/etc/conf/.wh..wh..opq"));
  ASSERT_EQ(lstat((root_ + "/etc/gone-too").c_str(), &s), 0);
  EXPECT_TRUE(S_ISCHR(s.st_mode));
}

TEST_F(UnpackTest, SameDigestWhateverTheCompression) {
  std::vector<TarEntry> es = {dir("a"), file("a/b", std::string(100000, 'q'))};
  std::string plain = make_tar(es);
  auto p = unpack(plain);
  ASSERT_TRUE(p) << p.error().message();
  fs::remove_all(root_);
  fs::create_directories(root_);
  fd_.reset(::open(root_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  auto z = unpack(make_tar(es, "zstd"));
  ASSERT_TRUE(z) << z.error().message();
  EXPECT_EQ(p->diff_id, z->diff_id);
}

TEST_F(UnpackTest, HostileEntriesAreRefusedAndNothingEscapes) {
  struct Case {
    const char* what;
    std::vector<TarEntry> entries;
    const char* words;
  };
  TarEntry blk;
  blk.name = "dev/sda";
  blk.type = AE_IFBLK;
  blk.rmaj = 8;
  TarEntry chr;
  chr.name = "dev/mem";
  chr.type = AE_IFCHR;
  chr.rmaj = 1;
  chr.rmin = 1;
  TarEntry big = file("f", "x");
  big.uid = 65536;
  std::vector<Case> cases = {
      {"absolute", {file(outside_ + "/abs", "x")}, "absolute"},
      {"dotdot", {file("../outside/dotdot", "x")}, "'..'"},
      {"dotdot-deep", {dir("a"), file("a/../../outside/x", "x")}, "'..'"},
      {"symlink-then-write", {symlink("esc", outside_), file("esc/through", "x")}, "symlink"},
      {"symlink-relative", {symlink("esc", "../outside"), file("esc/through", "x")}, "symlink"},
      {"symlink-dir-then-dir", {symlink("d", outside_), dir("d/sub")}, "symlink"},
      {"hardlink-out", {hardlink("h", "../outside/target")}, "hard link"},
      {"hardlink-abs", {hardlink("h", "/etc/passwd")}, "hard link"},
      {"hardlink-through-symlink",
       {symlink("l", outside_), hardlink("h", "l/target")},
       "hard link"},
      // Inside by their written names: s/t -> . makes s/t/t/t/ be s/, whose ../.. is
      // beside the root (the chain that escaped the SDK's unpacker).
      {"symlink-chain-then-hardlink",
       {dir("s"), symlink("s/t", "."), symlink("s/t/t/t/u", "../../outside"),
        hardlink("h", "s/t/t/t/u/target"), file("h", "pwned")},
       "symlink"},
      {"block-device", {blk}, "device"},
      {"char-device", {chr}, "device"},
      {"uid-beyond-range", {big}, "outside"},
      {"wh-meta", {file(".wh..wh.plnk", "")}, "whiteout"},
  };
  std::ofstream(outside_ + "/target") << "secret";
  for (const auto& c : cases) {
    auto r = unpack(make_tar(c.entries));
    ASSERT_FALSE(r) << c.what;
    EXPECT_EQ(r.error().code, Code::kInvalidArgument) << c.what;
    EXPECT_NE(r.error().message().find(c.words), std::string::npos)
        << c.what << ": " << r.error().message();
    EXPECT_EQ(fs::directory_iterator(outside_)->path().filename(), "target") << c.what;
    EXPECT_EQ(std::distance(fs::directory_iterator(outside_), fs::directory_iterator()), 1)
        << c.what;
    std::ifstream in(outside_ + "/target");
    std::string s;
    in >> s;
    EXPECT_EQ(s, "secret") << c.what;
    EXPECT_EQ(fs::hard_link_count(outside_ + "/target"), 1u) << c.what;
  }
}

TEST_F(UnpackTest, SetuidPolicyCanRefuse) {
  UnpackLimits lim;
  lim.refuse_setuid = true;
  auto r = unpack(make_tar({file("su", "x", 04755)}), lim);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("setuid"), std::string::npos);
}

TEST_F(UnpackTest, BombsAndBudgetsAreRefused) {
  // 64 MiB of zeros compress to ~64 KiB: the apparent-size cap stops it at the header.
  UnpackLimits lim;
  lim.max_bytes = 1 << 20;
  auto r = unpack(make_tar({file("zeros", std::string(64 << 20, '\0'))}, "gzip"), lim);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kPayloadTooLarge);
  EXPECT_NE(r.error().message().find("limit"), std::string::npos);
  // Many small entries: the entry cap.
  std::vector<TarEntry> many;
  for (int i = 0; i < 50; ++i) many.push_back(file("f" + std::to_string(i), ""));
  lim = {};
  lim.max_entries = 10;
  r = unpack(make_tar(many), lim);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kPayloadTooLarge);
  // The decompressed stream cap (e.g. megabytes of long names or padding).
  lim = {};
  lim.max_stream_bytes = 8192;
  r = unpack(make_tar(many, "gzip"), lim);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kPayloadTooLarge);
  // The disk reserve: more than the file system has free.
  lim = {};
  lim.reserve_bytes = 1ull << 62;
  size_t off = 0;
  std::string tar = make_tar({file("a", std::string(16 << 20, 'a'))});
  ByteSource src = [&](void* buf, size_t n) -> ssize_t {
    size_t k = std::min(n, tar.size() - off);
    std::memcpy(buf, tar.data() + off, k);
    off += k;
    return static_cast<ssize_t>(k);
  };
  r = unpack_layer(src, fd_.get(), lim);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kInsufficientStorage);
}

TEST_F(UnpackTest, GarbageIsAClearError) {
  auto r = unpack(std::string(5000, 'z'));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kInvalidArgument);
  auto e = unpack("");
  ASSERT_TRUE(e) << "an empty stream is an empty layer: " << e.error().message();
}

TEST_F(UnpackTest, LaterEntriesReplaceEarlierOnes) {
  auto r = unpack(make_tar({file("a", "1"), dir("a"), file("a/b", "2"), file("a", "3")}));
  ASSERT_TRUE(r) << r.error().message();
  std::ifstream in(root_ + "/a");
  std::string s;
  in >> s;
  EXPECT_EQ(s, "3");
}

}  // namespace
}  // namespace tp::image
