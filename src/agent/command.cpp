#include "agent/command.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace tp::agent {
namespace {

uint64_t mono_us() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000ull + static_cast<uint64_t>(ts.tv_nsec) / 1000;
}

// Everything the forked processes need, prepared before forking.
struct Prepared {
  std::vector<std::string> candidates;
  std::vector<char*> argv;
  std::vector<char*> envp;
  const ExecSpec* spec = nullptr;
  bool born_at_command_score = false;  // the agent raised its own score first (ScoreForCommand)
};

// Where the command's process reports a failure before execve: the exec
// channel (fallback) or memory shared with the agent (cgroup mode, CLONE_VM).
struct ChildCtx {
  const Prepared* p = nullptr;
  int stdin_r = -1, stdout_w = -1, stderr_w = -1;
  int exec_w = -1;                // fallback mode
  ExecFailure* shared = nullptr;  // cgroup mode
  int cgroup_dir = -1;            // cgroup mode: the command's cgroup
  const char* join_file = nullptr;
};

// No allocation here: in cgroup mode this runs in a CLONE_VM child.
[[noreturn]] void report_failure(const ChildCtx& ctx, const char* what, const char* arg, int err) {
  ExecFailure f;
  f.err = err;
  std::snprintf(f.what, sizeof(f.what), "%s %s", what, arg);
  if (ctx.shared) {
    *ctx.shared = f;
  } else {
    (void)::send(ctx.exec_w, &f, sizeof(f), MSG_NOSIGNAL);
  }
  ::_exit(127);
}

void send_hello(int exec_w) {
  ExecHello h;
  iovec iov{&h, sizeof(h)};
  union {
    cmsghdr align;
    char buf[CMSG_SPACE(sizeof(ucred))];
  } control{};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.buf;
  msg.msg_controllen = sizeof(control.buf);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_CREDENTIALS;
  c->cmsg_len = CMSG_LEN(sizeof(ucred));
  ucred cred{::getpid(), ::getuid(), ::getgid()};
  std::memcpy(CMSG_DATA(c), &cred, sizeof(cred));
  (void)::sendmsg(exec_w, &msg, MSG_NOSIGNAL);
}

// Removes CAP_SYS_PTRACE from the effective, permitted and inheritable sets.
void drop_ptrace_cap() {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (::syscall(SYS_capget, &hdr, data) != 0) return;
  const uint32_t bit = 1u << (CAP_SYS_PTRACE % 32);
  const int idx = CAP_SYS_PTRACE / 32;
  data[idx].effective &= ~bit;
  data[idx].permitted &= ~bit;
  data[idx].inheritable &= ~bit;
  (void)::syscall(SYS_capset, &hdr, data);
}

