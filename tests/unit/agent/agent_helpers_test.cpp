// Pure helpers of tp-agent: options, environment, PATH search, path splitting,
// and the resolver and file service in-process (both resolver modes).
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <fstream>
#include <iterator>

#include "agent/command.h"
#include "agent/file_ops.h"
#include "agent/options.h"
#include "agent/resolver.h"
#include "agent_harness.h"

namespace tp::agent {
namespace {

Result<Options> parse(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return parse_options(static_cast<int>(argv.size()), argv.data());
}

TEST(AgentOptions, DefaultsAndFlags) {
  auto d = parse({"tp-agent"});
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->fd, 3);
  EXPECT_EQ(d->root, "/");
  EXPECT_EQ(d->cgroup_fd, -1);
  EXPECT_EQ(d->resolve, Resolver::Mode::kAuto);
  auto o =
      parse({"tp-agent", "--fd", "7", "--root=/tmp/x", "--cgroup-fd", "4", "--resolve", "walk"});
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->fd, 7);
  EXPECT_EQ(o->root, "/tmp/x");
  EXPECT_EQ(o->cgroup_fd, 4);
  EXPECT_EQ(o->resolve, Resolver::Mode::kWalk);
}

TEST(AgentOptions, RejectsBadInput) {
  EXPECT_FALSE(parse({"tp-agent", "--fd"}).has_value());
  EXPECT_FALSE(parse({"tp-agent", "--fd", "x"}).has_value());
  EXPECT_FALSE(parse({"tp-agent", "--fd", "-1"}).has_value());
  EXPECT_FALSE(parse({"tp-agent", "--root", ""}).has_value());
  EXPECT_FALSE(parse({"tp-agent", "--resolve", "magic"}).has_value());
  EXPECT_FALSE(parse({"tp-agent", "--bogus"}).has_value());
  EXPECT_FALSE(parse({"tp-agent", "--cgroup-fd", "x"}).has_value());
  EXPECT_FALSE(parse({"tp-agent", "--cgroup-fd"}).has_value());
  // The pid-namespace mode is gone, and so is its switch.
  EXPECT_FALSE(parse({"tp-agent", "--no-pid-ns"}).has_value());
}

TEST(AgentOptions, SerialPort) {
  EXPECT_FALSE(parse({"tp-agent"})->serial);
  auto o = parse({"tp-agent", "--fd", "3", "--serial", "--cgroup-fd", "4"});
  ASSERT_TRUE(o.has_value());
  EXPECT_TRUE(o->serial);
  EXPECT_EQ(o->fd, 3);
  // A port has no listening socket: the two ways of reconnecting exclude each other.
  EXPECT_FALSE(parse({"tp-agent", "--serial", "--listen-fd", "5"}).has_value());
  EXPECT_FALSE(parse({"tp-agent", "--serial=yes"}).has_value());
}

TEST(AgentOptions, ListenFdAndOrphanTimeout) {
  auto d = parse({"tp-agent"});
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->listen_fd, -1);
  EXPECT_EQ(d->orphan_timeout_s, 3600u);
  auto o = parse({"tp-agent", "--listen-fd", "4", "--orphan-timeout=60"});
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->listen_fd, 4);
  EXPECT_EQ(o->orphan_timeout_s, 60u);
  EXPECT_FALSE(parse({"tp-agent", "--listen-fd"}).has_value());
  EXPECT_FALSE(parse({"tp-agent", "--listen-fd", "-2"}).has_value());
  EXPECT_FALSE(parse({"tp-agent", "--orphan-timeout", "soon"}).has_value());
}

TEST(AgentEnv, DefaultAndGiven) {
  auto d = build_env({}, 0);
  EXPECT_EQ(d, (std::vector<std::string>{std::string("PATH=") + kDefaultPath, "LANG=C.UTF-8",
                                         "HOME=/root"}));
  auto n = build_env({}, 1000);
  EXPECT_EQ(n.back(), "HOME=/");
  auto g = build_env({"A=1", "HOME=/h"}, 0);
  EXPECT_EQ(g, (std::vector<std::string>{"A=1", "HOME=/h"}));
  EXPECT_EQ(path_of_env({"A=1"}), kDefaultPath);
  EXPECT_EQ(path_of_env({"PATH=/x:/y"}), "/x:/y");
}

