#include "sys/host_reader.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace tp::sys {
namespace {

namespace fs = std::filesystem;
constexpr uid_t kNobody = 65534;

std::string drain(int fd) {
  std::string out;
  char buf[65536];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

// Reads `path` as `who` to the end; returns finish()'s result and the bytes.
Result<std::string> read_all_tar(const HostReader& who, const std::string& path) {
  auto r = read_host_tar(who, path);
  if (!r) return std::unexpected(r.error());
  std::string out = drain(r->fd());
  TP_TRY(r->finish());
  return out;
}

class HostReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root (reads as another uid)";
    char t[] = "/tmp/tp-host-reader-XXXXXX";
    ASSERT_NE(::mkdtemp(t), nullptr);
    root_ = t;
    ::chmod(root_.c_str(), 0755);
    secret_ = root_ + "/secret";
    fs::create_directory(secret_);
    std::ofstream(secret_ + "/key") << "root-only";
    ::chmod((secret_ + "/key").c_str(), 0600);
    ::chmod(secret_.c_str(), 0700);
  }
  void TearDown() override {
    if (!root_.empty()) fs::remove_all(root_);
  }
  std::string root_, secret_;
};

TEST_F(HostReaderTest, APeerReadsOnlyWhatItCouldReadItself) {
  auto as_nobody = HostReader::peer(kNobody, kNobody, {});
  auto r = read_all_tar(as_nobody, secret_);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kPermissionDenied) << r.error().message();
  EXPECT_NE(r.error().message().find(secret_), std::string::npos);

  auto f = read_host_file(as_nobody, secret_ + "/key");
  ASSERT_TRUE(f) << f.error().message();
  EXPECT_EQ(drain(f->fd()), "");
  auto done = f->finish();
  ASSERT_FALSE(done);
  EXPECT_EQ(done.error().code, Code::kPermissionDenied);

  // Readable for others: the same reader gets the tree.
  ::chmod(secret_.c_str(), 0755);
  ::chmod((secret_ + "/key").c_str(), 0644);
  auto ok = read_all_tar(as_nobody, secret_);
  ASSERT_TRUE(ok) << ok.error().message();
  EXPECT_NE(ok->find("./key"), std::string::npos);
  EXPECT_NE(ok->find("root-only"), std::string::npos);
  auto file = read_host_file(as_nobody, secret_ + "/key");
  ASSERT_TRUE(file);
  EXPECT_EQ(drain(file->fd()), "root-only");
  EXPECT_TRUE(file->finish());
}

TEST_F(HostReaderTest, OnlyRegularFilesAreReadAsFiles) {
  std::string fifo = root_ + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0666), 0);
  for (const std::string& p : {fifo, root_}) {
    auto f = read_host_file(HostReader::peer(kNobody, kNobody, {}), p);
    ASSERT_TRUE(f) << f.error().message();
    EXPECT_EQ(drain(f->fd()), "");  // a FIFO is never opened: this does not block
    auto done = f->finish();
    ASSERT_FALSE(done) << p;
    EXPECT_EQ(done.error().code, Code::kInvalidArgument) << done.error().message();
  }
}

TEST_F(HostReaderTest, SupplementaryGroupsCount) {
  ::chown(secret_.c_str(), 0, 4242);
  ::chown((secret_ + "/key").c_str(), 0, 4242);
  ::chmod(secret_.c_str(), 0750);
  ::chmod((secret_ + "/key").c_str(), 0640);
  EXPECT_FALSE(read_all_tar(HostReader::peer(kNobody, kNobody, {}), secret_));
  auto ok = read_all_tar(HostReader::peer(kNobody, kNobody, {4242}), secret_);
  ASSERT_TRUE(ok) << ok.error().message();
  EXPECT_NE(ok->find("root-only"), std::string::npos);
}

TEST_F(HostReaderTest, ARootPeerReadsAsRoot) {
  auto ok = read_all_tar(HostReader::peer(0, 0, {}), secret_);
  ASSERT_TRUE(ok) << ok.error().message();
  EXPECT_NE(ok->find("root-only"), std::string::npos);
}