// The command's process: vforked by the command init (fallback) or cloned
// with CLONE_VM | CLONE_VFORK by the agent (cgroup mode). Never returns. Uses
// no heap: in cgroup mode it shares the agent's memory until execve.
[[noreturn]] void run_command(const ChildCtx& ctx) {
  const Prepared& p = *ctx.p;
  const ExecSpec& spec = *p.spec;
  if (ctx.exec_w >= 0) send_hello(ctx.exec_w);
  if (ctx.cgroup_dir >= 0) {
    // First, and while still the agent's uid (the cgroup's files are the
    // sandbox root's): everything the command starts is born in its cgroup.
    int fd = ::openat(ctx.cgroup_dir, ctx.join_file, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || ::write(fd, "0", 1) != 1)
      report_failure(ctx, "join cgroup", ctx.join_file, errno);
    ::close(fd);
  }
  // Commands, not the agent, are what the OOM killer picks: the agent runs at -999
  // where the daemon may set that, else at 0; a command starts at 500 (raising a score
  // needs no privilege). A command may lower its own score again, but not below the
  // agent's. Where the agent raised its own score around the clone, the score came
  // with it, and an open and write of /proc (13 us in a fresh process here) is saved.
  if (!p.born_at_command_score) {
    if (int fd = ::open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC); fd >= 0) {
      (void)!::write(fd, "500", 3);
      ::close(fd);
    }
  }
  ::setsid();
  // The pipe ends are >= 3 (the agent keeps 0..2 open), so dup2 cannot clobber them.
  if (::dup2(ctx.stdin_r, 0) < 0 || ::dup2(ctx.stdout_w, 1) < 0 || ::dup2(ctx.stderr_w, 2) < 0)
    report_failure(ctx, "dup2", "stdio", errno);
  // Every other fd closes at execve; exec_w stays usable to report failures.
  if (::syscall(SYS_close_range, 3u, ~0u, 4u /* CLOSE_RANGE_CLOEXEC */) != 0) {
    for (int fd = 3; fd < 1024; ++fd) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
  // execve resets handled signals; only ignored ones survive it, and the agent
  // (like the command init) ignores SIGPIPE alone and installs no handler.
  // One call instead of one per signal: this is on every exec's path.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(SIGPIPE, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::umask(022);
  // Without CAP_SETPCAP (unprivileged test runs) this fails; nothing to drop then.
  (void)::prctl(PR_CAPBSET_DROP, CAP_SYS_PTRACE, 0, 0, 0);
  bool change = spec.uid != ::geteuid() || spec.gid != ::getegid();
  // An unprivileged agent (unit tests on a host) cannot switch identity; the
  // default ids (0) then mean "the agent's own", other ids still fail below.
  if (::geteuid() != 0 && (spec.uid == 0 || spec.uid == ::geteuid()) &&
      (spec.gid == 0 || spec.gid == ::getegid()))
    change = false;
  char num[16];
  if (::setgroups(0, nullptr) != 0 && change) report_failure(ctx, "setgroups", "0", errno);
  if (change) {
    std::snprintf(num, sizeof(num), "%u", spec.gid);
    if (::setresgid(spec.gid, spec.gid, spec.gid) != 0)
      report_failure(ctx, "setresgid", num, errno);
    std::snprintf(num, sizeof(num), "%u", spec.uid);
    if (::setresuid(spec.uid, spec.uid, spec.uid) != 0)
      report_failure(ctx, "setresuid", num, errno);
  }
  drop_ptrace_cap();
  // After the id change, which clears it.
  (void)::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  (void)::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
  if (::chdir(spec.cwd.c_str()) != 0) report_failure(ctx, "chdir", spec.cwd.c_str(), errno);
  int err = ENOENT;
  bool saw_eacces = false;
  for (const auto& c : p.candidates) {
    ::execve(c.c_str(), p.argv.data(), p.envp.data());
    err = errno;
    if (err == EACCES) saw_eacces = true;
    // Keep searching PATH only for "not here" errors, as execvp does.
    if (err != ENOENT && err != ENOTDIR && err != EACCES) break;
  }
  if (saw_eacces && (err == ENOENT || err == ENOTDIR)) err = EACCES;
  report_failure(ctx, "execve", spec.argv.empty() ? "" : spec.argv[0].c_str(), err);
}

int command_entry(void* arg) { run_command(*static_cast<const ChildCtx*>(arg)); }