TEST(AgentExecCandidates, PathSearch) {
  EXPECT_EQ(exec_candidates("/bin/sh", "/a"), (std::vector<std::string>{"/bin/sh"}));
  EXPECT_EQ(exec_candidates("./run", "/a"), (std::vector<std::string>{"./run"}));
  EXPECT_EQ(exec_candidates("sh", "/a:/b/::/c"),
            (std::vector<std::string>{"/a/sh", "/b/sh", "./sh", "/c/sh"}));
  EXPECT_TRUE(exec_candidates("", "/a").empty());
}

TEST(AgentResolver, CheckPath) {
  EXPECT_TRUE(Resolver::check_path("/").has_value());
  EXPECT_TRUE(Resolver::check_path("/a/../b").has_value());
  EXPECT_EQ(Resolver::check_path("").error().code, Code::kInvalidArgument);
  EXPECT_EQ(Resolver::check_path("a/b").error().code, Code::kInvalidArgument);
  EXPECT_EQ(Resolver::check_path(std::string("/a\0b", 4)).error().code, Code::kInvalidArgument);
}

TEST(AgentResolver, SplitLast) {
  using P = std::pair<std::string, std::string>;
  EXPECT_EQ(Resolver::split_last("/"), P("/", ""));
  EXPECT_EQ(Resolver::split_last("/a"), P("/", "a"));
  EXPECT_EQ(Resolver::split_last("/a/b/"), P("/a", "b"));
  EXPECT_EQ(Resolver::split_last("//a//b"), P("//a", "b"));
  EXPECT_EQ(Resolver::split_last("/a/.."), P("/a/..", ""));
  EXPECT_EQ(Resolver::split_last("/a/."), P("/a/.", ""));
  EXPECT_EQ(Resolver::split_last("///"), P("/", ""));
}

class ResolverModes : public ::testing::TestWithParam<Resolver::Mode> {
 protected:
  void SetUp() override {
    root_ = dir_.path();
    ASSERT_EQ(::mkdir((root_ + "/etc").c_str(), 0755), 0);
    std::ofstream(root_ + "/etc/passwd") << "inside";
    ASSERT_EQ(::symlink("/etc/passwd", (root_ + "/abs").c_str()), 0);
    ASSERT_EQ(::symlink("/", (root_ + "/slash").c_str()), 0);
    ASSERT_EQ(::symlink("../../../../etc", (root_ + "/rel").c_str()), 0);
    ASSERT_EQ(::symlink("loop2", (root_ + "/loop1").c_str()), 0);
    ASSERT_EQ(::symlink("loop1", (root_ + "/loop2").c_str()), 0);
    ASSERT_EQ(::symlink("/nowhere/file", (root_ + "/dangling").c_str()), 0);
    ASSERT_EQ(::mkdir((root_ + "/nowhere").c_str(), 0755), 0);
  }
  Resolver resolver() { return std::move(*Resolver::open_root(root_, GetParam())); }
  std::string read_via(const Resolver& r, const std::string& p) {
    auto fd = r.open(p, O_RDONLY);
    if (!fd) return "ERR:" + std::string(code_name(fd.error().code));
    char buf[64];
    ssize_t n = ::read(fd->get(), buf, sizeof(buf));
    return std::string(buf, n > 0 ? static_cast<size_t>(n) : 0);
  }
  agent_test::TempDir dir_;
  std::string root_;
};

INSTANTIATE_TEST_SUITE_P(Modes, ResolverModes,
                         ::testing::Values(Resolver::Mode::kOpenat2, Resolver::Mode::kWalk),
                         [](const auto& i) {
                           return i.param == Resolver::Mode::kWalk ? "Walk" : "Openat2";
                         });

TEST_P(ResolverModes, EverythingStaysInside) {
  auto r = resolver();
  EXPECT_EQ(r.uses_openat2(), GetParam() == Resolver::Mode::kOpenat2);
  for (const char* p : {"/etc/passwd", "/../../etc/passwd", "/abs", "/slash/etc/passwd",
                        "/slash/slash/../etc/passwd", "/rel/passwd", "/etc/../../etc/./passwd"}) {
    EXPECT_EQ(read_via(r, p), "inside") << p;
  }
  EXPECT_EQ(read_via(r, "/loop1"), "ERR:invalid_argument");  // ELOOP
  EXPECT_EQ(read_via(r, "/etc/passwd/x"), "ERR:not_found");  // ENOTDIR
  EXPECT_EQ(read_via(r, "relative"), "ERR:invalid_argument");
}

