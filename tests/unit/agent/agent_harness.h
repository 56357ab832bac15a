// Test harness: runs the real tp-agent binary as a plain child process over a
// socketpair, with --root pointing at a fresh temp dir, and drives it through
// AgentClient on an io_context run by the test thread. Everything it starts
// (agent, temp dir) is gone when the fixture is destroyed.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"
#include "node/agent_client.h"
#include "temp_dir.h"

namespace tp::agent_test {

inline std::string agent_binary() {
  if (const char* d = std::getenv("TP_BIN_DIR"); d && *d) return std::string(d) + "/tp-agent";
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return (exe.parent_path() / "tp-agent").string();
}

// Named as the agent's tests have always used it.
class TempDir : public tp::test::TempDir {
 public:
  TempDir() : tp::test::TempDir("tp-agent-test") {}
};

// A fresh cgroup for one agent (what the container backend delegates to a
// sandbox): v2 under /sys/fs/cgroup (or a hybrid host's /sys/fs/cgroup/unified),
// v1 under the freezer hierarchy. Needs root; path() is empty when this host
// has no such hierarchy or the cgroup could not be made.
class TestCgroup {
 public:
  explicit TestCgroup(bool v2) {
    struct statfs sf {};
    std::string base;
    const std::vector<std::string> bases =
        v2 ? std::vector<std::string>{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}
           : std::vector<std::string>{"/sys/fs/cgroup/freezer"};
    for (const auto& b : bases) {
      if (::statfs(b.c_str(), &sf) == 0 && sf.f_type == (v2 ? 0x63677270 : 0x27e0eb)) {
        base = b;
        break;
      }
    }
    if (base.empty()) return;
    static int n = 0;
    std::string p =
        base + "/tp-agent-test-" + std::to_string(::getpid()) + "-" + std::to_string(++n);
    if (::mkdir(p.c_str(), 0755) != 0) return;
    fd_ = ::open(p.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd_ < 0) {
      ::rmdir(p.c_str());
      return;
    }
    path_ = p;
  }
  ~TestCgroup() {
    if (fd_ >= 0) ::close(fd_);
    if (path_.empty()) return;
    for (const auto& c : children()) ::rmdir((path_ + "/" + c).c_str());
    ::rmdir(path_.c_str());
  }
  TestCgroup(const TestCgroup&) = delete;
  TestCgroup& operator=(const TestCgroup&) = delete;
  const std::string& path() const { return path_; }
  int fd() const { return fd_; }
  // Names of the cgroups under it (the agent's command cgroups).
  std::vector<std::string> children() const {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(path_, ec))
      if (e.is_directory(ec)) out.push_back(e.path().filename().string());
    return out;
  }

 private:
  std::string path_;
  int fd_ = -1;
};

struct AgentOptions {
  int cgroup_fd = -1;  // >= 0: --cgroup-fd (passed as fd 4); else the command-init fallback
  std::string resolve = "auto";
  bool mount_proc = false;    // run the agent in a private mount ns with proc at <root>/proc
  bool listen = false;        // --listen-fd 4: a unix socket at <root>.sock (see socket_path())
  int orphan_timeout_s = -1;  // --orphan-timeout, when >= 0
  bool serial = false;        // --serial: the socketpair stands in for a virtio-serial port
  bool oom_fd = false;        // --oom-fd 6: its own oom_score_adj, as the spawner passes it
};