// Pids whose parent is `self`, from /proc (the fallback mode's sweep).
std::vector<pid_t> children_of(pid_t self) {
  std::vector<pid_t> out;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/task/%d/children", self, self);
  if (FILE* f = std::fopen(path, "re")) {
    int pid;
    while (std::fscanf(f, "%d", &pid) == 1) out.push_back(pid);
    std::fclose(f);
    return out;
  }
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* de = ::readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(de->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    std::snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    char buf[512];
    ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
    ::close(fd);
    if (n <= 0) continue;
    buf[n] = '\0';
    const char* rp = std::strrchr(buf, ')');  // comm may contain spaces and parens
    char state;
    int ppid;
    if (rp && std::sscanf(rp + 1, " %c %d", &state, &ppid) == 2 && ppid == self)
      out.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(d);
  return out;
}

struct InitState {
  pid_t main_pid = -1;
  bool main_done = false;
  int main_status = 0;
  uint64_t start_us = 0;
  uint64_t end_us = 0;
};

void note_reaped(InitState* s, pid_t pid, int status) {
  if (pid == s->main_pid && !s->main_done) {
    s->main_done = true;
    s->main_status = status;
    s->end_us = mono_us();
  }
}

void reap_nonblocking(InitState* s) {
  for (;;) {
    int st = 0;
    pid_t pid = ::waitpid(-1, &st, WNOHANG);
    if (pid <= 0) return;
    note_reaped(s, pid, st);
  }
}

// Sends `sig` to every process of the command.
void signal_all(InitState* s, int sig) {
  bool group_alive = !s->main_done && ::kill(-s->main_pid, sig) == 0;
  // Reparented orphans outside the command's process group (they left it
  // with setsid); members of the group already got the signal once.
  for (pid_t c : children_of(::getpid())) {
    if (group_alive && ::getpgid(c) == s->main_pid) continue;
    ::kill(c, sig);
  }
}

// Kills every process of the command and reaps them all.
void kill_all_and_reap(InitState* s) {
  for (;;) {
    signal_all(s, SIGKILL);
    int st = 0;
    pid_t pid = ::waitpid(-1, &st, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      return;  // ECHILD: nothing left
    }
    note_reaped(s, pid, st);
  }
}

[[noreturn]] void finish_init(InitState* s, int init_w) {
  kill_all_and_reap(s);
  InitReport r;
  r.wait_status = s->main_done ? s->main_status : (SIGKILL & 0x7f);
  rusage ru{};
  if (::getrusage(RUSAGE_CHILDREN, &ru) == 0) r.max_rss_kb = static_cast<uint64_t>(ru.ru_maxrss);
  r.wall_us = (s->main_done ? s->end_us : mono_us()) - s->start_us;
  (void)::send(init_w, &r, sizeof(r), MSG_NOSIGNAL);
  ::_exit(0);
}

// Closes every fd >= 3 that is not in `keep`.
void close_all_but(std::vector<int> keep) {
  std::sort(keep.begin(), keep.end());
  unsigned lo = 3;
  for (int k : keep) {
    if (k < static_cast<int>(lo)) continue;
    if (static_cast<unsigned>(k) > lo)
      ::syscall(SYS_close_range, lo, static_cast<unsigned>(k - 1), 0u);
    lo = static_cast<unsigned>(k) + 1;
  }
  ::syscall(SYS_close_range, lo, ~0u, 0u);
}

// The command init. Never returns.
[[noreturn]] void run_init(const Prepared& p, int stdin_r, int stdout_w, int stderr_w, int exec_w,
                           int init_w) {
  // The agent's other fds (control socket, other commands' pipes) must not
  // stay open in here: they would keep pipes from reaching EOF.
  close_all_but({stdin_r, stdout_w, stderr_w, exec_w, init_w});
  // Dies with the agent (its children then with it, see run_command).
  (void)::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  (void)::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  InitState s;
  // SIGCHLD stays blocked (inherited from the agent) and is read from a signalfd.
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  ::sigprocmask(SIG_BLOCK, &chld, nullptr);
  int sfd = ::signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  s.start_us = mono_us();
  // vfork: the command borrows this process's memory until its execve, so no
  // page tables are copied and torn down again (this process is single-threaded
  // and waits meanwhile; run_command never returns and changes nothing of ours
  // that we read afterwards).
  ChildCtx ctx;
  ctx.p = &p;
  ctx.stdin_r = stdin_r;
  ctx.stdout_w = stdout_w;
  ctx.stderr_w = stderr_w;
  ctx.exec_w = exec_w;
  pid_t pid = ::vfork();
  if (pid == 0) run_command(ctx);
  if (pid < 0) {
    ExecFailure f;
    f.err = errno;
    std::snprintf(f.what, sizeof(f.what), "fork command");
    (void)::send(exec_w, &f, sizeof(f), MSG_NOSIGNAL);
    s.main_done = true;
    s.main_status = 127 << 8;
    s.end_us = mono_us();
  }
  s.main_pid = pid;
  ::close(stdin_r);
  ::close(stdout_w);
  ::close(stderr_w);
  ::close(exec_w);
  while (!s.main_done) {
    // Without a signalfd (never expected) the loop reaps by polling every 50 ms.
    pollfd pfd[2] = {{sfd, POLLIN, 0}, {init_w, POLLIN, 0}};
    int n = ::poll(pfd, 2, sfd >= 0 ? -1 : 50);
    if (n < 0 && errno != EINTR) break;
    if (sfd >= 0 && (pfd[0].revents & POLLIN)) {
      signalfd_siginfo si;
      while (::read(sfd, &si, sizeof(si)) == sizeof(si)) {
      }
    }
    reap_nonblocking(&s);
    if (pfd[1].revents & (POLLIN | POLLHUP | POLLERR)) {
      InitRequest req;
      ssize_t r = ::recv(init_w, &req, sizeof(req), MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) break;  // agent gone
      if (r == static_cast<ssize_t>(sizeof(req))) {
        if (req.op == 'K') break;
        if (req.op == 'S' && req.signo > 0 && req.signo < NSIG) signal_all(&s, req.signo);
      }
    }
  }
  finish_init(&s, init_w);
}

std::unexpected<Error> sys_error(const char* call) { return sys_fail(call, errno); }

}  // namespace

