// The real tp-agent, driven through AgentClient: files, and containment of
// every path inside --root.
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <sstream>

#include "agent_harness.h"

namespace tp::agent_test {
namespace {

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void spit(const std::string& p, const std::string& data) {
  std::ofstream f(p, std::ios::binary);
  f << data;
}

// Parameter: the agent's path resolver (openat2 or the component walk).
class AgentFilesTest : public AgentTestBase, public ::testing::WithParamInterface<const char*> {
 protected:
  void SetUp() override {
    ASSERT_EQ(::mkdir(host_path("/etc").c_str(), 0755), 0);
    spit(host_path("/etc/passwd"), "inside\n");
    start(AgentOptions{.resolve = GetParam()});
  }

  Result<std::string> read(const std::string& p, uint64_t max = 64u << 20) {
    return await<std::string>([&](auto cb) { client_->read_file(p, max, cb); });
  }
  Result<uint64_t> write(const std::string& p, const std::string& d, uint32_t mode = 0,
                         bool parents = false) {
    return await<uint64_t>([&](auto cb) { client_->write_file(p, d, mode, parents, cb); });
  }
  Result<node::FileEntry> stat(const std::string& p) {
    return await<node::FileEntry>([&](auto cb) { client_->stat(p, cb); });
  }
  Result<std::vector<node::FileEntry>> list(const std::string& p) {
    return await<std::vector<node::FileEntry>>([&](auto cb) { client_->list(p, cb); });
  }
  Result<void> remove(const std::string& p, bool recursive) {
    return await<void>([&](auto cb) { client_->remove(p, recursive, cb); });
  }
  Result<void> mkdir(const std::string& p, bool parents, uint32_t mode = 0) {
    return await<void>([&](auto cb) { client_->mkdir(p, mode, parents, cb); });
  }
};

INSTANTIATE_TEST_SUITE_P(Resolvers, AgentFilesTest, ::testing::Values("openat2", "walk"),
                         [](const auto& info) { return std::string(info.param); });

TEST_P(AgentFilesTest, BinaryMultiChunkRoundTrip) {
  std::string data((5u << 20) / 2 + 123, '\0');  // 2.5 MiB: three write and read chunks
  std::mt19937 rng(7);
  for (auto& c : data) c = static_cast<char>(rng());
  auto w = write("/data.bin", data);
  ASSERT_TRUE(w.has_value()) << w.error().message();
  EXPECT_EQ(*w, data.size());
  EXPECT_EQ(slurp(host_path("/data.bin")), data);
  auto r = read("/data.bin");
  ASSERT_TRUE(r.has_value()) << r.error().message();
  EXPECT_EQ(*r, data);
  // Writing again truncates.
  ASSERT_TRUE(write("/data.bin", "short").has_value());
  EXPECT_EQ(*read("/data.bin"), "short");
}

TEST_P(AgentFilesTest, ExactChunkSizedFileAndEmptyFile) {
  std::string data(1u << 20, 'z');
  ASSERT_TRUE(write("/chunk", data).has_value());
  EXPECT_EQ(*read("/chunk"), data);
  auto w = write("/empty", "");
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(*w, 0u);
  EXPECT_EQ(*read("/empty"), "");
}

TEST_P(AgentFilesTest, ReadBeyondMaxBytesIsPayloadTooLarge) {
  ASSERT_TRUE(write("/big", std::string(5000, 'b')).has_value());
  auto r = read("/big", 4999);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Code::kPayloadTooLarge);
  EXPECT_TRUE(read("/big", 5000).has_value());
}

TEST_P(AgentFilesTest, WriteModeAndParents) {
  auto w = write("/a/b/c/file.sh", "#!/bin/sh\n", 0750, true);
  ASSERT_TRUE(w.has_value()) << w.error().message();
  struct stat st {};
  ASSERT_EQ(::stat(host_path("/a/b/c/file.sh").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  auto no_parents = write("/x/y/file", "d");
  ASSERT_FALSE(no_parents.has_value());
  EXPECT_EQ(no_parents.error().code, Code::kNotFound);
}

TEST_P(AgentFilesTest, StatFileDirAndSymlink) {
  ASSERT_TRUE(write("/f", "12345", 0600).has_value());
  ASSERT_EQ(::symlink("/f", host_path("/l").c_str()), 0);
  auto f = stat("/f");
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->type, "file");
  EXPECT_EQ(f->size, 5u);
  EXPECT_EQ(f->mode, 0600u);
  EXPECT_EQ(f->name, "f");
  EXPECT_EQ(f->path, "/f");
  EXPECT_GT(f->mtime_ns, 0u);
  auto d = stat("/etc");
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->type, "dir");
  auto l = stat("/l");  // not followed
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->type, "symlink");
  EXPECT_EQ(l->link_target, "/f");
  auto root = stat("/");
  ASSERT_TRUE(root.has_value());
  EXPECT_EQ(root->type, "dir");
  auto missing = stat("/nope");
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().code, Code::kNotFound);
}

