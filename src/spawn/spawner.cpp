#include "spawn/spawner.h"

#include <fcntl.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "spawn/wire.h"
#include "sys/raw_syscall.h"

namespace tp::spawn {
namespace {

namespace raw = tp::sys::raw;

// Requests up to this size (all but those with huge environments) are read here:
// static and small, beside the rest of the binary's data, so that a child's page
// tables cover it with those (a 4 MiB buffer there cost every agent two more page
// table pages). Larger ones get a mapping of their own, unmapped after. Either way
// an idle spawner owns no page of a past request, and a child reads its plan where
// the spawner decoded it.
constexpr size_t kSmallMessage = 64u << 10;
// Our argv strings, contiguous on the stack (ExecPlan::cmdline).
char* g_cmdline = nullptr;
size_t g_cmdline_len = 0;
alignas(4096) char g_small[kSmallMessage];
Decoded g_dec;

void log_line(const char* what, const char* detail = "") {
  char line[256];
  int n = std::snprintf(line, sizeof line, "tp-spawner: %s%s\n", what, detail);
  if (n > 0) (void)!::write(2, line, std::min<size_t>(static_cast<size_t>(n), sizeof line - 1));
}

void report(int err_fd, int32_t step, int err) {
  if (err_fd < 0) return;
  ChildFailure f{step, err};
  (void)!::write(err_fd, &f, sizeof f);
}

bool write_text(const char* path, const char* text) {
  int fd = ::open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  size_t n = std::strlen(text);
  ssize_t w = ::write(fd, text, n);
  int e = errno;
  ::close(fd);
  errno = e;
  if (w >= 0 && static_cast<size_t>(w) != n) errno = EIO;
  return w >= 0 && static_cast<size_t>(w) == n;
}

// Releases the child: one byte on the sync socket, with its oom_score_adj opened for
// reading and writing when asked (the agent's own /proc files are host root's: it could not open
// it itself). A child whose file cannot be opened goes without.
bool release(int sock, long pid, bool with_oom) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%ld/oom_score_adj", pid);
  // Read-write: inside the sandbox its own /proc/1/oom_score_adj is masked, so the
  // agent reads its score through this descriptor too.
  int oom = with_oom ? ::open(path, O_RDWR | O_CLOEXEC) : -1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  iovec iov{const_cast<char*>("x"), 1};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  if (oom >= 0) {
    mh.msg_control = control;
    mh.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &oom, sizeof(int));
  }
  bool ok = ::sendmsg(sock, &mh, MSG_NOSIGNAL) == 1;
  int e = errno;
  if (oom >= 0) ::close(oom);
  errno = e;
  return ok;
}

// One request: clone, maps, release. Every outcome ends in a record on the error
// pipe (or, for a request too broken to name one, in the EOF the caller's close gives).
void serve(int sock, const char* msg, size_t len, const int* fds, uint32_t nfds,
           AgentMain agent_main) {
  const char* why = "";
  int err_fd = -1;
  if (!decode(msg, len, fds, nfds, &g_dec, &why, &err_fd)) {
    report(err_fd, kStepRejected, EINVAL);
    log_line("request refused: ", why);
    return;
  }
  ExecPlan& plan = g_dec.plan;
  const int err = plan.err_wr;
  int sync[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sync) != 0) {
    report(err, kStepSync, errno);
    return;
  }
  plan.sync_rd = sync[0];
  plan.drop_first[0] = sock;
  plan.drop_first[1] = sync[1];
  plan.agent_main = agent_main;
  plan.cmdline = g_cmdline;
  plan.cmdline_len = g_cmdline_len;
  // The user namespace's owner is the creator's effective uid: the sandbox's root,
  // so that the kernel's per-user counters of the namespace are the sandbox's own.
  long r = raw::call(SYS_setresuid, -1, g_dec.owner_uid, -1);
  if (r < 0) {
    report(err, kStepSetEuid, static_cast<int>(-r));
    ::close(sync[0]);
    ::close(sync[1]);
    return;
  }
  int pidfd = -1;
  clone_args ca{};
  // CLONE_PARENT: the daemon is the parent, so it alone reaps (through its pidfd)
  // and a dead spawner leaves no orphan behind. clone3 wants exit_signal 0 with it:
  // the child inherits ours (SIGCHLD), as the daemon's child.
  ca.flags = g_dec.clone_flags | CLONE_PARENT | CLONE_PIDFD;
  ca.pidfd = reinterpret_cast<uint64_t>(&pidfd);
  ca.exit_signal = 0;
  // A raw clone3 returns twice like fork(). glibc's idea of this thread's tid stays the
  // spawner's in the child; the agent is single-threaded and asks the kernel (getpid,
  // gettid) wherever it matters.
  long pid = raw::call(SYS_clone3, &ca, sizeof ca);
  if (pid == 0) run_child(plan);
  // Never serve on without root.
  if (raw::call(SYS_setresuid, -1, 0, -1) != 0) std::abort();
  ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);  // an id change may have reset it
  if (pid < 0) {
    report(err, kStepClone, static_cast<int>(-pid));
    ::close(sync[0]);
    ::close(sync[1]);
    return;
  }
  ::close(sync[0]);
  char path[64];
  int32_t failed = 0;
  int failed_errno = 0;
  std::snprintf(path, sizeof path, "/proc/%ld/uid_map", pid);
  if (!write_text(path, g_dec.uid_map)) {
    failed = kStepUidMap;
    failed_errno = errno;
  } else {
    std::snprintf(path, sizeof path, "/proc/%ld/gid_map", pid);
    if (!write_text(path, g_dec.gid_map)) {
      failed = kStepGidMap;
      failed_errno = errno;
    } else if (!release(sync[1], pid, (g_dec.flags & kRequestOomFd) != 0)) {
      failed = kStepSync;
      failed_errno = errno;
    }
  }
  if (failed) {
    report(err, failed, failed_errno);
    ::syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0);
  } else {
    report(err, kStepSpawned, static_cast<int>(pid));
  }
  ::close(sync[1]);
  ::close(pidfd);
}

}  // namespace