std::vector<std::string> build_env(const std::vector<std::string>& given, uint32_t uid) {
  std::vector<std::string> env;
  if (given.empty()) {
    env = {std::string("PATH=") + kDefaultPath, "LANG=C.UTF-8"};
  } else {
    env = given;
  }
  bool has_home = std::any_of(env.begin(), env.end(),
                              [](const std::string& e) { return e.starts_with("HOME="); });
  if (!has_home) env.push_back(uid == 0 ? "HOME=/root" : "HOME=/");
  return env;
}

std::string path_of_env(const std::vector<std::string>& env) {
  for (const auto& e : env)
    if (e.starts_with("PATH=")) return e.substr(5);
  return kDefaultPath;
}

std::vector<std::string> exec_candidates(std::string_view argv0, std::string_view path_var) {
  if (argv0.empty()) return {};
  if (argv0.find('/') != std::string_view::npos) return {std::string(argv0)};
  std::vector<std::string> out;
  size_t i = 0;
  for (;;) {
    size_t j = path_var.find(':', i);
    std::string_view dir = path_var.substr(i, j == std::string_view::npos ? path_var.npos : j - i);
    std::string d = dir.empty() ? std::string(".") : std::string(dir);
    out.push_back(d.back() == '/' ? d + std::string(argv0) : d + "/" + std::string(argv0));
    if (j == std::string_view::npos) break;
    i = j + 1;
  }
  return out;
}

namespace {

// The stack of the agent's CLONE_VFORK children: the agent is suspended while
// one runs, so one stack serves every spawn. Mapped once, with a guard page
// below it.
constexpr size_t kChildStack = 64u << 10;
char* child_stack_top() {
  static char* top = nullptr;
  if (!top) {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    void* m = ::mmap(nullptr, kChildStack + page, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return nullptr;
    ::mprotect(m, page, PROT_NONE);
    top = static_cast<char*>(m) + kChildStack + page;
  }
  return top;
}

}  // namespace

namespace {

int g_oom_fd = -1;
char g_own_score[16] = "0";
size_t g_own_score_len = 1;

// Raises the agent's score to the commands' for the lifetime of the object (see
// set_oom_score_fd).
class ScoreForCommand {
 public:
  ScoreForCommand() {
    if (g_oom_fd >= 0) raised_ = ::write(g_oom_fd, "500", 3) == 3;
  }
  ~ScoreForCommand() {
    if (raised_) (void)!::write(g_oom_fd, g_own_score, g_own_score_len);
  }
  ScoreForCommand(const ScoreForCommand&) = delete;
  ScoreForCommand& operator=(const ScoreForCommand&) = delete;
  bool raised() const { return raised_; }