TEST_P(AgentFilesTest, ListFillsNamesAndPaths) {
  ASSERT_TRUE(mkdir("/d", false).has_value());
  ASSERT_TRUE(write("/d/b.txt", "bb").has_value());
  ASSERT_TRUE(mkdir("/d/a", false).has_value());
  ASSERT_EQ(::symlink("b.txt", host_path("/d/c").c_str()), 0);
  auto l = list("/d/");
  ASSERT_TRUE(l.has_value()) << l.error().message();
  ASSERT_EQ(l->size(), 3u);
  EXPECT_EQ((*l)[0].name, "a");
  EXPECT_EQ((*l)[0].path, "/d/a");
  EXPECT_EQ((*l)[0].type, "dir");
  EXPECT_EQ((*l)[1].name, "b.txt");
  EXPECT_EQ((*l)[1].size, 2u);
  EXPECT_EQ((*l)[1].type, "file");
  EXPECT_EQ((*l)[2].type, "symlink");
  EXPECT_EQ((*l)[2].link_target, "b.txt");
  auto not_dir = list("/d/b.txt");
  ASSERT_FALSE(not_dir.has_value());
  auto missing = list("/nope");
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().code, Code::kNotFound);
}

TEST_P(AgentFilesTest, RemoveFileEmptyDirAndTree) {
  ASSERT_TRUE(write("/t/x/y/z", "z", 0, true).has_value());
  ASSERT_TRUE(write("/t/file", "f").has_value());
  ASSERT_TRUE(remove("/t/file", false).has_value());
  EXPECT_FALSE(std::filesystem::exists(host_path("/t/file")));
  auto not_empty = remove("/t", false);
  ASSERT_FALSE(not_empty.has_value());
  EXPECT_EQ(not_empty.error().code, Code::kConflict);
  ASSERT_TRUE(mkdir("/t/empty", false).has_value());
  ASSERT_TRUE(remove("/t/empty", false).has_value());
  ASSERT_TRUE(remove("/t", true).has_value());
  EXPECT_FALSE(std::filesystem::exists(host_path("/t")));
  auto missing = remove("/t", true);
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().code, Code::kNotFound);
  auto root = remove("/", true);
  ASSERT_FALSE(root.has_value());
  EXPECT_EQ(root.error().code, Code::kInvalidArgument);
}