int spawner_main(int argc, char** argv, AgentMain agent_main) {
  int sock = 3;
  if (argc > 0) {
    g_cmdline = argv[0];
    g_cmdline_len = static_cast<size_t>(argv[argc - 1] + std::strlen(argv[argc - 1]) - argv[0]);
  }
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--spawner") == 0) continue;
    if (std::strcmp(argv[i], "--fd") == 0 && i + 1 < argc) {
      char* end = nullptr;
      long v = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || v < 0 || v > 1 << 20) {
        log_line("--fd: not a file descriptor: ", argv[i]);
        return 2;
      }
      sock = static_cast<int>(v);
      continue;
    }
    log_line("usage: tp-agent --spawner [--fd N]; unknown argument ", argv[i]);
    return 2;
  }
  if (::fcntl(sock, F_GETFD) < 0) {
    log_line("--fd: ", std::strerror(errno));
    return 2;
  }
  // Nothing but stdio and the socket: a child must not find anything else of ours.
  if (sock > 3) raw::call(SYS_close_range, 3, sock - 1, 0);
  raw::call(SYS_close_range, sock + 1, ~0U, 0);
  ::fcntl(sock, F_SETFD, FD_CLOEXEC);
  ::prctl(PR_SET_NAME, "tp-spawner", 0, 0, 0);
  ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  ::signal(SIGPIPE, SIG_IGN);
  if (::chdir("/") != 0) return 2;
  // Inherited by every child; lowering it needs CAP_SYS_RESOURCE, which some hosts'
  // root lacks: the agents then stay at 0, still below every command (which start at
  // 500). -999 and not -1000: the write also sets the lowest score children may
  // choose, and a command at -1000 would leave the OOM killer no victim.
  if (!write_text("/proc/self/oom_score_adj", "-999") && errno != EACCES && errno != EPERM)
    log_line("oom_score_adj: ", std::strerror(errno));
  if (::send(sock, "R", 1, MSG_NOSIGNAL) != 1) return 1;

  alignas(cmsghdr) static char control[CMSG_SPACE(kMaxFds * sizeof(int))];
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  for (;;) {
    // The length first (a SEQPACKET peek with MSG_TRUNC tells the whole message's).
    ssize_t want = ::recv(sock, nullptr, 0, MSG_PEEK | MSG_TRUNC);
    if (want < 0 && errno == EINTR) continue;
    if (want < 0) {
      log_line("recv: ", std::strerror(errno));
      return 1;
    }
    if (want == 0) return 0;  // the daemon is gone; our sandboxes are not our children
    char* buf = g_small;
    size_t cap = sizeof g_small;
    void* big = nullptr;
    if (static_cast<size_t>(want) > cap) {
      cap = (std::min(static_cast<size_t>(want), kMaxMessage) + page - 1) / page * page;
      big = ::mmap(nullptr, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (big == MAP_FAILED) {
        big = nullptr;
        cap = sizeof g_small;  // read what fits: decode() refuses the rest
      } else {
        buf = static_cast<char*>(big);
      }
    }
    iovec iov{buf, cap};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = control;
    mh.msg_controllen = sizeof control;
    ssize_t n = ::recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) n = 0;  // nothing consumed: peek again
    if (n < 0) {
      log_line("recvmsg: ", std::strerror(errno));
      return 1;
    }
    int fds[kMaxFds];
    uint32_t nfds = 0;
    for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < k && nfds < kMaxFds; ++i)
        std::memcpy(&fds[nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
    }
    // A truncated message or descriptor list fails decode() (sizes, counts).
    if (n > 0) serve(sock, buf, static_cast<size_t>(n), fds, nfds, agent_main);
    for (uint32_t i = 0; i < nfds; ++i) ::close(fds[i]);
    if (big)
      ::munmap(big, cap);  // its page tables go too
    else if (n > 0)
      ::madvise(g_small, (static_cast<size_t>(n) + page - 1) / page * page, MADV_DONTNEED);
  }
}

}  // namespace tp::spawn