class AgentProcess {
 public:
  AgentProcess(const std::string& root, const AgentOptions& o) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return;
    std::string bin = agent_binary();
    std::vector<std::string> args = {bin, "--fd", "3", "--root", root, "--resolve", o.resolve};
    if (o.cgroup_fd >= 0) {
      args.push_back("--cgroup-fd");
      args.push_back("4");
    }
    int lfd = -1;
    if (o.listen) {
      // Beside the root, not in it: commands run in the host's root anyway.
      socket_path_ = root + ".sock";
      lfd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_un sa{};
      sa.sun_family = AF_UNIX;
      std::snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", socket_path_.c_str());
      ::unlink(socket_path_.c_str());
      if (lfd < 0 || ::bind(lfd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
          ::listen(lfd, 8) != 0) {
        if (lfd >= 0) ::close(lfd);
        ::close(sv[0]);
        ::close(sv[1]);
        return;
      }
      args.insert(args.end(), {"--listen-fd", "5"});
      listen_ = true;
    }
    if (o.orphan_timeout_s >= 0)
      args.insert(args.end(), {"--orphan-timeout", std::to_string(o.orphan_timeout_s)});
    if (o.oom_fd) args.insert(args.end(), {"--oom-fd", "6"});
    if (o.serial) {
      args.push_back("--serial");
      listen_ = true;  // EOF does not end it either: killed on destruction
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::string proc_dir = root + "/proc";
    if (o.mount_proc) ::mkdir(proc_dir.c_str(), 0555);
    pid_ = ::fork();
    if (pid_ == 0) {
      if (o.mount_proc) {
        if (::unshare(CLONE_NEWNS) != 0) ::_exit(120);
        if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) ::_exit(121);
        if (::mount("proc", proc_dir.c_str(), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) !=
            0)
          ::_exit(122);
      }
      // Out of the way first: the cgroup fd may sit at 3 itself.
      int cg = o.cgroup_fd >= 0 ? ::fcntl(o.cgroup_fd, F_DUPFD, 10) : -1;
      if (o.cgroup_fd >= 0 && cg < 0) ::_exit(124);
      int lfd2 = lfd >= 0 ? ::fcntl(lfd, F_DUPFD, 10) : -1;
      if (lfd >= 0 && lfd2 < 0) ::_exit(125);
      if (::dup2(sv[1], 3) < 0) ::_exit(123);
      if (cg >= 0 && ::dup2(cg, 4) < 0) ::_exit(124);
      if (lfd2 >= 0 && ::dup2(lfd2, 5) < 0) ::_exit(125);
      // This process becomes the agent at execv, so its own score is the agent's.
      if (o.oom_fd) {
        int score = ::open("/proc/self/oom_score_adj", O_RDWR);
        if (score < 0 || ::dup2(score, 6) < 0) ::_exit(126);
      }
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(sv[1]);
    if (lfd >= 0) ::close(lfd);
    fd_ = sv[0];
  }
  ~AgentProcess() {
    close_fd();
    // With a listening socket EOF does not end the agent; its commands die
    // with it (the command inits' PDEATHSIG or EOF on their channels).
    if (listen_ && pid_ > 0 && !reaped_) ::kill(pid_, SIGKILL);
    if (!socket_path_.empty()) ::unlink(socket_path_.c_str());
    if (pid_ > 0 && !reaped_) {
      // EOF on the control stream makes the agent kill its commands and exit.
      wait_exit();
    }
  }
  AgentProcess(const AgentProcess&) = delete;
  AgentProcess& operator=(const AgentProcess&) = delete;

  int fd() const { return fd_; }
  pid_t pid() const { return pid_; }
  const std::string& socket_path() const { return socket_path_; }
  void close_fd() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // Blocking waitpid; returns the raw wait status.
  int wait_exit() {
    if (reaped_) return status_;
    while (::waitpid(pid_, &status_, 0) < 0 && errno == EINTR) {
    }
    reaped_ = true;
    return status_;
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  bool reaped_ = false;
  int status_ = 0;
  bool listen_ = false;
  std::string socket_path_;
};

struct ExecOutcome {
  Result<node::ExecResult> result = std::unexpected(Error{});
  std::string out, err;
  uint32_t pid = 0;
  bool started = false;
};

class AgentTestBase : public ::testing::Test {
 protected:
  // As in tidepoold (daemon.cpp): a write to an agent that is gone must be an
  // error (EPIPE) for AgentClient, not a signal that ends the process.
  void SetUp() override { ::signal(SIGPIPE, SIG_IGN); }
  void TearDown() override { stop(); }

  // Starts the agent and waits for kReady.
  void start(AgentOptions o = {}) {
    ASSERT_FALSE(root_.path().empty());
    agent_ = std::make_unique<AgentProcess>(root_.path(), o);
    ASSERT_GE(agent_->fd(), 0);
    client_ = node::AgentClient::create(io_, agent_->fd(), "sb-test");
    client_->set_on_closed([this](const Error& e) {
      closed_ = true;
      closed_error_ = e;
    });
    auto r = await<void>([&](auto cb) { client_->start(cb); });
    ASSERT_TRUE(r.has_value()) << r.error().message();
  }

  void stop() {
    if (client_) {
      client_->close();
      io_.restart();
      io_.run();
      client_.reset();
    }
    agent_.reset();
  }

  // Runs the io_context until pred() holds; false if it ran out of work first.
  // (An io_context stops by itself whenever it runs out of work, so it is
  // restarted before each step.)
  bool run_until(const std::function<bool()>& pred) {
    int idle = 0;
    while (!pred()) {
      if (io_.stopped()) io_.restart();
      if (io_.run_one() > 0) {
        idle = 0;
      } else if (++idle > 1) {
        return pred();
      }
    }
    return true;
  }

  template <class T, class Op>
  Result<T> await(Op op) {
    std::optional<Result<T>> out;
    op([&out](Result<T> r) { out.emplace(std::move(r)); });
    if (!run_until([&] { return out.has_value(); })) return fail(Code::kInternal, "io ran dry");
    return std::move(*out);
  }

  // Runs one command to its end; on_started/on_output hooks are optional.
  ExecOutcome exec(const node::ExecRequest& req,
                   std::function<void(uint32_t id, ExecOutcome&)> on_started = nullptr,
                   std::function<void(uint32_t id, ExecOutcome&)> on_output = nullptr) {
    ExecOutcome o;
    bool done = false;
    uint32_t id = 0;
    node::ExecHandlers h;
    h.on_started = [&](uint32_t pid) {
      o.started = true;
      o.pid = pid;
      if (on_started) on_started(id, o);
    };
    h.on_output = [&](int stream, std::string_view d) {
      (stream == 1 ? o.out : o.err).append(d);
      if (on_output) on_output(id, o);
    };
    h.on_done = [&](Result<node::ExecResult> r) {
      o.result = std::move(r);
      done = true;
    };
    id = client_->exec(req, std::move(h));
    run_until([&] { return done; });
    return o;
  }

  static node::ExecRequest sh(const std::string& script) {
    node::ExecRequest r;
    r.argv = {"sh", "-c", script};
    return r;
  }

  std::string host_path(const std::string& p) const { return root_.path() + p; }

  boost::asio::io_context io_;
  TempDir root_;
  std::unique_ptr<AgentProcess> agent_;
  std::shared_ptr<node::AgentClient> client_;
  bool closed_ = false;
  Error closed_error_;
};

// True when `pid` no longer exists (zombies count as existing).
inline bool process_gone(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

}  // namespace tp::agent_test
