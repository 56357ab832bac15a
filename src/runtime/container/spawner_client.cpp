#include "runtime/container/spawner_client.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "common/log.h"

namespace tp::runtime::container {
namespace {

using spawn::ChildFailure;
using sys::UniqueFd;

int remaining_ms(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(left.count());
}

// Descriptions of the steps outside the plan (spawn::SpecialStep).
std::string special_step(int32_t step) {
  switch (step) {
    case spawn::kStepRejected:
      return "spawner refused the request (malformed; see the daemon's log)";
    case spawn::kStepSetEuid:
      return "setresuid(-1, <sandbox root>, -1) in the spawner";
    case spawn::kStepClone:
      return "clone3(CLONE_PARENT|CLONE_PIDFD|CLONE_NEWUSER|NEWNS|NEWPID|NEWUTS|NEWIPC|NEWNET) in "
             "the spawner";
    case spawn::kStepUidMap:
      return "write(/proc/<child>/uid_map) in the spawner";
    case spawn::kStepGidMap:
      return "write(/proc/<child>/gid_map) in the spawner";
    case spawn::kStepSync:
      return "sync pipe of the spawner";
    default:
      return "sandbox setup";
  }
}

// Exit status of a (non-reaped) child of ours, for messages.
std::string exit_text(const sys::Pidfd& p) {
  siginfo_t si{};
  if (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(p.fd()), &si,
               WEXITED | WNOWAIT | WNOHANG) != 0 ||
      si.si_pid == 0)
    return "still running";
  return (si.si_code == CLD_EXITED ? "exit status " : "signal ") + std::to_string(si.si_status);
}

}  // namespace

Result<std::unique_ptr<Spawner>> Spawner::start(int exe_fd, std::string path,
                                                std::chrono::milliseconds timeout) {
  std::unique_ptr<Spawner> s(new Spawner(exe_fd, std::move(path), timeout));
  TP_TRY(s->current());
  return s;
}

Spawner::~Spawner() {
  std::shared_ptr<Conn> c;
  {
    std::lock_guard lk(mu_);
    c = std::move(conn_);
  }
  if (c) {
    c->sock.reset();  // EOF: the spawner exits
    pollfd p{c->proc.fd(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout_.count())) <= 0) (void)c->proc.signal(SIGKILL);
    (void)c->proc.reap();
  }
  reap_dead(true);
}

pid_t Spawner::pid() {
  std::lock_guard lk(mu_);
  return conn_ && !conn_->proc.exited() ? conn_->proc.pid() : 0;
}

uint64_t Spawner::started() const {
  std::lock_guard lk(mu_);
  return started_;
}

void Spawner::reap_dead(bool block) {
  for (auto it = dead_.begin(); it != dead_.end();) {
    auto r = it->reap(!block);
    if (!r || *r)
      it = dead_.erase(it);
    else
      ++it;
  }
}

Result<std::shared_ptr<Spawner::Conn>> Spawner::current() {
  std::lock_guard lk(mu_);
  reap_dead(false);
  if (conn_ && !conn_->proc.exited()) return conn_;
  if (conn_) {
    spdlog::warn("spawner (pid {}) exited ({}); starting another", conn_->proc.pid(),
                 exit_text(conn_->proc));
    dead_.push_back(std::move(conn_->proc));
    conn_.reset();
    reap_dead(false);
  }
  auto c = launch();
  if (!c) return std::unexpected(c.error());
  conn_ = std::move(*c);
  ++started_;
  return conn_;
}

