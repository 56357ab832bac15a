#include "runtime/microvm/qemu_jail.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "runtime/container/child_plan.h"
#include "sys/clone_support.h"
#include "sys/fd.h"
#include "sys/userns.h"

namespace tp::runtime::microvm {
namespace {

using container::ChildPlan;
using container::OpKind;
using sys::UniqueFd;

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TP_JAIL_TSAN 1
#endif
#endif
#ifdef TP_JAIL_TSAN
// As in the container backend: TSan must not see a CLONE_VM child as a fork.
using CloneFn = int (*)(int (*)(void*), void*, int, void*, ...);
const CloneFn jail_clone = reinterpret_cast<CloneFn>(::dlsym(RTLD_NEXT, "clone"));
#else
#define jail_clone ::clone
#endif

constexpr size_t kStack = 256 << 10;
constexpr int kFlags =
    CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET;

// Host directories the child attaches (move_mount): detached clones of their
// mounts made by the parent, which can reach the paths (the run directory is
// root's 0700, closed to the child's ids) and sets their flags.
struct DirFds {
  UniqueFd vm, assets, images;
};

Result<UniqueFd> detached(const std::string& dir, uint64_t attrs) {
  UniqueFd fd(static_cast<int>(
      ::syscall(SYS_open_tree, AT_FDCWD, dir.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)));
  if (!fd) return sys_fail("open_tree(" + dir + ", OPEN_TREE_CLONE)");
  mount_attr attr{};
  attr.attr_set = attrs;
  if (::syscall(SYS_mount_setattr, fd.get(), "", AT_EMPTY_PATH, &attr, sizeof attr) != 0)
    return sys_fail("mount_setattr(" + dir + ")");
  return fd;
}

void build_ops(const JailSpec& s, const DirFds& fds, ChildPlan* p) {
  const std::string& m = s.mnt_dir;
  p->simple(OpKind::kWaitSync, "read(sync pipe)");
  p->simple(OpKind::kBecomeRoot, "setresgid/setgroups/setresuid(0) in the user namespace");
  p->mount("", "/", "", MS_REC | MS_PRIVATE, "");
  p->mount("tmpfs", m, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755");
  p->mkdir(m + "/usr", 0755);
  p->bind_ro("/usr", m + "/usr", sys::locked_flags("/usr"));
  for (const char* l : {"bin", "sbin", "lib", "lib64", "lib32", "libx32"}) {
    const std::string host = std::string("/") + l;
    struct stat st {};
    if (::lstat(host.c_str(), &st) != 0) continue;
    if (S_ISLNK(st.st_mode)) {
      char target[256];
      ssize_t n = ::readlink(host.c_str(), target, sizeof target - 1);
      if (n <= 0) continue;
      p->symlink(std::string(target, static_cast<size_t>(n)), m + host);
    } else if (S_ISDIR(st.st_mode)) {  // a host without merged /usr
      p->mkdir(m + host, 0755);
      p->bind_ro(host, m + host, sys::locked_flags(host));
    }
  }
  p->mkdir(m + "/dev", 0755);
  std::vector<const char*> devs = {"null", "zero", "urandom"};
  if (s.kvm) devs.push_back("kvm");
  for (const char* d : devs) {
    const std::string at = m + "/dev/" + d;
    p->touch(at);
    // A plain bind: the node keeps working (the host /dev mount is not nodev).
    p->mount(std::string("/dev/") + d, at, "", MS_BIND, "");
  }
  p->mkdir(m + "/proc", 0555);
  p->mount("proc", m + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "");
  const std::pair<std::string, const char*> ro[] = {{s.assets_dir, "/assets"},
                                                    {s.images_dir, "/images"}};
  for (const auto& [dir, at] : ro) {
    p->mkdir(m + at, 0755);
    p->move_mount(at == std::string("/assets") ? fds.assets.get() : fds.images.get(), dir, m + at);
  }
  p->mkdir(m + "/vm", 0755);
  p->move_mount(fds.vm.get(), s.vm_dir, m + "/vm");
  p->mount("", m, "", MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "size=1m,mode=0755");
  p->simple(OpKind::kChdir, "chdir(" + m + ")", m);
  p->simple(OpKind::kPivotRoot, "pivot_root(., .)");
  p->simple(OpKind::kUmountDetach, "umount2(old root, MNT_DETACH)", ".");
  p->simple(OpKind::kChdir, "chdir(/vm)", "/vm");
  p->set_ids(1, 1);  // host uid_base + 1; every capability goes
}

}  // namespace

Result<sys::Pidfd> run_plan(ChildPlan& plan, int flags,
                            const std::function<Result<void>(pid_t)>& setup,
                            const std::string& what) {
  int p[2];
  // A socket, not a pipe: the child's release may carry descriptors (spawn/plan.h, kWaitSync).
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, p) != 0)
    return sys_fail("socketpair(sync)");
  UniqueFd sync_rd(p[0]), sync_wr(p[1]);
  if (::pipe2(p, O_CLOEXEC) != 0) return sys_fail("pipe2(error)");
  UniqueFd err_rd(p[0]), err_wr(p[1]);
  std::vector<char*> args;
  const spawn::ExecPlan exec_plan =
      plan.in_process(sync_rd.get(), sync_wr.get(), err_rd.get(), err_wr.get(), &args);
  // The child runs on it until it exec'd, which is before this function returns.
  void* stack = ::mmap(nullptr, kStack, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK | MAP_NORESERVE, -1, 0);
  if (stack == MAP_FAILED) return sys_fail("mmap(child stack)");
  struct StackOwner {
    void* p;
    ~StackOwner() { ::munmap(p, kStack); }
  } stack_owner{stack};
  int pidfd = -1;
  pid_t pid;
  int clone_errno = 0;
  {
    sys::SignalBlock block;
    pid = jail_clone(container::run_in_clone, static_cast<char*>(stack) + kStack,
                     CLONE_VM | CLONE_PIDFD | SIGCHLD | flags,
                     const_cast<spawn::ExecPlan*>(&exec_plan), &pidfd);
    if (pid < 0) clone_errno = errno;
  }
  if (pid < 0) return sys_fail(what + ": clone", clone_errno);
  sys::Pidfd proc(pidfd, pid);
  sync_rd.reset();
  err_wr.reset();
  auto abort_child = [&](Error e) -> Result<sys::Pidfd> {
    sync_wr.reset();  // a child waiting on the sync socket exits on EOF
    (void)proc.signal(SIGKILL);
    (void)proc.reap();
    return std::unexpected(std::move(e));
  };
  if (setup) {
    if (auto r = setup(pid); !r) return abort_child(r.error());
  }
  char go = 1;
  if (::send(sync_wr.get(), &go, 1, MSG_NOSIGNAL) != 1)
    return abort_child(sys_fail("send(sync socket)").error());
  sync_wr.reset();
  // EOF: the exec happened (the pipe is CLOEXEC); a record: the step that failed.
  if (auto failed = container::read_child_failure(err_rd.get(), plan, what + ": ", "setup"))
    return abort_child(*failed);
  return proc;
}

