#include "agent/command_cgroup.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

namespace tp::agent {
namespace {

#ifndef CGROUP2_SUPER_MAGIC
#define CGROUP2_SUPER_MAGIC 0x63677270
#endif
#ifndef CGROUP_SUPER_MAGIC
#define CGROUP_SUPER_MAGIC 0x27e0eb
#endif

bool write_at(int dir, const char* file, const char* data) {
  int fd = ::openat(dir, file, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  size_t n = std::strlen(data);
  bool ok = ::write(fd, data, n) == static_cast<ssize_t>(n);
  ::close(fd);
  return ok;
}

// Reads a small cgroup file whole; false on error.
bool read_at(int dir, const char* file, std::string* out) {
  int fd = ::openat(dir, file, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  out->clear();
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return false;
    }
    if (n == 0) break;
    out->append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return true;
}

void pause_cg_us(long us) {
  timespec ts{0, us * 1000};
  ::nanosleep(&ts, nullptr);
}

}  // namespace

Result<CgroupRoot> probe_cgroup_root(int fd) {
  struct statfs sf {};
  if (::fstatfs(fd, &sf) != 0) return sys_fail("fstatfs(--cgroup-fd)", errno);
  CgroupRoot r;
  r.fd = fd;
  if (static_cast<unsigned long>(sf.f_type) == CGROUP2_SUPER_MAGIC) {
    r.kind = ::faccessat(fd, "cgroup.kill", F_OK, 0) == 0 ? CgroupKind::kV2 : CgroupKind::kV2Freeze;
    return r;
  }
  if (static_cast<unsigned long>(sf.f_type) == CGROUP_SUPER_MAGIC &&
      ::faccessat(fd, "freezer.state", F_OK, 0) == 0) {
    r.kind = CgroupKind::kV1Freezer;
    return r;
  }
  return fail(Code::kInvalidArgument,
              "--cgroup-fd: not a cgroup v2 directory nor a v1 freezer cgroup");
}

CommandCgroup::CommandCgroup(CommandCgroup&& o) noexcept
    : root_fd_(o.root_fd_), kind_(o.kind_), name_(std::move(o.name_)), dir_(std::move(o.dir_)) {
  o.root_fd_ = -1;
}

CommandCgroup& CommandCgroup::operator=(CommandCgroup&& o) noexcept {
  if (this != &o) {
    (void)remove();
    root_fd_ = std::exchange(o.root_fd_, -1);
    kind_ = o.kind_;
    name_ = std::move(o.name_);
    dir_ = std::move(o.dir_);
  }
  return *this;
}

CommandCgroup::~CommandCgroup() { (void)remove(); }

Result<CommandCgroup> CommandCgroup::make(const CgroupRoot& root, uint64_t seq) {
  CommandCgroup c;
  c.root_fd_ = root.fd;
  c.kind_ = root.kind;
  char name[32];
  std::snprintf(name, sizeof(name), "c%llu", static_cast<unsigned long long>(seq));
  c.name_ = name;
  bool existed = false;
  if (::mkdirat(root.fd, name, 0755) != 0) {
    if (errno != EEXIST) return sys_fail(std::string("mkdirat(cgroup ") + name + ")", errno);
    existed = true;
  }
  c.dir_.reset(::openat(root.fd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!c.dir_) {
    int e = errno;
    (void)::unlinkat(root.fd, name, AT_REMOVEDIR);
    c.root_fd_ = -1;
    return sys_fail(std::string("open(cgroup ") + name + ")", e);
  }
  // A leftover of an earlier agent in this sandbox: nothing of it may stay in
  // the new command's cgroup.
  if (existed) {
    for (int i = 0; i < 1000 && !c.empty(); ++i) {
      c.kill_all();
      pause_cg_us(1000);
    }
  }
  return c;
}

const char* CommandCgroup::join_file() const {
  return kind_ == CgroupKind::kV1Freezer ? "tasks" : "cgroup.procs";
}

bool CommandCgroup::read_pids(std::vector<pid_t>* out) const {
  out->clear();
  std::string text;
  if (!dir_ || !read_at(dir_.get(), "cgroup.procs", &text)) return false;
  const char* p = text.c_str();
  while (*p) {
    char* end = nullptr;
    long v = std::strtol(p, &end, 10);
    if (end == p) break;
    if (v > 0) out->push_back(static_cast<pid_t>(v));
    p = end;
    while (*p == '\n' || *p == ' ') ++p;
  }
  return true;
}

std::vector<pid_t> CommandCgroup::pids() const {
  std::vector<pid_t> out;
  (void)read_pids(&out);
  return out;
}

bool CommandCgroup::empty() const {
  if (!dir_) return true;
  std::vector<pid_t> p;
  return read_pids(&p) && p.empty();
}

void CommandCgroup::set_frozen(bool frozen) const {
  if (kind_ == CgroupKind::kV1Freezer) {
    (void)write_at(dir_.get(), "freezer.state", frozen ? "FROZEN" : "THAWED");
  } else {
    (void)write_at(dir_.get(), "cgroup.freeze", frozen ? "1" : "0");
  }
}

void CommandCgroup::kill_all() const {
  if (!dir_) return;
  if (kind_ == CgroupKind::kV2 && write_at(dir_.get(), "cgroup.kill", "1")) return;
  // Members being frozen cannot fork, so the list read below is complete for
  // those already frozen; one that forked before freezing completed is caught
  // by the caller's next check (it kills again until the cgroup is empty).
  set_frozen(true);
  for (pid_t pid : pids()) ::kill(pid, SIGKILL);
  // v1 frozen tasks die only once thawed.
  set_frozen(false);
}

void CommandCgroup::signal_all(int sig) const {
  for (pid_t pid : pids()) ::kill(pid, sig);
}

Result<void> CommandCgroup::remove() {
  if (root_fd_ < 0 || name_.empty()) return {};
  dir_.reset();
  for (int i = 0;; ++i) {
    if (::unlinkat(root_fd_, name_.c_str(), AT_REMOVEDIR) == 0 || errno == ENOENT) break;
    if (errno != EBUSY || i >= 200) {
      int e = errno;
      root_fd_ = -1;
      return sys_fail("rmdir(cgroup " + name_ + ")", e);
    }
    pause_cg_us(500);
  }
  root_fd_ = -1;
  return {};
}

}  // namespace tp::agent
