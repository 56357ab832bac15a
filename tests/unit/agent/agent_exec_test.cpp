// The real tp-agent, driven through AgentClient: commands.
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "agent_harness.h"

namespace tp::agent_test {
namespace {

std::string read_host_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Parameter: how the agent tracks a command's processes. kCgroupV2/kCgroupV1:
// a cgroup of its own under a delegated cgroup (--cgroup-fd, as in a sandbox;
// needs root and that hierarchy), kProcessGroup: the command-init fallback
// (process group + subreaper sweep).
enum class Mode { kCgroupV2, kCgroupV1, kProcessGroup };

class AgentExecTest : public AgentTestBase, public ::testing::WithParamInterface<Mode> {
 protected:
  void SetUp() override {
    if (GetParam() == Mode::kProcessGroup) return start(AgentOptions{});
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to make a cgroup";
    cg_ = std::make_unique<TestCgroup>(GetParam() == Mode::kCgroupV2);
    if (cg_->path().empty()) {
      cg_.reset();
      GTEST_SKIP() << "no such cgroup hierarchy on this host";
    }
    start(AgentOptions{.cgroup_fd = cg_->fd()});
  }
  void TearDown() override {
    stop();
    if (cg_) {
      // Every command's cgroup is gone with its command, or at the latest with the agent.
      auto left = cg_->children();
      EXPECT_TRUE(left.empty()) << left.front();
      cg_.reset();
    }
  }
  bool cgroup_mode() const { return cg_ != nullptr; }