TEST_P(AgentFilesTest, MkdirParentsAndConflicts) {
  ASSERT_TRUE(mkdir("/m/n/o", true, 0700).has_value());
  struct stat st {};
  ASSERT_EQ(::stat(host_path("/m/n/o").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_TRUE(mkdir("/m/n/o", true).has_value());  // mkdir -p of an existing dir
  auto again = mkdir("/m/n/o", false);
  ASSERT_FALSE(again.has_value());
  EXPECT_EQ(again.error().code, Code::kConflict);
  ASSERT_TRUE(write("/m/file", "x").has_value());
  auto over_file = mkdir("/m/file/sub", true);
  ASSERT_FALSE(over_file.has_value());
  EXPECT_EQ(over_file.error().code, Code::kConflict);
  auto no_parent = mkdir("/q/r", false);
  ASSERT_FALSE(no_parent.has_value());
  EXPECT_EQ(no_parent.error().code, Code::kNotFound);
}

TEST_P(AgentFilesTest, MissingFileIsNotFound) {
  auto r = read("/no/such/file");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Code::kNotFound);
  EXPECT_EQ(r.error().sys_errno, ENOENT);
}

TEST_P(AgentFilesTest, NonRegularFilesAreRefusedWithoutBlocking) {
  ASSERT_EQ(::mkfifo(host_path("/fifo").c_str(), 0644), 0);
  auto r = read("/fifo");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Code::kInvalidArgument);
  auto w = write("/fifo", "x");  // no reader: must not block either
  ASSERT_FALSE(w.has_value());
  auto dir = read("/etc");
  ASSERT_FALSE(dir.has_value());
  EXPECT_EQ(dir.error().code, Code::kInvalidArgument);
  ASSERT_EQ(::mkdir(host_path("/dev").c_str(), 0755), 0);
  if (::mknod(host_path("/dev/zero").c_str(), S_IFCHR | 0666, makedev(1, 5)) == 0) {
    auto zero = read("/dev/zero");  // would never end if it were read like a file
    ASSERT_FALSE(zero.has_value());
    EXPECT_EQ(zero.error().code, Code::kInvalidArgument);
  }
}

TEST_P(AgentFilesTest, DotDotStaysInsideRoot) {
  auto r = read("/../../../../etc/passwd");
  ASSERT_TRUE(r.has_value()) << r.error().message();
  EXPECT_EQ(*r, "inside\n");
  ASSERT_TRUE(write("/../../tp-h2-dotdot", "x").has_value());
  EXPECT_TRUE(std::filesystem::exists(host_path("/tp-h2-dotdot")));
  EXPECT_FALSE(std::filesystem::exists("/tmp/tp-h2-dotdot"));
  auto l = list("/..");
  ASSERT_TRUE(l.has_value());
  bool saw_etc = false;
  for (const auto& e : *l) saw_etc |= e.name == "etc";
  EXPECT_TRUE(saw_etc);
}

TEST_P(AgentFilesTest, AbsoluteSymlinksResolveInsideRoot) {
  ASSERT_EQ(::symlink("/etc/passwd", host_path("/pw").c_str()), 0);
  ASSERT_EQ(::symlink("/", host_path("/up").c_str()), 0);
  ASSERT_EQ(::symlink("../../../../../etc", host_path("/rel").c_str()), 0);
  EXPECT_EQ(*read("/pw"), "inside\n");
  EXPECT_EQ(*read("/up/etc/passwd"), "inside\n");
  EXPECT_EQ(*read("/up/up/up/etc/passwd"), "inside\n");
  EXPECT_EQ(*read("/rel/passwd"), "inside\n");
  // Writes through a symlink land inside too.
  ASSERT_EQ(::symlink("/etc/tp-h2-escape", host_path("/w").c_str()), 0);
  ASSERT_TRUE(write("/w", "x").has_value());
  EXPECT_TRUE(std::filesystem::exists(host_path("/etc/tp-h2-escape")));
  EXPECT_FALSE(std::filesystem::exists("/etc/tp-h2-escape"));
  ASSERT_TRUE(mkdir("/up/tmp/tp-h2-mk", true).has_value());
  EXPECT_TRUE(std::filesystem::is_directory(host_path("/tmp/tp-h2-mk")));
  EXPECT_FALSE(std::filesystem::exists("/tmp/tp-h2-mk"));
}