Result<std::shared_ptr<Spawner::Conn>> Spawner::launch() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
    return sys_fail("socketpair(AF_UNIX, SOCK_SEQPACKET) for the spawner");
  auto c = std::make_shared<Conn>();
  c->sock.reset(sv[0]);
  UniqueFd theirs(sv[1]);
  // A request is one message: room for the largest one (unix sockets count a
  // message against the sender's buffer).
  int buf = static_cast<int>(2 * spawn::kMaxMessage);
  if (::setsockopt(c->sock.get(), SOL_SOCKET, SO_SNDBUFFORCE, &buf, sizeof buf) != 0)
    (void)::setsockopt(c->sock.get(), SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  // A wedged spawner must not block a create forever on a full queue either.
  timeval tv{static_cast<time_t>(timeout_.count() / 1000),
             static_cast<suseconds_t>(timeout_.count() % 1000 * 1000)};
  (void)::setsockopt(c->sock.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);

  // posix_spawn: vfork-style (CLONE_VM|CLONE_VFORK), never a fork of the daemon.
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  // The socket at 3, the binary at 4 for the exec by path below (the spawner closes
  // it at once); both copied above 4 first, so that neither dup2 clobbers the other.
  UniqueFd sock_hi(::fcntl(theirs.get(), F_DUPFD_CLOEXEC, 10));
  UniqueFd exe_hi(::fcntl(exe_fd_, F_DUPFD_CLOEXEC, 10));
  if (!sock_hi || !exe_hi) {
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    return sys_fail("fcntl(F_DUPFD_CLOEXEC) for the spawner");
  }
  posix_spawn_file_actions_adddup2(&fa, sock_hi.get(), 3);
  posix_spawn_file_actions_adddup2(&fa, exe_hi.get(), 4);
  posix_spawn_file_actions_addclosefrom_np(&fa, 5);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  const std::string exe = "/proc/self/fd/4";
  char a0[] = "tp-agent", a1[] = "--spawner", a2[] = "--fd", a3[] = "3";
  char* argv[] = {a0, a1, a2, a3, nullptr};
  char e0[] = "PATH=/usr/sbin:/usr/bin:/sbin:/bin";
  char* envp[] = {e0, nullptr};
  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, exe.c_str(), &fa, &attr, argv, envp);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return sys_fail("posix_spawn(" + path_ + " --spawner)", rc);
  theirs.reset();
  int pfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pfd < 0) {
    int e = errno;
    ::kill(pid, SIGKILL);
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    return sys_fail("pidfd_open(spawner " + std::to_string(pid) + ")", e);
  }
  c->proc = sys::Pidfd(pfd, pid);
  // Its one byte: it is up and serving.
  pollfd p{c->sock.get(), POLLIN, 0};
  int pr = ::poll(&p, 1, static_cast<int>(timeout_.count()));
  char ready = 0;
  if (pr <= 0 || ::recv(c->sock.get(), &ready, 1, MSG_DONTWAIT) != 1 || ready != 'R') {
    std::string how = pr == 0 ? "no answer within " + std::to_string(timeout_.count()) + " ms"
                              : exit_text(c->proc);
    (void)c->proc.signal(SIGKILL);
    (void)c->proc.reap();
    return fail(Code::kUnavailable, path_ + " --spawner did not start (" + how +
                                        "): it must be a tp-agent of this build");
  }
  spdlog::debug("spawner started, pid {}", pid);
  return c;
}

void Spawner::replace(const std::shared_ptr<Conn>& c, const char* why) {
  std::lock_guard lk(mu_);
  if (conn_ != c) return;  // another thread replaced it already
  spdlog::warn("spawner (pid {}) {}: killing it; the next create starts another", c->proc.pid(),
               why);
  (void)conn_->proc.signal(SIGKILL);
  dead_.push_back(std::move(conn_->proc));
  conn_.reset();
  reap_dead(false);
}

Result<Spawner::Start> Spawner::send(spawn::Request req) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return sys_fail("pipe2(spawn error pipe)");
  UniqueFd err_rd(p[0]), err_wr(p[1]);
  req.err_slot = req.slot(err_wr.get());
  if (req.fds.size() > spawn::kMaxFds)
    return fail(Code::kInvalidArgument, "a sandbox needs " + std::to_string(req.fds.size()) +
                                            " descriptors, more than the spawner takes (" +
                                            std::to_string(spawn::kMaxFds) + ")");
  const std::string msg = spawn::encode(req);
  if (msg.size() > spawn::kMaxMessage)
    return fail(Code::kInvalidArgument,
                "sandbox plan of " + std::to_string(msg.size()) + " bytes (environment, layers) " +
                    "exceeds the spawner's " + std::to_string(spawn::kMaxMessage));
  std::vector<char> control(CMSG_SPACE(req.fds.size() * sizeof(int)));
  for (int attempt = 0;; ++attempt) {
    auto c = current();
    if (!c) return std::unexpected(c.error());
    iovec iov{const_cast<char*>(msg.data()), msg.size()};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = control.data();
    mh.msg_controllen = control.size();
    cmsghdr* cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(req.fds.size() * sizeof(int));
    std::memcpy(CMSG_DATA(cm), req.fds.data(), req.fds.size() * sizeof(int));
    ssize_t n;
    do n = ::sendmsg((*c)->sock.get(), &mh, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n == static_cast<ssize_t>(msg.size())) return Start(this, *c, std::move(err_rd));
    int e = n < 0 ? errno : EIO;
    const bool gone = e == EPIPE || e == ECONNRESET || e == ECONNREFUSED || e == ENOTCONN;
    replace(*c, gone ? "is gone" : e == EAGAIN ? "does not take requests" : "refused a request");
    if (!gone || attempt > 0) {
      if (e == EAGAIN)
        return fail(Code::kUnavailable,
                    "spawner took no request within " + std::to_string(timeout_.count()) + " ms");
      return sys_fail("sendmsg(spawner, " + std::to_string(msg.size()) + " bytes)", e);
    }
  }
}

