// Image builds (src/image/builder.h): spec parsing, the mmdebstrap argv, and
// the staging of a spec's files with the caller's permissions. The real
// mmdebstrap builds run in tests/integration/test_images.py and
// tests/hostile/test_build_escape.py (slow). Staging tests need root.
#include "image/builder.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "control/memory_image_store.h"

namespace tp::image {
namespace {

namespace fs = std::filesystem;

TEST(BuildSpec, ParsesValidatesAndMakesArgv) {
  auto s = parse_build_spec(R"({"name":"py","suite":"bookworm","variant":"essential",
    "packages":["python3-minimal"],"files":[{"src":"/etc/hostname","dst":"/opt/x"}],
    "run":["echo 'hi' > /f"],"env":{"A":"1"},"cmd":["python3"]})");
  ASSERT_TRUE(s) << s.error().message();
  auto argv = mmdebstrap_argv(*s, "/o.tar", "/b/stage");
  EXPECT_EQ(argv[0], "mmdebstrap");
  EXPECT_NE(std::find(argv.begin(), argv.end(), "--mode=unshare"), argv.end());
  EXPECT_EQ(std::find(argv.begin(), argv.end(), "--mode=root"), argv.end());
  EXPECT_NE(std::find(argv.begin(), argv.end(), "--include=python3-minimal"), argv.end());
  EXPECT_NE(std::find(argv.begin(), argv.end(), "--variant=essential"), argv.end());
  EXPECT_EQ(argv[argv.size() - 3], "bookworm");
  EXPECT_EQ(argv[argv.size() - 2], "/o.tar");
  bool hook = false;
  for (const auto& a : argv) {
    hook = hook ||
           (a.find("--customize-hook=unshare --fork --kill-child") == 0 &&
            a.find("--net") != std::string::npos && a.find("pivot_root") != std::string::npos &&
            a.find("chroot") == std::string::npos &&
            a.find("'echo '\\''hi'\\'' > /f'") != std::string::npos);
    EXPECT_EQ(a.find("/etc/hostname"), std::string::npos)
        << "the build never names the host path: " << a;
  }
  EXPECT_TRUE(hook) << "commands run pivoted into the root in new namespaces, quoted for sh";
  EXPECT_NE(std::find(argv.begin(), argv.end(),
                      "--customize-hook=copy-in '/b/stage/0/hostname' '/opt/x'"),
            argv.end());
  auto k1 = build_cache_key(*s, {"d1"});
  EXPECT_EQ(k1, build_cache_key(*s, {"d1"}));
  EXPECT_NE(k1, build_cache_key(*s, {"d2"})) << "the files' content is part of the key";
  s->packages.push_back("git");
  EXPECT_NE(k1, build_cache_key(*s, {"d1"}));
  for (const char* bad :
       {R"({"name":"x","packages":["a;rm -rf /"]})", R"({"name":"x","suite":"a b"})",
        R"({"name":"x","mirror":"ftp://x"})", R"({"name":"x","files":[{"src":"rel","dst":"/a"}]})",
        R"({"name":"x","files":[{"src":"/a","dst":"/../b"}]})", R"({"name":"host"})",
        R"({"name":"x","bogus":1})", R"([1])"})
    EXPECT_FALSE(parse_build_spec(bad)) << bad;
}

class BuildFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root";
    char tmpl[] = "/tmp/tp-build-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ::chmod(dir_.c_str(), 0755);  // other users may look in; the files decide
    fs::create_directories(dir_ + "/src/tree/sub");
    fs::create_directories(dir_ + "/stage");
    StoreOptions o;
    o.data_dir = dir_ + "/data";
    o.limits.reserve_bytes = 0;
    auto st = ImageStore::open(o, std::make_shared<control::MemoryImageRecordStore>());
    ASSERT_TRUE(st) << st.error().message();
    store_ = *st;
  }
  void TearDown() override {
    store_.reset();
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  void write(const std::string& rel, const std::string& data, mode_t mode = 0644) {
    std::string p = dir_ + "/" + rel;
    std::ofstream(p, std::ios::binary) << data;
    ::chmod(p.c_str(), mode);
  }
  BuildSpec spec_with(std::vector<std::pair<std::string, std::string>> files) {
    auto s = parse_build_spec(R"({"name":"b","run":["true"]})");
    EXPECT_TRUE(s);
    s->files = std::move(files);
    return *s;
  }
  bool store_tmp_empty() { return fs::is_empty(store_->root() + "/tmp"); }
  std::string dir_;
  std::shared_ptr<ImageStore> store_;
};