TEST_P(AgentFilesTest, RemoveNeverFollowsSymlinks) {
  TempDir outside;
  spit(outside.path() + "/keep", "keep");
  ASSERT_EQ(::mkdir(host_path("/tree").c_str(), 0755), 0);
  // Only a host-absolute link could reach `outside`; inside the root it is
  // resolved (or not) within the root, and remove never follows it anyway.
  ASSERT_EQ(::symlink(outside.path().c_str(), host_path("/tree/out").c_str()), 0);
  ASSERT_EQ(::symlink((outside.path() + "/keep").c_str(), host_path("/victim").c_str()), 0);
  ASSERT_TRUE(remove("/tree", true).has_value());
  ASSERT_TRUE(remove("/victim", false).has_value());
  EXPECT_EQ(slurp(outside.path() + "/keep"), "keep");
  EXPECT_FALSE(std::filesystem::exists(host_path("/tree")));
  // Reading through the host-absolute link does not reach the host file.
  ASSERT_EQ(::symlink((outside.path() + "/keep").c_str(), host_path("/hostlink").c_str()), 0);
  auto r = read("/hostlink");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Code::kNotFound);
}

TEST_P(AgentFilesTest, BadPathsAreInvalid) {
  for (std::string p : {std::string("etc/passwd"), std::string(""), std::string("./etc/passwd"),
                        std::string("/etc\0/passwd", 12)}) {
    auto r = read(p);
    ASSERT_FALSE(r.has_value()) << p;
    EXPECT_EQ(r.error().code, Code::kInvalidArgument) << p;
    auto w = write(p, "x");
    ASSERT_FALSE(w.has_value()) << p;
    EXPECT_EQ(w.error().code, Code::kInvalidArgument) << p;
    auto s = stat(p);
    ASSERT_FALSE(s.has_value()) << p;
    EXPECT_EQ(s.error().code, Code::kInvalidArgument) << p;
  }
}

TEST_P(AgentFilesTest, ProcSelfRootWithoutProcIsContained) {
  auto r = read("/proc/self/root/etc/passwd");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Code::kNotFound);
}

// With a real procfs inside the root, magic links (/proc/self/root,
// /proc/<pid>/cwd, /proc/self/fd/N) are refused rather than followed out.
class AgentProcTest : public AgentFilesTest {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to mount proc in a private mount ns";
    ASSERT_EQ(::mkdir(host_path("/etc").c_str(), 0755), 0);
    spit(host_path("/etc/passwd"), "inside\n");
    start(AgentOptions{.resolve = GetParam(), .mount_proc = true});
  }
};

INSTANTIATE_TEST_SUITE_P(Resolvers, AgentProcTest, ::testing::Values("openat2", "walk"),
                         [](const auto& info) { return std::string(info.param); });

TEST_P(AgentProcTest, MagicLinksAreContainedOrRefused) {
  std::string host_passwd = slurp("/etc/passwd");
  for (std::string p : {"/proc/self/root/etc/passwd", "/proc/1/root/etc/passwd",
                        "/proc/self/cwd/etc/passwd", "/proc/thread-self/root/etc/passwd"}) {
    auto r = read(p);
    if (r.has_value()) {
      EXPECT_EQ(*r, "inside\n") << p;  // resolved inside the root (walk mode)
      EXPECT_NE(*r, host_passwd) << p;
    } else {
      // ELOOP (magic link refused), ENOENT, or EACCES (ptrace check on /proc/1).
      EXPECT_TRUE(r.error().code == Code::kInvalidArgument || r.error().code == Code::kNotFound ||
                  r.error().code == Code::kPermissionDenied)
          << p << ": " << r.error().message();
    }
  }
  auto w = write("/proc/self/root/tmp/tp-h2-proc-escape", "x");
  EXPECT_FALSE(std::filesystem::exists("/tmp/tp-h2-proc-escape"));
  if (w.has_value()) {
    EXPECT_TRUE(std::filesystem::exists(host_path("/tmp/tp-h2-proc-escape")));
  }
  // Ordinary proc files are still readable (size 0, read to EOF).
  auto status = read("/proc/self/status");
  ASSERT_TRUE(status.has_value()) << status.error().message();
  EXPECT_NE(status->find("Name:"), std::string::npos);
}

}  // namespace
}  // namespace tp::agent_test
