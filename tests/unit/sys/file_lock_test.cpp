#include "sys/file_lock.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

#include "temp_dir.h"

namespace tp::sys {
namespace {

namespace fs = std::filesystem;

class FileLockTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(dir_.empty()); }
  std::string contents() const {
    std::ifstream in(path_);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  // A child that takes the lock with raw system calls only (it was forked from a process
  // that may have other threads: no allocation), writes its pid there, says 'y' (or 'n')
  // on `ready`, and exits after `hold_ms` (or waits to be killed when negative).
  pid_t hold_in_child(int ready, int hold_ms) const {
    const char* path = path_.c_str();
    pid_t child = ::fork();
    if (child != 0) return child;
    int fd = ::open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    bool held = fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) == 0;
    char pid[16];
    int n = 0;
    for (pid_t p = ::getpid(); p > 0; p /= 10) pid[n++] = static_cast<char>('0' + p % 10);
    for (int i = 0; i < n / 2; ++i) std::swap(pid[i], pid[n - 1 - i]);
    held = held && ::ftruncate(fd, 0) == 0 && ::pwrite(fd, pid, n, 0) == n;
    (void)!::write(ready, held ? "y" : "n", 1);
    if (hold_ms < 0) ::pause();
    struct timespec ts {
      hold_ms / 1000, (hold_ms % 1000) * 1000000L
    };
    ::nanosleep(&ts, nullptr);
    ::_exit(0);
  }
  test::TempDir tmp_{"tp-lock-test"};
  const std::string dir_ = tmp_.path();
  const std::string path_ = dir_ + "/tidepoold.lock";
};

TEST_F(FileLockTest, ASecondHolderIsRefusedWithTheFirstOnesPid) {
  auto first = lock_file(path_);
  ASSERT_TRUE(first) << first.error().message();
  EXPECT_EQ(contents(), std::to_string(::getpid()) + "\n");
  EXPECT_TRUE(::fcntl(first->get(), F_GETFD) & FD_CLOEXEC);
  // flock locks belong to an open of the file: a second open conflicts, in this
  // process as in another.
  auto second = lock_file(path_);
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code, Code::kConflict);
  EXPECT_NE(second.error().message().find("(pid " + std::to_string(::getpid()) + ")"),
            std::string::npos)
      << second.error().message();
  // The refused attempt left the holder's pid in place.
  EXPECT_EQ(contents(), std::to_string(::getpid()) + "\n");
}

TEST_F(FileLockTest, ClosingOrDyingReleasesIt) {
  {
    auto first = lock_file(path_);
    ASSERT_TRUE(first);
  }
  auto again = lock_file(path_);
  ASSERT_TRUE(again) << again.error().message();
  again->reset();
  // A holder killed outright: the kernel drops its lock.
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = hold_in_child(ready[1], -1);
  ASSERT_GE(child, 0);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  auto while_held = lock_file(path_);
  ASSERT_FALSE(while_held);
  EXPECT_NE(while_held.error().message().find("(pid " + std::to_string(child) + ")"),
            std::string::npos)
      << while_held.error().message();
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ::close(ready[0]);
  ::close(ready[1]);
  auto after = lock_file(path_);
  EXPECT_TRUE(after) << after.error().message();
}

TEST_F(FileLockTest, WaitingTakesItOnceTheHolderLetsGo) {
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = hold_in_child(ready[1], 300);
  ASSERT_GE(child, 0);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  auto taken = lock_file(path_, /*wait=*/true);
  ASSERT_TRUE(taken) << taken.error().message();
  // It returned only once the holder was gone (an exited child is waitable at once).
  EXPECT_EQ(::waitpid(child, nullptr, WNOHANG), child);
  EXPECT_EQ(contents(), std::to_string(::getpid()) + "\n");
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST_F(FileLockTest, NotTakenThroughASymlinkNorWhereNothingCanBeMade) {
  fs::create_symlink(dir_ + "/elsewhere", path_);
  auto r = lock_file(path_);
  ASSERT_FALSE(r);
  EXPECT_FALSE(fs::exists(dir_ + "/elsewhere"));
  auto missing = lock_file(dir_ + "/no/such/dir/tidepoold.lock");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message().find("open "), std::string::npos);
}

}  // namespace
}  // namespace tp::sys