TEST_F(BuildFilesTest, StagesAsTheCallerOwnedByTheBuildRootAndDigestsContent) {
  write("src/hello.py", "print(1)\n");
  write("src/tree/a", "one", 0600);
  write("src/tree/sub/b", "two");
  fs::create_symlink("/etc/shadow", dir_ + "/src/tree/link");
  auto s = spec_with({{dir_ + "/src/hello.py", "/opt"}, {dir_ + "/src/tree/", "/srv"}});
  auto root_reader =
      sys::HostReader::peer(0, 0, {});  // root without capabilities: its own files only
  auto d1 = stage_build_files(s, root_reader, dir_ + "/stage");
  ASSERT_TRUE(d1) << d1.error().message();
  ASSERT_EQ(d1->size(), 2u);
  std::string st = dir_ + "/stage";
  struct stat sb {};
  ASSERT_EQ(::lstat((st + "/0/hello.py").c_str(), &sb), 0);
  EXPECT_EQ(sb.st_uid, kBuildIdBase);
  EXPECT_EQ(sb.st_gid, kBuildIdBase);
  ASSERT_EQ(::lstat((st + "/1/tree/a").c_str(), &sb), 0);
  EXPECT_EQ(sb.st_uid, kBuildIdBase);
  EXPECT_EQ(sb.st_mode & 07777, 0600u);
  ASSERT_EQ(::lstat((st + "/1/tree/sub/b").c_str(), &sb), 0);
  ASSERT_EQ(::lstat((st + "/1/tree/link").c_str(), &sb), 0);
  EXPECT_TRUE(S_ISLNK(sb.st_mode)) << "symlinks are kept as links, never followed";
  EXPECT_EQ(sb.st_uid, kBuildIdBase);
  auto argv = mmdebstrap_argv(s, "/o.tar", st);
  EXPECT_NE(
      std::find(argv.begin(), argv.end(), "--customize-hook=copy-in '" + st + "/1/tree' '/srv'"),
      argv.end());

  // The same content with the same size and times still changes the key when a byte changes.
  struct stat before {};
  ::stat((dir_ + "/src/tree/a").c_str(), &before);
  write("src/tree/a", "One", 0600);
  timespec times[2] = {before.st_atim, before.st_mtim};
  ::utimensat(AT_FDCWD, (dir_ + "/src/tree/a").c_str(), times, 0);
  fs::remove_all(st);
  fs::create_directories(st);
  auto d2 = stage_build_files(s, root_reader, st);
  ASSERT_TRUE(d2) << d2.error().message();
  EXPECT_EQ((*d1)[0], (*d2)[0]);
  EXPECT_NE((*d1)[1], (*d2)[1]);
  EXPECT_NE(build_cache_key(s, *d1), build_cache_key(s, *d2));
}

TEST_F(BuildFilesTest, SetuidFilesAreRefused) {
  write("src/suid", "#!/bin/sh\n", 04755);
  auto s = spec_with({{dir_ + "/src/suid", "/opt"}});
  auto d = stage_build_files(s, sys::HostReader::peer(0, 0, {}), dir_ + "/stage");
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message().find("suid"), std::string::npos) << d.error().message();
}

TEST_F(BuildFilesTest, RootOnlyFileFailsWithPermissionDeniedForAnotherUserAndLeavesNothing) {
  write("src/secret", "root only\n", 0600);
  auto s = spec_with({{dir_ + "/src/secret", "/opt"}});
  auto r = build_image(*store_, s, sys::HostReader::peer(65534, 65534, {}), 60);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kPermissionDenied) << r.error().message();
  EXPECT_NE(r.error().message().find("Permission denied"), std::string::npos)
      << r.error().message();
  EXPECT_NE(r.error().message().find(dir_ + "/src/secret"), std::string::npos)
      << r.error().message();
  EXPECT_TRUE(store_tmp_empty());
  EXPECT_FALSE(fs::exists(store_->root() + "/build-cache") &&
               !fs::is_empty(store_->root() + "/build-cache"));
}

TEST_F(BuildFilesTest, RefusedReaderRefusesFilesAndFileMirrors) {
  write("src/f", "x");
  auto s = spec_with({{dir_ + "/src/f", "/opt"}});
  auto r = build_image(*store_, s, sys::HostReader::refuse("no identity"), 60);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kPermissionDenied);
  EXPECT_NE(r.error().message().find("no identity"), std::string::npos) << r.error().message();
  auto m = spec_with({});
  m.mirror = "file://" + dir_ + "/src";
  r = build_image(*store_, m, sys::HostReader::refuse("no identity"), 60);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kPermissionDenied);
  EXPECT_TRUE(store_tmp_empty());
}

}  // namespace
}  // namespace tp::image