TEST_P(ResolverModes, CreateThroughDanglingSymlinkLandsInside) {
  auto r = resolver();
  auto fd = r.open("/dangling", O_WRONLY | O_CREAT, 0600);
  ASSERT_TRUE(fd.has_value()) << fd.error().message();
  struct stat st {};
  EXPECT_EQ(::stat((root_ + "/nowhere/file").c_str(), &st), 0);
}

TEST_P(ResolverModes, ParentOfNamesTheLastComponent) {
  auto r = resolver();
  auto p = r.parent("/abs");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->name, "abs");
  struct stat st {};
  ASSERT_EQ(::fstatat(p->dir.get(), p->name.c_str(), &st, AT_SYMLINK_NOFOLLOW), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  auto up = r.parent("/slash/..");
  ASSERT_TRUE(up.has_value());
  EXPECT_EQ(up->name, "");
  struct stat a {
  }, b{};
  ASSERT_EQ(::fstat(up->dir.get(), &a), 0);
  ASSERT_EQ(::stat(root_.c_str(), &b), 0);
  EXPECT_EQ(a.st_ino, b.st_ino);  // ".." of the root is the root
}

TEST_P(ResolverModes, FileServiceMkdirParentsThroughSymlinks) {
  FileService fs(resolver());
  ASSERT_TRUE(fs.mkdir_parents("/slash/x/y", 0755).has_value());
  EXPECT_TRUE(std::filesystem::is_directory(root_ + "/x/y"));
  auto over = fs.mkdir_parents("/etc/passwd/z", 0755);
  ASSERT_FALSE(over.has_value());
  EXPECT_EQ(over.error().code, Code::kConflict);
}

// openat2 answers EAGAIN while renames anywhere on the host race a lookup's "..", and
// a command that keeps renaming can make that last. The agent used to retry for ever
// (a command could freeze its own agent); it falls back to the walk. Here every
// openat2 answers EAGAIN (a seccomp filter in a child process, which a spin would
// leave running: the parent kills it then).
TEST_P(ResolverModes, AnOpenat2ThatKeepsAnsweringEagainFallsBackToTheWalk) {
  auto r = resolver();
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(fds[0]);
    sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_openat2, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EAGAIN),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog prog{static_cast<unsigned short>(std::size(filter)), filter};
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
      ::_exit(2);
    std::string got = read_via(r, "/rel/passwd");
    (void)!::write(fds[1], got.data(), got.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  pollfd pfd{fds[0], POLLIN, 0};
  // A deadlock guard, not a timing threshold: the read takes microseconds.
  int ready = ::poll(&pfd, 1, 30000);
  char buf[64] = {};
  ssize_t n = ready > 0 ? ::read(fds[0], buf, sizeof(buf)) : -1;
  if (ready <= 0) ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ::close(fds[0]);
  ASSERT_GT(ready, 0) << "the resolver kept retrying openat2";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(std::string(buf, n > 0 ? static_cast<size_t>(n) : 0), "inside");
}

TEST(AgentFileOps, EntryFieldsAndHelpers) {
  EXPECT_EQ(join_path("/", "a"), "/a");
  EXPECT_EQ(join_path("/x", "a"), "/x/a");
  EXPECT_STREQ(file_type_name(S_IFREG), "file");
  EXPECT_STREQ(file_type_name(S_IFDIR), "dir");
  EXPECT_STREQ(file_type_name(S_IFLNK), "symlink");
  EXPECT_STREQ(file_type_name(S_IFIFO), "other");
  struct stat st {};
  st.st_mode = S_IFLNK | 0777;
  st.st_size = 3;
  proto::Message m;
  m.fields = entry_fields("l", "/l", st, "/t");
  EXPECT_EQ(m.str(proto::Tag::kFileType), "symlink");
  EXPECT_EQ(m.str(proto::Tag::kLinkTarget), "/t");
  EXPECT_EQ(m.u64(proto::Tag::kMode), 0777u);
  EXPECT_EQ(m.u64(proto::Tag::kSize), 3u);
}

}  // namespace
}  // namespace tp::agent