  std::unique_ptr<TestCgroup> cg_;
};

INSTANTIATE_TEST_SUITE_P(Modes, AgentExecTest,
                         ::testing::Values(Mode::kCgroupV2, Mode::kCgroupV1, Mode::kProcessGroup),
                         [](const auto& info) {
                           return info.param == Mode::kCgroupV2   ? "CgroupV2"
                                  : info.param == Mode::kCgroupV1 ? "CgroupV1"
                                                                  : "ProcessGroup";
                         });

TEST_P(AgentExecTest, PingAnswers) {
  auto r = await<void>([&](auto cb) { client_->ping(cb); });
  EXPECT_TRUE(r.has_value());
}

TEST_P(AgentExecTest, ExitCodeAndSeparateStreams) {
  auto o = exec(sh("echo out; echo err >&2; exit 3"));
  ASSERT_TRUE(o.result.has_value()) << o.result.error().message();
  EXPECT_TRUE(o.started);
  EXPECT_GT(o.pid, 0u);
  EXPECT_EQ(o.result->exit_code, 3);
  EXPECT_EQ(o.result->signal, 0);
  EXPECT_EQ(o.out, "out\n");
  EXPECT_EQ(o.err, "err\n");
  EXPECT_FALSE(o.result->timed_out);
  EXPECT_FALSE(o.result->stdout_truncated);
  EXPECT_FALSE(o.result->stderr_truncated);
  EXPECT_GT(o.result->max_rss_kb, 0u);
}

TEST_P(AgentExecTest, SignalDeathIsReported) {
  auto o = exec(sh("kill -9 $$"));
  ASSERT_TRUE(o.result.has_value());
  EXPECT_EQ(o.result->exit_code, -1);
  EXPECT_EQ(o.result->signal, SIGKILL);
  EXPECT_FALSE(o.result->timed_out);
}

TEST_P(AgentExecTest, OutputIsBinarySafe) {
  std::string fmt, want;
  for (int i = 0; i < 256; ++i) {
    char b[8];
    std::snprintf(b, sizeof(b), "\\%03o", i);
    fmt += b;
    want.push_back(static_cast<char>(i));
  }
  auto o = exec(sh("printf '" + fmt + "'; printf '" + fmt + "' >&2"));
  ASSERT_TRUE(o.result.has_value());
  EXPECT_EQ(o.result->exit_code, 0);
  EXPECT_EQ(o.out, want);
  EXPECT_EQ(o.err, want);
}

TEST_P(AgentExecTest, OutputCapTruncatesAndReports) {
  auto req = sh("head -c 300000 /dev/zero; echo tail >&2");
  req.output_limit = 1000;
  auto o = exec(req);
  ASSERT_TRUE(o.result.has_value());
  EXPECT_EQ(o.result->exit_code, 0);  // the pipe kept draining: head finished
  EXPECT_EQ(o.out, std::string(1000, '\0'));
  EXPECT_TRUE(o.result->stdout_truncated);
  EXPECT_EQ(o.err, "tail\n");
  EXPECT_FALSE(o.result->stderr_truncated);
}

TEST_P(AgentExecTest, LargeOutputArrivesWhole) {
  auto o = exec(sh("head -c 5000000 /dev/zero | tr '\\0' x"));
  ASSERT_TRUE(o.result.has_value());
  EXPECT_EQ(o.out, std::string(5000000, 'x'));
  EXPECT_FALSE(o.result->stdout_truncated);
}

TEST_P(AgentExecTest, StdinDataThenEof) {
  auto req = sh("cat; echo done");
  req.stdin_data = "hello\n";
  auto o = exec(req);
  ASSERT_TRUE(o.result.has_value());
  EXPECT_EQ(o.out, "hello\ndone\n");
}

TEST_P(AgentExecTest, LargeStdinIsChunked) {
  auto req = sh("wc -c");
  req.stdin_data = std::string((5u << 20) / 2, 'a');  // 2.5 MiB: three frames
  auto o = exec(req);
  ASSERT_TRUE(o.result.has_value());
  EXPECT_EQ(std::stoul(o.out), req.stdin_data.size());
}

TEST_P(AgentExecTest, StreamingStdin) {
  auto req = sh("while read -r line; do echo \"got $line\"; done; echo bye");
  req.stdin_open = true;
  req.stdin_data = "one\n";
  int step = 0;
  auto o = exec(req, nullptr, [&](uint32_t id, ExecOutcome& o) {
    // Each answer triggers the next line: proves stdin stays open between frames.
    if (step == 0 && o.out == "got one\n") {
      step = 1;
      client_->send_stdin(id, "two\n", false);
    } else if (step == 1 && o.out == "got one\ngot two\n") {
      step = 2;
      client_->send_stdin(id, "three\n", true);
    }
  });
  ASSERT_TRUE(o.result.has_value());
  EXPECT_EQ(o.out, "got one\ngot two\ngot three\nbye\n");
}

// kStdinWrite: each piece is acknowledged once it is in the command's stdin, in
// order; a piece for a command whose stdin is closed, or for no command, fails.
TEST_P(AgentExecTest, PacedStdinIsAcknowledgedPieceByPiece) {
  auto req = sh("wc -c; exec 0<&-; sleep 0.2");
  req.stdin_open = true;
  std::vector<std::string> acks;
  uint32_t id = 0;
  auto o = exec(
      req,
      [&](uint32_t eid, ExecOutcome&) {
        id = eid;
        const std::string piece(700 << 10, 'p');
        for (int i = 0; i < 3; ++i)
          client_->write_stdin(eid, piece, i == 2, [&acks, i](Result<void> r) {
            acks.push_back(r ? "ok" + std::to_string(i) : r.error().message());
          });
      },
      nullptr);
  ASSERT_TRUE(o.result.has_value());
  EXPECT_EQ(o.out, std::to_string(3 * (700 << 10)) + "\n");
  EXPECT_EQ(acks, (std::vector<std::string>{"ok0", "ok1", "ok2"}));
  // The command is gone: its id has no stdin any more.
  auto gone = await<void>([&](auto cb) { client_->write_stdin(id, "x", false, cb); });
  ASSERT_FALSE(gone.has_value());
  EXPECT_EQ(gone.error().code, Code::kNotFound);
}

TEST_P(AgentExecTest, PacedStdinToAClosedStdinFails) {
  auto req = sh("exec 0<&-; echo closed; sleep 2");
  req.stdin_open = true;
  std::optional<Result<void>> ack;
  auto o = exec(req, nullptr, [&](uint32_t eid, ExecOutcome& o) {
    if (o.out != "closed\n" || ack) return;
    ack.emplace(Result<void>{});
    client_->write_stdin(eid, std::string(1 << 20, 'x'), true, [&, eid](Result<void> r) {
      ack = r;
      client_->signal(eid, SIGKILL);
    });
  });
  ASSERT_TRUE(ack.has_value());
  ASSERT_FALSE(ack->has_value());
  EXPECT_EQ(ack->error().code, Code::kConflict) << ack->error().message();
}

// A grandchild that leaves with setsid and records its pid (as the host sees
// it: /proc is the host's in these tests) before the parent prints "ready".
std::string daemon_script(const std::string& pidfile) {
  return "setsid sh -c 'read -r p rest < /proc/self/stat; echo $p > " + pidfile + ".tmp; mv " +
         pidfile + ".tmp " + pidfile +
         "; exec sleep 1000' </dev/null >/dev/null 2>&1 & "
         "while [ ! -s " +
         pidfile + " ]; do sleep 0.01; done; echo ready; sleep 1000";
}

TEST_P(AgentExecTest, TimeoutKillsDaemonisedGrandchild) {
  std::string pidfile = host_path("/daemon.pid");
  auto req = sh(daemon_script(pidfile));
  req.timeout_ms = 3000;
  auto o = exec(req);
  ASSERT_TRUE(o.result.has_value());
  EXPECT_TRUE(o.result->timed_out);
  EXPECT_EQ(o.result->exit_code, -1);
  EXPECT_EQ(o.result->signal, SIGKILL);
  EXPECT_EQ(o.out, "ready\n");
  std::string pid = read_host_file(pidfile);
  ASSERT_FALSE(pid.empty()) << "the grandchild did not start within the timeout";
  EXPECT_TRUE(process_gone(std::stoi(pid))) << "grandchild " << pid << " survived";
}

TEST_P(AgentExecTest, SigkillKillsDaemonisedGrandchild) {
  std::string pidfile = host_path("/daemon.pid");
  auto o = exec(sh(daemon_script(pidfile)), nullptr, [&](uint32_t id, ExecOutcome& o) {
    if (o.out == "ready\n") client_->signal(id, SIGKILL);
  });
  ASSERT_TRUE(o.result.has_value());
  EXPECT_FALSE(o.result->timed_out);
  EXPECT_EQ(o.result->signal, SIGKILL);
  std::string pid = read_host_file(pidfile);
  ASSERT_FALSE(pid.empty());
  EXPECT_TRUE(process_gone(std::stoi(pid)));
}

TEST_P(AgentExecTest, MainExitEndsBackgroundProcesses) {
  std::string pidfile = host_path("/bg.pid");
  auto o =
      exec(sh("sh -c 'read -r p rest < /proc/self/stat; echo $p > " + pidfile +
              "; exec sleep 1000' & while [ ! -s " + pidfile + " ]; do sleep 0.01; done; exit 0"));
  ASSERT_TRUE(o.result.has_value());
  EXPECT_EQ(o.result->exit_code, 0);
  std::string pid = read_host_file(pidfile);
  ASSERT_FALSE(pid.empty());
  EXPECT_TRUE(process_gone(std::stoi(pid)));
}

TEST_P(AgentExecTest, TermSignalIsForwarded) {
  // The signal reaches every process of the command. A child that dash has
  // forked but not yet exec'd still runs the trap, so the shell forks once,
  // waits until the child is `sleep`, and only then says ready.
  auto o = exec(sh("trap 'echo term; exit 7' TERM; sleep 1000 & c=; "
                   "until [ \"$c\" = sleep ]; do read -r c < /proc/$!/comm; done; "
                   "echo ready; wait"),
                nullptr, [&](uint32_t id, ExecOutcome& o) {
                  if (o.out == "ready\n") client_->signal(id, SIGTERM);
                });
  ASSERT_TRUE(o.result.has_value());
  EXPECT_EQ(o.result->exit_code, 7);
  EXPECT_EQ(o.out, "ready\nterm\n");
}

TEST_P(AgentExecTest, ConcurrentCommandsRunAtOnce) {
  // Four cats wait on stdin; they are fed in reverse order only once all four
  // started, so they must all be alive at the same time.
  constexpr int kN = 4;
  uint32_t ids[kN];
  std::string outs[kN];
  int started = 0, done = 0;
  Result<node::ExecResult> results[kN];
  for (int i = 0; i < kN; ++i) {
    node::ExecRequest req;
    req.argv = {"cat"};
    req.stdin_open = true;
    node::ExecHandlers h;
    h.on_started = [&](uint32_t) { ++started; };
    h.on_output = [&, i](int, std::string_view d) { outs[i].append(d); };
    h.on_done = [&, i](Result<node::ExecResult> r) {
      results[i] = std::move(r);
      ++done;
    };
    ids[i] = client_->exec(req, std::move(h));
  }
  ASSERT_TRUE(run_until([&] { return started == kN; }));
  for (int i = kN - 1; i >= 0; --i) client_->send_stdin(ids[i], "cmd" + std::to_string(i), true);
  ASSERT_TRUE(run_until([&] { return done == kN; }));
  for (int i = 0; i < kN; ++i) {
    ASSERT_TRUE(results[i].has_value());
    EXPECT_EQ(results[i]->exit_code, 0);
    EXPECT_EQ(outs[i], "cmd" + std::to_string(i));
  }
}

TEST_P(AgentExecTest, MissingCommandIsNotFound) {
  node::ExecRequest req;
  req.argv = {"tp-no-such-command-h2"};
  auto o = exec(req);
  ASSERT_FALSE(o.result.has_value());
  EXPECT_EQ(o.result.error().code, Code::kNotFound);
  EXPECT_FALSE(o.started);
}

TEST_P(AgentExecTest, BadCwdIsNotFound) {
  auto req = sh("pwd");
  req.cwd = "/tp-no-such-dir-h2";
  auto o = exec(req);
  ASSERT_FALSE(o.result.has_value());
  EXPECT_EQ(o.result.error().code, Code::kNotFound);
}

TEST_P(AgentExecTest, EmptyArgvIsInvalid) {
  auto o = exec(node::ExecRequest{});
  ASSERT_FALSE(o.result.has_value());
  EXPECT_EQ(o.result.error().code, Code::kInvalidArgument);
}

TEST_P(AgentExecTest, DefaultEnvironment) {
  auto o = exec(sh("echo \"$HOME|$LANG|$PATH\""));
  ASSERT_TRUE(o.result.has_value());
  EXPECT_EQ(o.out, "/root|C.UTF-8|/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n");
}

TEST_P(AgentExecTest, GivenEnvironmentReplacesDefault) {
  auto req = sh("echo \"$FOO|$LANG|$HOME\"");
  req.argv[0] = "/bin/sh";  // no PATH in the given environment
  req.env = {"FOO=bar baz"};
  auto o = exec(req);
  ASSERT_TRUE(o.result.has_value());
  EXPECT_EQ(o.out, "bar baz||/root\n");
}

TEST_P(AgentExecTest, CwdUidAndGid) {
  auto req = sh("pwd; id -u; id -g; id -G; echo $HOME");
  req.cwd = "/tmp";
  req.uid = 65534;
  req.gid = 65533;
  auto o = exec(req);
  ASSERT_TRUE(o.result.has_value()) << o.result.error().message();
  EXPECT_EQ(o.out, "/tmp\n65534\n65533\n65533\n/\n");
}

TEST_P(AgentExecTest, CommandSeesOnlyItsStdioAndNoPtraceCap) {
  // ls and grep inherit what sh has.
  auto o =
      exec(sh("ls -l /proc/self/fd/; grep -E '^(Cap(Bnd|Eff|Prm)|NoNewPrivs):' /proc/self/status"));
  ASSERT_TRUE(o.result.has_value());
  // No socket (control stream, internal channels) reaches the command, nor
  // the agent's cgroup directory.
  EXPECT_EQ(o.out.find("socket:"), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("/sys/fs/cgroup"), std::string::npos) << o.out;
  std::istringstream in(o.out);
  std::string line;
  int caps = 0;
  while (std::getline(in, line)) {
    if (!line.starts_with("Cap")) continue;
    uint64_t v = std::stoull(line.substr(line.find(':') + 1), nullptr, 16);
    EXPECT_EQ(v & (1ull << 19), 0u) << line;  // CAP_SYS_PTRACE
    ++caps;
  }
  EXPECT_EQ(caps, 3);
  EXPECT_NE(o.out.find("NoNewPrivs:\t1"), std::string::npos);
}

TEST_P(AgentExecTest, OrphanedZombiesAreReaped) {
  // The shell leaves a child that exits after the shell; nothing stays behind
  // and the agent keeps serving.
  auto o = exec(sh("(sleep 0.05; exit 0) & exit 0"));
  ASSERT_TRUE(o.result.has_value());
  auto again = exec(sh("echo still"));
  ASSERT_TRUE(again.result.has_value());
  EXPECT_EQ(again.out, "still\n");
}

// One process world: the pid the agent reports is the shell's own $$, and
// /proc/$$ is that shell (the agent runs as a host process here, so this is
// the host's /proc).
TEST_P(AgentExecTest, DollarDollarIsTheReportedPid) {
  auto o = exec(sh("echo $$; grep '^Name:' /proc/$$/status"));
  ASSERT_TRUE(o.result.has_value());
  ASSERT_TRUE(o.started);
  EXPECT_EQ(o.out, std::to_string(o.pid) + "\nName:\tsh\n");
}

// Commands start at oom_score_adj 500, above the agent, whether the agent was given its
// own score's descriptor (a sandbox's agent: the score comes with the clone) or not (it
// then writes the command's own /proc/self/oom_score_adj). With the descriptor the agent
// is back at its own score once the command has started.
TEST_P(AgentExecTest, CommandsStartAtOomScore500) {
  auto plain = exec(sh("cat /proc/self/oom_score_adj"));
  ASSERT_TRUE(plain.result.has_value());
  EXPECT_EQ(plain.out, "500\n");
  const std::string own = read_host_file("/proc/self/oom_score_adj");
  stop();
  start(AgentOptions{.cgroup_fd = cg_ ? cg_->fd() : -1, .oom_fd = true});
  auto o = exec(sh("cat /proc/self/oom_score_adj"));
  ASSERT_TRUE(o.result.has_value());
  EXPECT_EQ(o.out, "500\n") << o.err;
  EXPECT_EQ(read_host_file("/proc/" + std::to_string(agent_->pid()) + "/oom_score_adj"), own);
}

// A process started by one exec is found and stopped by the next one.
TEST_P(AgentExecTest, LaterExecFindsAndStopsAnEarlierOne) {
  // A duration nothing else on the host uses, as the process's marker.
  const std::string marker = "sleep 4242." + std::to_string(::getpid() % 1000 + 1000);
  node::ExecRequest bg;
  bg.argv = {"sh", "-c", "exec " + marker};
  bool done = false, started = false;
  uint32_t bg_pid = 0;
  Result<node::ExecResult> bg_result = std::unexpected(Error{});
  node::ExecHandlers h;
  h.on_started = [&](uint32_t pid) {
    started = true;
    bg_pid = pid;
  };
  h.on_done = [&](Result<node::ExecResult> r) {
    bg_result = std::move(r);
    done = true;
  };
  client_->exec(bg, std::move(h));
  ASSERT_TRUE(run_until([&] { return started; }));
  // pgrep from another exec sees it under the pid the agent reported.
  auto found = exec(sh("for i in $(seq 100); do p=$(pgrep -xf '" + marker +
                       "') && break; sleep 0.05; done; echo $p; kill -TERM $p"));
  ASSERT_TRUE(found.result.has_value());
  EXPECT_EQ(found.result->exit_code, 0) << found.err;
  EXPECT_EQ(found.out, std::to_string(bg_pid) + "\n");
  ASSERT_TRUE(run_until([&] { return done; }));
  ASSERT_TRUE(bg_result.has_value());
  EXPECT_EQ(bg_result->signal, SIGTERM);
}

// Cgroup mode: the command runs in a cgroup of its own under the delegated
// one. An ended command's cgroup is kept empty for the next command (at most a
// few of them), and every one is removed when the agent ends (TearDown).
TEST_P(AgentExecTest, CommandRunsInItsOwnCgroup) {
  if (!cgroup_mode()) GTEST_SKIP() << "cgroup mode only";
  auto o = exec(sh("cat /proc/self/cgroup"));
  ASSERT_TRUE(o.result.has_value());
  const std::string leaf = cg_->path().substr(cg_->path().rfind('/')) + "/c";
  EXPECT_NE(o.out.find(leaf), std::string::npos) << o.out;
  auto empty_children = [&] {
    for (const auto& c : cg_->children()) {
      std::ifstream procs(cg_->path() + "/" + c + "/cgroup.procs");
      std::string pid;
      if (procs >> pid) return false;
    }
    return true;
  };
  EXPECT_TRUE(empty_children());
  EXPECT_EQ(cg_->children().size(), 1u);
  // The next command reuses that (empty) cgroup instead of making one.
  auto o2 = exec(sh("cat /proc/self/cgroup"));
  ASSERT_TRUE(o2.result.has_value());
  EXPECT_EQ(o2.out, o.out);
  // Also after a command that never started.
  node::ExecRequest bad;
  bad.argv = {"tp-no-such-command-cg"};
  auto f = exec(bad);
  ASSERT_FALSE(f.result.has_value());
  EXPECT_EQ(f.result.error().code, Code::kNotFound);
  auto again = exec(sh("true"));  // a round trip after the failure's reap
  ASSERT_TRUE(again.result.has_value());
  EXPECT_TRUE(empty_children());
  // The failed command's cgroup comes back once its child is reaped, which may be
  // after `true` started in a new one.
  EXPECT_LE(cg_->children().size(), 2u);
}

// Cgroup mode: commands running at once each have their own cgroup; once they
// end, a few empty ones are kept and the rest removed.
TEST_P(AgentExecTest, ConcurrentCommandsHaveTheirOwnCgroups) {
  if (!cgroup_mode()) GTEST_SKIP() << "cgroup mode only";
  constexpr int kAtOnce = 6;
  int done = 0;
  std::set<std::string> cgroups;
  for (int i = 0; i < kAtOnce; ++i) {
    node::ExecHandlers h;
    auto out = std::make_shared<std::string>();
    h.on_output = [out](int, std::string_view d) { out->append(d); };
    h.on_done = [&, out](Result<node::ExecResult> r) {
      EXPECT_TRUE(r.has_value());
      cgroups.insert(*out);
      ++done;
    };
    client_->exec(sh("cat /proc/self/cgroup; sleep 0.3"), std::move(h));
  }
  ASSERT_TRUE(run_until([&] { return done == kAtOnce; }));
  EXPECT_EQ(cgroups.size(), static_cast<size_t>(kAtOnce));
  auto left = cg_->children();
  EXPECT_GE(left.size(), 1u);
  EXPECT_LE(left.size(), 4u);
}

// Cgroup mode: a double-forked daemon whose parent chain is gone entirely
// (not a child of the main process, nor of its process group) still dies
// when the main process exits.
TEST_P(AgentExecTest, DoubleForkedDaemonDiesWithMainProcess) {
  std::string pidfile = host_path("/dd.pid");
  auto o = exec(sh("(setsid sh -c 'read -r p rest < /proc/self/stat; echo $p > " + pidfile +
                   ".tmp; mv " + pidfile + ".tmp " + pidfile +
                   "; exec sleep 1000' </dev/null >/dev/null 2>&1 &) ; "
                   "while [ ! -s " +
                   pidfile + " ]; do sleep 0.01; done; echo ok"));
  ASSERT_TRUE(o.result.has_value());
  EXPECT_EQ(o.out, "ok\n");
  std::string pid = read_host_file(pidfile);
  ASSERT_FALSE(pid.empty());
  EXPECT_TRUE(process_gone(std::stoi(pid))) << "daemon " << pid << " survived";
}

}  // namespace
}  // namespace tp::agent_test