TEST_F(HostReaderTest, MissingPathsAndRelativePaths) {
  auto r = read_all_tar(HostReader::peer(kNobody, kNobody, {}), root_ + "/nope");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kNotFound) << r.error().message();
  auto rel = read_host_tar(HostReader::peer(kNobody, kNobody, {}), "relative/dir");
  ASSERT_FALSE(rel);
  EXPECT_EQ(rel.error().code, Code::kInvalidArgument);
}

TEST_F(HostReaderTest, RefusedReadersReadNothing) {
  auto r = read_host_tar(HostReader::refuse("no identity"), root_);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kPermissionDenied);
  EXPECT_NE(r.error().message().find("no identity"), std::string::npos);
  // An admin key with no import roots configured is refused too.
  auto none = read_host_tar(HostReader::under({}), root_);
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code, Code::kPermissionDenied);
}

TEST_F(HostReaderTest, ImportRootsBoundWhatAnAdminKeyReads) {
  fs::create_directory(root_ + "/roots");
  fs::create_directory(root_ + "/roots/in");
  std::ofstream(root_ + "/roots/in/f") << "inside";
  fs::create_directory(root_ + "/rootsx");  // a sibling sharing the prefix
  // A symlink inside the root to a directory outside does not escape it.
  fs::create_directory_symlink(secret_, root_ + "/roots/link");
  auto who = HostReader::under({root_ + "/roots"});

  auto in = read_all_tar(who, root_ + "/roots/in");
  ASSERT_TRUE(in) << in.error().message();
  EXPECT_NE(in->find("inside"), std::string::npos);
  // Read as root under a root: a root-only file there is the operator's choice.
  auto whole = read_all_tar(who, root_ + "/roots");
  ASSERT_TRUE(whole) << whole.error().message();

  for (const std::string& p :
       {secret_, root_ + "/rootsx", root_ + "/roots/link", root_ + "/roots/../secret"}) {
    auto r = read_host_tar(who, p);
    ASSERT_FALSE(r) << p;
    EXPECT_EQ(r.error().code, Code::kPermissionDenied) << p << ": " << r.error().message();
  }
}

// Like add_layer_dir before it: a file system mounted below the tree is not read.
TEST_F(HostReaderTest, MountsBelowThePathAreNotEntered) {
  std::string mnt = root_ + "/tree/mnt";
  fs::create_directories(mnt);
  std::ofstream(root_ + "/tree/top") << "top-file";
  ASSERT_EQ(::mount("tp-test", mnt.c_str(), "tmpfs", 0, "size=1m"), 0) << std::strerror(errno);
  std::ofstream(mnt + "/below") << "mounted-file";
  auto r = read_all_tar(HostReader::peer(0, 0, {}), root_ + "/tree");
  ::umount2(mnt.c_str(), MNT_DETACH);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_NE(r->find("top-file"), std::string::npos);
  EXPECT_EQ(r->find("mounted-file"), std::string::npos);
}

// Thousands of errors on stderr must not block the reader while its stdout is
// consumed (stderr is not a pipe nobody reads).
TEST_F(HostReaderTest, ManyErrorsDoNotBlockTheReader) {
  std::string many = root_ + "/many";
  fs::create_directory(many);
  for (int i = 0; i < 3000; ++i) {
    std::string f = many + "/file-with-a-rather-long-name-" + std::to_string(i);
    int fd = ::open(f.c_str(), O_WRONLY | O_CREAT, 0600);
    ASSERT_GE(fd, 0);
    ::close(fd);
  }
  auto r = read_all_tar(HostReader::peer(kNobody, kNobody, {}), many);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kPermissionDenied);
  EXPECT_LE(r.error().message().size(), 3000u);  // the first lines only
}

// The child holds none of the daemon's descriptors, close-on-exec or not.
TEST_F(HostReaderTest, TheChildInheritsNoDescriptors) {
  int fd = ::open("/dev/null", O_RDONLY);
  ASSERT_GE(fd, 0);
  const int leak = 200;
  ASSERT_EQ(::dup2(fd, leak), leak);  // deliberately without close-on-exec
  ::close(fd);
  auto r = read_all_tar(HostReader::peer(0, 0, {}), "/proc/self/fd/");
  ::close(leak);
  // tar archives its own /proc/self/fd: 0, 1, 2 and the directory it reads.
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_NE(r->find(std::string("./1\0", 4)), std::string::npos);
  EXPECT_EQ(r->find(std::string("./200\0", 6)), std::string::npos);
}

}  // namespace
}  // namespace tp::sys
