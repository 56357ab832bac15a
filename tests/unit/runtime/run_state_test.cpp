// The run dir of live restore (run_state.h): one socket per sandbox with its init
// recorded on it, and the layout of earlier versions still found and removed.
#include "runtime/container/run_state.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "runtime/sandbox_state.h"

namespace tp::runtime::container {
namespace {

namespace fs = std::filesystem;

class RunStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "trusted xattrs need root";
    char tmpl[] = "/tmp/tp-rs-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    fs::create_directories(dir_ + "/run");
    fs::create_directories(dir_ + "/old");
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }
  size_t entries(const std::string& d) {
    return static_cast<size_t>(std::distance(fs::directory_iterator(d), {}));
  }
  std::string dir_;
};

TEST_F(RunStateTest, OneSocketPerSandboxCarriesItsInit) {
  RunState rs(dir_ + "/run");
  auto fd = rs.make_socket("n0-a");
  ASSERT_TRUE(fd) << fd.error().message();
  ASSERT_TRUE(rs.record("n0-a", getpid()));
  EXPECT_EQ(entries(dir_ + "/run"), 1u);
  auto f = rs.find("n0-a");
  ASSERT_TRUE(f) << f.error().message();
  EXPECT_EQ(f->socket, dir_ + "/run/n0-a.sock");
  EXPECT_EQ(f->pid, getpid());
  EXPECT_EQ(f->start, proc_start_time(getpid()));
  EXPECT_NE(f->start, 0u);
  EXPECT_EQ(rs.ids(), std::vector<std::string>{"n0-a"});
  // A second make_socket of the id replaces what was there.
  auto again = rs.make_socket("n0-a");
  ASSERT_TRUE(again) << again.error().message();
  EXPECT_FALSE(rs.find("n0-a"));  // nothing recorded on the new socket yet
  rs.remove("n0-a");
  EXPECT_EQ(entries(dir_ + "/run"), 0u);
  rs.remove("n0-a");  // idempotent
  auto gone = rs.find("n0-a");
  ASSERT_FALSE(gone);
  EXPECT_EQ(gone.error().code, Code::kNotFound);
}

TEST_F(RunStateTest, TheEarlierLayoutIsFoundListedAndRemoved) {
  // <id>/agent.sock and <id>/state in the data dir's run dir, from an earlier version.
  RunState old_version(dir_ + "/old");
  auto fd = old_version.make_socket("n0-b");
  ASSERT_TRUE(fd);
  fs::create_directory(dir_ + "/old/n0-b");
  fs::rename(dir_ + "/old/n0-b.sock", dir_ + "/old/n0-b/agent.sock");
  std::ofstream(dir_ + "/old/n0-b/state")
      << "pid " << getpid() << "\nstarttime " << proc_start_time(getpid()) << "\n";
  RunState rs(dir_ + "/run", {dir_ + "/old"});
  auto f = rs.find("n0-b");
  ASSERT_TRUE(f) << f.error().message();
  EXPECT_EQ(f->socket, dir_ + "/old/n0-b/agent.sock");
  EXPECT_EQ(f->pid, getpid());
  ASSERT_TRUE(rs.make_socket("n0-c"));
  EXPECT_EQ(rs.ids(), (std::vector<std::string>{"n0-b", "n0-c"}));
  rs.remove("n0-b");
  EXPECT_FALSE(fs::exists(dir_ + "/old/n0-b"));
  EXPECT_EQ(rs.ids(), std::vector<std::string>{"n0-c"});
}

TEST_F(RunStateTest, AMissingOrMalformedRecordIsNotFound) {
  RunState rs(dir_ + "/run");
  ASSERT_TRUE(rs.make_socket("n0-d"));
  const std::string sock = dir_ + "/run/n0-d.sock";
  const std::string bad = "pid x\n";
  ASSERT_EQ(setxattr(sock.c_str(), "trusted.tidepool.init", bad.data(), bad.size(), 0), 0);
  auto f = rs.find("n0-d");
  ASSERT_FALSE(f);
  EXPECT_EQ(f.error().code, Code::kNotFound);
  // A file in the socket's place is not a socket.
  rs.remove("n0-d");
  std::ofstream(sock) << "x";
  EXPECT_FALSE(rs.find("n0-d"));
}

}  // namespace
}  // namespace tp::runtime::container