void Spawner::Start::pump(bool until_pid) {
  if (!started_) {
    started_ = true;
    deadline_ = std::chrono::steady_clock::now() + owner_->timeout_;
  }
  auto adopt_pid = [&](int32_t pid) {
    if (child_.valid() || pid <= 0) return;
    // Our child (CLONE_PARENT), not reaped: the pid cannot name another process.
    int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (fd >= 0) child_ = sys::Pidfd(fd, pid);
  };
  while (!eof_ && !(until_pid && child_.valid())) {
    // The spawner's share has a deadline; the child's setup after it, as any
    // process's, has none.
    pollfd p{err_rd_.get(), POLLIN, 0};
    int pr = ::poll(&p, 1, spawned_ ? -1 : remaining_ms(deadline_));
    if (pr < 0 && errno == EINTR) continue;
    if (pr == 0) {
      if (!timed_out_) {
        timed_out_ = true;
        owner_->replace(conn_, "did not finish a start in time");
        // Killing it released the child (sync EOF): EOF follows shortly.
        deadline_ = std::chrono::steady_clock::now() + owner_->timeout_;
        continue;
      }
      eof_ = true;  // still no EOF: the child is wedged; it is killed
      continue;
    }
    ChildFailure recs[16];
    ssize_t n = ::read(err_rd_.get(), recs, sizeof recs);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      if (!has_failed_) failed_ = {spawn::kStepSync, errno};
      has_failed_ = true;
      eof_ = true;
      continue;
    }
    if (n == 0) {
      eof_ = true;
      continue;
    }
    for (size_t i = 0; i < static_cast<size_t>(n) / sizeof(ChildFailure); ++i) {
      const ChildFailure& r = recs[i];
      if (r.step == spawn::kStepHello) {
        adopt_pid(r.err);
      } else if (r.step == spawn::kStepSpawned) {
        spawned_ = true;
        adopt_pid(r.err);
      } else if (!has_failed_) {
        failed_ = r;
        has_failed_ = true;
      }
    }
  }
}

pid_t Spawner::Start::wait_pid() {
  pump(true);
  return child_.valid() && !has_failed_ ? child_.pid() : 0;
}

Result<sys::Pidfd> Spawner::Start::finish(const std::vector<std::string>& steps) {
  pump(false);
  sys::Pidfd& child = child_;
  const bool spawned = spawned_, timed_out = timed_out_, has_failed = has_failed_;
  const ChildFailure failed = failed_;
  conn_.reset();
  auto kill_child = [&] {
    if (!child.valid()) return;
    (void)child.signal(SIGKILL);
    (void)child.reap();
  };
  if (has_failed) {
    kill_child();
    std::string step = failed.step >= 0 ? (static_cast<size_t>(failed.step) < steps.size()
                                               ? steps[static_cast<size_t>(failed.step)]
                                               : std::string("sandbox setup"))
                                        : special_step(failed.step);
    return std::unexpected(Error{code_from_errno(failed.err), failed.err, step});
  }
  if (timed_out) {
    kill_child();
    return fail(Code::kUnavailable, "spawner did not start the sandbox within " +
                                        std::to_string(owner_->timeout_.count()) +
                                        " ms (replaced)");
  }
  if (!spawned) {
    // It closed the request without a word: it died (the next send() replaces it).
    kill_child();
    return fail(Code::kUnavailable, "spawner ended before starting the sandbox");
  }
  if (!child.valid())
    return fail(Code::kInternal, "sandbox child reported no pid (pidfd_open failed)");
  return std::move(child);
}

}  // namespace tp::runtime::container