 private:
  bool raised_ = false;
};

}  // namespace

void set_oom_score_fd(int fd) {
  char buf[sizeof g_own_score] = {};
  // Through the descriptor: the sandbox's own /proc/1/oom_score_adj is masked.
  ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' ')) --n;
  if (n <= 0) return;  // unknown: leave commands as they are
  std::memcpy(g_own_score, buf, static_cast<size_t>(n));
  g_own_score[n] = '\0';
  g_own_score_len = static_cast<size_t>(n);
  g_oom_fd = fd;
}

Result<Spawned> spawn_command(const ExecSpec& spec, const CgroupRoot* cgroup_root, uint64_t seq,
                              CommandCgroup* spare) {
  if (spec.argv.empty()) return fail(Code::kInvalidArgument, "exec: empty argv");
  Prepared p;
  p.spec = &spec;
  p.candidates = exec_candidates(spec.argv[0], path_of_env(spec.env));
  for (const auto& a : spec.argv) p.argv.push_back(const_cast<char*>(a.c_str()));
  p.argv.push_back(nullptr);
  for (const auto& e : spec.env) p.envp.push_back(const_cast<char*>(e.c_str()));
  p.envp.push_back(nullptr);

  int in[2], out[2], err[2];
  if (::pipe2(in, O_CLOEXEC) != 0) return sys_error("pipe2");
  sys::UniqueFd in_r(in[0]), in_w(in[1]);
  if (::pipe2(out, O_CLOEXEC) != 0) return sys_error("pipe2");
  sys::UniqueFd out_r(out[0]), out_w(out[1]);
  if (::pipe2(err, O_CLOEXEC) != 0) return sys_error("pipe2");
  sys::UniqueFd err_r(err[0]), err_w(err[1]);
  Spawned s;
  // Born at the commands' score (set_oom_score_fd); the agent's comes back when this ends.
  ScoreForCommand score;
  p.born_at_command_score = score.raised();

  if (cgroup_root) {
    Result<CommandCgroup> cg = spare && spare->valid() ? Result<CommandCgroup>(std::move(*spare))
                                                       : CommandCgroup::make(*cgroup_root, seq);
    if (!cg) return std::unexpected(cg.error());
    char* stack = child_stack_top();
    if (!stack) return sys_error("mmap(command stack)");
    ChildCtx ctx;
    ctx.p = &p;
    ctx.stdin_r = in_r.get();
    ctx.stdout_w = out_w.get();
    ctx.stderr_w = err_w.get();
    ctx.shared = &s.failure;
    ctx.cgroup_dir = cg->dir_fd();
    ctx.join_file = cg->join_file();
    // The agent is single-threaded and has no signal handlers, so the child
    // can borrow its memory: no page-table copy, and this call returns once
    // the child has exec'd (or written its failure and exited).
    pid_t pid = ::clone(command_entry, stack, CLONE_VM | CLONE_VFORK | SIGCHLD, &ctx);
    if (pid < 0) return sys_error("clone(CLONE_VM|CLONE_VFORK)");
    s.pid = pid;
    s.failed = s.failure.err != 0 || s.failure.what[0] != '\0';
    s.cgroup = std::move(*cg);
  } else {
    int ex[2], ic[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ex) != 0)
      return sys_error("socketpair");
    sys::UniqueFd ex_a(ex[0]), ex_c(ex[1]);
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ic) != 0)
      return sys_error("socketpair");
    sys::UniqueFd ic_a(ic[0]), ic_c(ic[1]);
    int one = 1;
    if (::setsockopt(ex_a.get(), SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)) != 0)
      return sys_error("setsockopt SO_PASSCRED");
    pid_t pid = ::fork();
    if (pid < 0) return sys_error("fork");
    if (pid == 0) run_init(p, in_r.get(), out_w.get(), err_w.get(), ex_c.get(), ic_c.get());
    for (int fd : {ex_a.get(), ic_a.get()}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    s.pid = pid;
    s.via_init = true;
    s.exec_chan = std::move(ex_a);
    s.init_chan = std::move(ic_a);
  }
  for (int fd : {in_w.get(), out_r.get(), err_r.get()})
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  s.stdin_w = std::move(in_w);
  s.stdout_r = std::move(out_r);
  s.stderr_r = std::move(err_r);
  return s;
}

}  // namespace tp::agent