Result<sys::Pidfd> spawn_jailed(const JailSpec& s, sys::CgroupManager& cgroups) {
  if (s.argv.empty() || s.qemu_exe < 0) return fail(Code::kInvalidArgument, "no QEMU to run");
  DirFds fds;
  constexpr uint64_t kRo = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
  auto vm = detached(s.vm_dir, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC);
  if (!vm) return std::unexpected(vm.error());
  auto assets = detached(s.assets_dir, kRo | MOUNT_ATTR_NOEXEC);
  if (!assets) return std::unexpected(assets.error());
  auto images = detached(s.images_dir, kRo | MOUNT_ATTR_NOEXEC);
  if (!images) return std::unexpected(images.error());
  fds.vm = std::move(*vm);
  fds.assets = std::move(*assets);
  fds.images = std::move(*images);
  ChildPlan plan;
  build_ops(s, fds, &plan);
  plan.set_rlimit(RLIMIT_CORE, "RLIMIT_CORE", 0);
  plan.set_rlimit(RLIMIT_FSIZE, "RLIMIT_FSIZE", s.fsize_limit);
  plan.set_rlimit(RLIMIT_NOFILE, "RLIMIT_NOFILE", 4096);
  plan.finish();
  for (const auto& a : s.argv) plan.argv.push_back(plan.keep(a));
  plan.envp.push_back(plan.keep("PATH=/usr/bin"));
  plan.exe_fd = s.qemu_exe;
  UniqueFd null_fd(::open("/dev/null", O_RDWR | O_CLOEXEC));
  if (!null_fd) return sys_fail("open(/dev/null)");
  plan.agent_child = s.fd3 >= 0 ? s.fd3 : null_fd.get();
  plan.cgroup_fd = s.fd4 >= 0 ? s.fd4 : null_fd.get();
  plan.log_fd = s.log_fd;

  TP_TRY(cgroups.make_dirs(s.cgroup_id));
  auto proc = run_plan(
      plan, kFlags,
      [&](pid_t pid) -> Result<void> {
        TP_TRY(sys::write_id_maps(pid, s.uid_base, 2));
        TP_TRY(cgroups.attach(s.cgroup_id, pid));
        return cgroups.write_limits(s.cgroup_id, s.limits);
      },
      "QEMU jail of " + s.name);
  if (!proc) {
    (void)cgroups.kill_all(s.cgroup_id);
    (void)cgroups.remove(s.cgroup_id);
  }
  return proc;
}

}  // namespace tp::runtime::microvm
