#include "runtime/container/container_backend.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <list>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "common/log.h"
#include "image/host_image.h"
#include "runtime/container/child_plan.h"
#include "runtime/container/run_state.h"
#include "runtime/container/spawner_client.h"
#include "runtime/sandbox_state.h"
#include "sys/cgroup.h"
#include "sys/clone_support.h"
#include "sys/fd.h"
#include "sys/pidfd.h"
#include "sys/raw_syscall.h"
#include "sys/seccomp.h"
#include "sys/sys_api.h"
#include "sys/userns.h"

namespace tp::runtime {
namespace {

using container::ChildPlan;
using sys::UniqueFd;

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TP_TSAN_BUILD 1
#endif
#endif
#ifdef TP_TSAN_BUILD
// ThreadSanitizer intercepts clone() as a fork: in the child it resets its state for the
// calling thread, which a CLONE_VM child shares with that thread (TSan CHECK failures,
// then false reports). The TSan build (CMakeLists.txt, TP_TSAN) calls libc's clone.
using CloneFn = int (*)(int (*)(void*), void*, int, void*, ...);
const CloneFn libc_clone = reinterpret_cast<CloneFn>(::dlsym(RTLD_NEXT, "clone"));
#define TP_CLONE libc_clone
// For code that runs in such a child: no instrumentation at all (not even the function
// entry and exit hooks, which write the shared thread state).
#define TP_CLONE_CHILD __attribute__((disable_sanitizer_instrumentation))
#else
#define TP_CLONE ::clone
#define TP_CLONE_CHILD
#endif
// The namespaces of a sandbox's init (the cgroup namespace it unshares itself, once
// it is in its cgroups).
constexpr uint64_t kNamespaces =
    CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET;

// Everything the backend and its instances share; read-only after construction.
struct Shared {
  ContainerOptions opts;
  std::unique_ptr<sys::CgroupManager> cgroups;
  std::unique_ptr<sys::SeccompProgram> seccomp;
  // SandboxSpec::nested_isolation: the same policy with the mount API and setns allowed.
  std::unique_ptr<sys::SeccompProgram> seccomp_nested;
  UniqueFd agent_exe;
  image::HostImage host;
  std::vector<std::pair<std::string, unsigned long>> host_binds;
  std::string mnt_dir;
  container::RootRecipe common;  // what every sandbox's recipe shares (prepared dirs, /proc masks)
  // Starts every sandbox's init (spawner_client.h); from opts.spawner_path.
  std::unique_ptr<container::Spawner> spawner;
  UniqueFd spawner_exe;
  bool agent_is_spawner = false;  // agent_exe is the spawner's binary: the child needs no exec
  // Live restore: each sandbox's agent socket and init identity (run_state.h), in
  // opts.run_dir or <data_dir>/containers/run; root-only.
  std::unique_ptr<container::RunState> runs;
  // User namespaces that map the storage ids to a sandbox range, by range base
  // (see IdmapCache below).
  std::unique_ptr<class IdmapCache> idmaps;
};

class ContainerInstance final : public SandboxInstance {
 public:
  // `init`: the sandbox's init as its create or adopt found it (its pidfd is not
  // kept, see proc_).
  ContainerInstance(std::shared_ptr<const Shared> sh, std::string id, SavedState init,
                    UniqueFd agent)
      : sh_(std::move(sh)), id_(std::move(id)), init_(init), agent_(std::move(agent)) {}
  // Live restore: the agent's socket (create, adopt); `adopted`: a previous
  // daemon run created it, so its init is not our child.
  void set_restore(std::string address, bool adopted) {
    address_ = std::move(address);
    adopted_ = adopted;
  }
  ~ContainerInstance() override {
    auto r = destroy();
    if (!r) TP_SB_ERROR(id_, "destroy in destructor: {}", r.error().message());
  }

  const std::string& id() const override { return id_; }
  int agent_fd() const override { return agent_.get(); }
  void close_agent_fd() override { agent_.reset(); }
  pid_t pid() const override { return init_.pid; }
  bool alive() override {
    if (destroyed_) return false;
    if (proc_.valid()) return !proc_.exited();
    if (adopted_) return open_saved(init_).has_value();  // its pidfd closes at once
    // Our child, reaped by no one else: a zombie until destroy() reaps it.
    siginfo_t si{};
    return ::waitid(P_PID, static_cast<id_t>(init_.pid), &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
           si.si_pid == 0;
  }

  Result<Usage> usage() override {
    if (destroyed_) return fail(Code::kConflict, "sandbox " + id_ + " is destroyed");
    auto s = sh_->cgroups->stats(id_);
    if (!s) return std::unexpected(s.error());
    return Usage{s->memory_bytes, s->memory_peak_bytes, s->cpu_usage_us, s->pids, s->oom_kills};
  }

  Result<uint64_t> oom_kills() override {
    if (destroyed_) return fail(Code::kConflict, "sandbox " + id_ + " is destroyed");
    return sh_->cgroups->oom_kills(id_);
  }

  std::string agent_address() const override { return destroyed_ ? std::string() : address_; }

  Result<void> freeze() override {
    TP_TRY(freeze_processes());
    // Frozen, its memory is idle: give back what the host can take (page cache,
    // and with swap the rest). Best effort.
    if (auto left = sh_->cgroups->reclaim_memory(id_); left)
      TP_SB_DEBUG(id_, "paused; {} KiB still charged", *left >> 10);
    return {};
  }

  Result<void> freeze_for_destroy() override { return freeze_processes(); }

  Result<void> thaw() override {
    if (destroyed_) return fail(Code::kConflict, "sandbox " + id_ + " is destroyed");
    TP_TRY(sys::set_frozen(sys::real_sys(), *sh_->cgroups, id_, false));
    frozen_ = false;
    return {};
  }

  // Everything keeps running: a later daemon run adopts the sandbox.
  void release() override {
    if (destroyed_) return;
    agent_.reset();
    proc_.close();
    destroyed_ = true;
    TP_SB_DEBUG(id_, "released (left running)");
  }

  Result<void> destroy() override {
    if (destroyed_) return {};
    agent_.reset();
    // A v1-frozen task does not die of SIGKILL until thawed.
    if (frozen_) (void)sys::set_frozen(sys::real_sys(), *sh_->cgroups, id_, false);
    auto opened = open_init();
    if (!opened) return std::unexpected(opened.error());
    if (!*opened) return remove_cgroup();  // an adopted init that is gone already
    // PID 1 dying makes the kernel kill the whole pid namespace.
    TP_TRY(proc_.signal(SIGKILL));
    // v1: a command cgroup the agent froze for a kill (and was killed before
    // thawing) would keep its tasks, and so PID 1's exit, from completing. Waited
    // for on the pidfd (it wakes at the exit, not at the next poll interval); the
    // command cgroups are thawed only when PID 1 did not go at once.
    const bool v1 = sh_->cgroups->layout().version == sys::CgroupVersion::kV1;
    auto wait_exit = [&](int ms) {
      pollfd pfd{proc_.fd(), POLLIN, 0};
      while (::poll(&pfd, 1, ms) < 0 && errno == EINTR) {
      }
    };
    if (v1) wait_exit(5);
    for (int i = 0; v1 && i < 220 && !proc_.exited(); ++i) {  // ~2 s, then reap() blocks
      // Its own cgroup too, once: frozen behind this instance's back (it then does not
      // know), its PID 1 would never die and the wait below never end.
      if (i == 0) (void)sys::set_frozen(sys::real_sys(), *sh_->cgroups, id_, false);
      sh_->cgroups->thaw_subtree(id_);
      wait_exit(i < 20 ? 1 : 10);
    }
    if (adopted_) {
      // Not our child (its parent is whoever took it when the daemon that
      // made it exited): waitid cannot wait for it, its pidfd can.
      pollfd pfd{proc_.fd(), POLLIN, 0};
      while (::poll(&pfd, 1, -1) < 0 && errno == EINTR) {
      }
    }
    auto reaped = proc_.reap();
    if (!reaped) {
      TP_SB_ERROR(id_, "reap: {}", reaped.error().message());
      return std::unexpected(reaped.error());
    }
    return remove_cgroup();
  }

 private:
  Result<void> freeze_processes() {
    if (destroyed_) return fail(Code::kConflict, "sandbox " + id_ + " is destroyed");
    auto r = sys::set_frozen(sys::real_sys(), *sh_->cgroups, id_, true);
    if (!r) {
      // Half-frozen is worse than running: undo.
      (void)sys::set_frozen(sys::real_sys(), *sh_->cgroups, id_, false);
      return r;
    }
    frozen_ = true;
    return {};
  }

  // The init's pidfd, opened for its end (false: an adopted init is gone already).
  // A pidfd held for the sandbox's whole life would double the descriptors an idle
  // sandbox costs the daemon (its agent socket is the other): 10,000 alive would
  // then need an open-file limit above 20,000, which a host without
  // CAP_SYS_RESOURCE cannot grant. Opening it late is safe: our own child keeps its
  // pid until we reap it (the daemon reaps only through pidfds, never pid -1), and an
  // adopted one is checked against its start time after the open (open_saved).
  Result<bool> open_init() {
    if (proc_.valid()) return true;
    if (adopted_) {
      auto p = open_saved(init_);
      if (!p && p.error().code == Code::kNotFound) return false;
      if (!p) return std::unexpected(p.error());
      proc_ = std::move(*p);
      return true;
    }
    const int fd = static_cast<int>(::syscall(SYS_pidfd_open, init_.pid, 0));
    if (fd < 0) return sys_fail("pidfd_open(init " + std::to_string(init_.pid) + ")");
    proc_ = sys::Pidfd(fd, init_.pid);
    return true;
  }

  Result<void> remove_cgroup() {
    // Once PID 1 is reaped the kernel has killed and reaped the whole pid
    // namespace, so the cgroup is normally empty and a plain rmdir works. If
    // not (something was moved in from outside), kill what is there and retry.
    auto rm = sh_->cgroups->remove(id_, 0);
    if (!rm && rm.error().sys_errno == EBUSY) {
      auto k = sh_->cgroups->kill_all(id_);
      if (!k) {
        TP_SB_ERROR(id_, "kill cgroup: {}", k.error().message());
        return k;
      }
      rm = sh_->cgroups->remove(id_);
    }
    if (!rm) {
      TP_SB_ERROR(id_, "remove cgroup: {}", rm.error().message());
      return rm;
    }
    proc_.close();
    if (!address_.empty()) sh_->runs->remove(id_);
    destroyed_ = true;
    TP_SB_DEBUG(id_, "destroyed");
    return {};
  }

  std::shared_ptr<const Shared> sh_;
  std::string id_;
  SavedState init_;  // pid, and for an adopted init its start time
  sys::Pidfd proc_;  // open only from destroy() on (open_init)
  UniqueFd agent_;
  // Read by usage() and oom_kills(), which the node may call while another thread
  // destroys the sandbox (an exec ending as it is deleted).
  std::atomic<bool> destroyed_{false};
  std::string address_;  // the agent's listening socket; "" = none
  bool adopted_ = false;
  // Written by freeze and thaw (a pause, a request's resume, a deferred teardown) and
  // read by destroy(), which may run on another thread.
  std::atomic<bool> frozen_{false};
};

// Idmapped layers. Image files are stored once, owned by ContainerOptions::uid_base
// + N; each sandbox sees them through a detached clone of the layer's mount
// that maps those ids to its own range (mount_setattr(MOUNT_ATTR_IDMAP)). The
// map comes from a user namespace made only for that ("uid_base base 65536"):
// a multi-threaded process cannot unshare one, so a child is born in it while we
// write its maps, and is killed once we hold an fd of it. It shares our memory
// and our fd table (CLONE_VM | CLONE_FILES): a copy of the table, and its closing
// when the child exits, cost a step per descriptor the daemon holds, about one per
// live sandbox (9% of all CPU while creating with 3,000 alive). It uses no
// descriptor, so it needs none.
struct IdmapChildArg {
  pid_t parent;
};

TP_CLONE_CHILD int idmap_child(void* a) {
  const auto* arg = static_cast<const IdmapChildArg*>(a);
  // Gone with the thread that made it, should the daemon die before killing it.
  sys::raw::call(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  if (sys::raw::call(SYS_getppid) != arg->parent) sys::raw::exit_now(0);
  for (;;) sys::raw::call(SYS_ppoll, nullptr, 0, nullptr, nullptr, 0);  // until SIGKILL
}

// The child an idmap namespace was made through: killed and reaped, and its stack
// freed, on destruction. create() keeps it until the sandbox is set up, so that
// waiting for its exit (a reschedule on a busy host) is off the critical path.
class IdmapChild {
 public:
  // Reserved, not committed (MAP_NORESERVE): only the pages it touches cost. 64 KiB
  // overflowed in a -O0 ThreadSanitizer build (its interceptors' frames are large).
  static constexpr size_t kStack = 256 << 10;
  IdmapChild() = default;
  IdmapChild(const IdmapChild&) = delete;
  IdmapChild& operator=(const IdmapChild&) = delete;
  IdmapChild(IdmapChild&& o) noexcept
      : pid_(std::exchange(o.pid_, -1)), stack_(std::exchange(o.stack_, nullptr)) {}
  IdmapChild& operator=(IdmapChild&& o) noexcept {
    if (this != &o) {
      reap();
      pid_ = std::exchange(o.pid_, -1);
      stack_ = std::exchange(o.stack_, nullptr);
    }
    return *this;
  }
  ~IdmapChild() { reap(); }
  void reap() {
    int status;
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      while (::waitpid(pid_, &status, __WALL) < 0 && errno == EINTR) {
      }
    }
    pid_ = -1;
    if (stack_) ::munmap(stack_, kStack);  // the child ran on it (CLONE_VM)
    stack_ = nullptr;
  }
  pid_t pid_ = -1;
  void* stack_ = nullptr;
};

struct Idmap {
  UniqueFd ns;  // the user namespace whose map is the idmap
  IdmapChild child;
};

Result<Idmap> make_idmap_userns(uint32_t storage_base, uint32_t base) {
  Idmap out;
  out.child.stack_ = ::mmap(nullptr, IdmapChild::kStack, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK | MAP_NORESERVE, -1, 0);
  if (out.child.stack_ == MAP_FAILED) {
    out.child.stack_ = nullptr;
    return sys_fail("mmap(idmap child stack)");
  }
  // The child's argument lives at the bottom of its stack: it may first run after we returned.
  auto* arg = new (out.child.stack_) IdmapChildArg{::getpid()};
  {
    sys::SignalBlock block;
    out.child.pid_ =
        TP_CLONE(idmap_child, static_cast<char*>(out.child.stack_) + IdmapChild::kStack,
                 CLONE_VM | CLONE_FILES | CLONE_NEWUSER | SIGCHLD, arg);
  }
  if (out.child.pid_ < 0) return sys_fail("clone(CLONE_NEWUSER) for an idmap");
  const std::string map = std::to_string(storage_base) + " " + std::to_string(base) + " " +
                          std::to_string(sys::kIdMapCount) + "\n";
  const std::string proc = "/proc/" + std::to_string(out.child.pid_);
  for (const char* f : {"/uid_map", "/gid_map"}) {
    UniqueFd fd(::open((proc + f).c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd || ::write(fd.get(), map.data(), map.size()) != static_cast<ssize_t>(map.size()))
      return sys_fail("write(" + proc + f + ", \"" + map.substr(0, map.size() - 1) + "\")");
  }
  out.ns.reset(::open((proc + "/ns/user").c_str(), O_RDONLY | O_CLOEXEC));
  if (!out.ns) return sys_fail("open(" + proc + "/ns/user)");
  return out;  // the child is killed when `out.child` goes
}

// A detached, read-only clone of `dir`'s mount with ids mapped through `userns`.
Result<UniqueFd> idmapped_clone(const std::string& dir, int userns) {
  UniqueFd fd(static_cast<int>(
      ::syscall(SYS_open_tree, AT_FDCWD, dir.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)));
  if (!fd) return sys_fail("open_tree(" + dir + ", OPEN_TREE_CLONE)");
  mount_attr attr{};
  attr.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
  attr.userns_fd = static_cast<uint64_t>(userns);
  if (::syscall(SYS_mount_setattr, fd.get(), "", AT_EMPTY_PATH, &attr, sizeof attr) != 0)
    return sys_fail("mount_setattr(" + dir + ", MOUNT_ATTR_IDMAP)");
  return fd;
}

// The idmap namespaces of recently used ranges, kept by fd. Making one costs a
// clone, two map writes and (later) a reap: measured +3.5-8% of a cold create
// when done per create. A namespace holds no process and no privilege (it only
// names a map, and only root holds its fd), so one is safely reused by every
// later sandbox of the same range. The node hands out the lowest free range, so a
// small cache serves a steady create/destroy stream; the least recently used
// beyond kMax is closed.
class IdmapCache {
 public:
  static constexpr size_t kMax = 256;
  explicit IdmapCache(uint32_t storage_base) : storage_base_(storage_base) {}

  // The namespace for `base`: a cached one, or a new one (whose child is handed
  // to `child`, to be reaped off the critical path).
  Result<std::shared_ptr<const UniqueFd>> get(uint32_t base, IdmapChild* child) {
    {
      std::lock_guard lock(mu_);
      if (auto it = by_base_.find(base); it != by_base_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second);
        return it->second->second;
      }
    }
    auto made = make_idmap_userns(storage_base_, base);  // outside the lock: a clone
    if (!made) return std::unexpected(made.error());
    *child = std::move(made->child);
    auto ns = std::make_shared<const UniqueFd>(std::move(made->ns));
    std::lock_guard lock(mu_);
    if (auto it = by_base_.find(base); it != by_base_.end()) return it->second->second;
    lru_.emplace_front(base, ns);
    by_base_[base] = lru_.begin();
    while (lru_.size() > kMax) {
      by_base_.erase(lru_.back().first);
      lru_.pop_back();  // closed once no create still uses it
    }
    return ns;
  }
  size_t size() {
    std::lock_guard lock(mu_);
    return lru_.size();
  }

 private:
  using Entry = std::pair<uint32_t, std::shared_ptr<const UniqueFd>>;
  const uint32_t storage_base_;
  std::mutex mu_;
  std::list<Entry> lru_;  // most recent first
  std::unordered_map<uint32_t, std::list<Entry>::iterator> by_base_;
};

// The daemon's setup message on the agent socket (spawn/plan.h, kRecvSetup).
Result<void> send_setup(int sock, const std::vector<int>& fds) {
  if (fds.size() > spawn::kMaxSetupFds)
    return fail(Code::kInternal, "setup message: too many descriptors");
  char control[CMSG_SPACE(spawn::kMaxSetupFds * sizeof(int))] = {};
  iovec iov{const_cast<char*>(spawn::kSetupMagic), sizeof spawn::kSetupMagic};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control;
  mh.msg_controllen = CMSG_SPACE(fds.size() * sizeof(int));
  cmsghdr* cm = CMSG_FIRSTHDR(&mh);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
  std::memcpy(CMSG_DATA(cm), fds.data(), fds.size() * sizeof(int));
  ssize_t n;
  do n = ::sendmsg(sock, &mh, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof spawn::kSetupMagic))
    return sys_fail("sendmsg(agent socket, setup message)", n < 0 ? errno : EIO);
  return {};
}

class ContainerBackend final : public Backend {
 public:
  explicit ContainerBackend(std::shared_ptr<Shared> sh) : sh_(std::move(sh)) {}
  ~ContainerBackend() override { sh_->cgroups->remove_parent_if_empty(); }
  std::string tier() const override { return "container"; }

  Result<std::unique_ptr<SandboxInstance>> create(const SandboxSpec& spec) override {
    auto r = create_impl(spec);
    if (!r) TP_SB_ERROR(spec.id, "create failed: {}", r.error().message());
    return r;
  }

  Result<std::unique_ptr<SandboxInstance>> adopt(const SandboxSpec& spec) override {
    auto r = adopt_impl(spec);
    if (!r) TP_SB_WARN(spec.id, "adopt failed: {}", r.error().message());
    return r;
  }

  std::vector<std::string> cleanup_orphans(const std::vector<std::string>& keep) override {
    std::set<std::string> keep_set(keep.begin(), keep.end());
    std::vector<std::string> cleaned;
    // Run state of sandboxes not kept (their cgroups, if any, go below).
    for (const auto& id : sh_->runs->ids())
      if (!keep_set.contains(id)) sh_->runs->remove(id);
    for (const auto& id : sh_->cgroups->list()) {
      if (keep_set.contains(id)) continue;
      auto k = sh_->cgroups->kill_all(id);
      if (!k) {
        TP_SB_WARN(id, "orphan kill: {}", k.error().message());
        continue;
      }
      auto rm = sh_->cgroups->remove(id);
      if (!rm) {
        TP_SB_WARN(id, "orphan cgroup remove: {}", rm.error().message());
        continue;
      }
      TP_SB_INFO(id, "cleaned up orphan sandbox");
      cleaned.push_back(id);
    }
    return cleaned;
  }

 private:
  Result<std::unique_ptr<SandboxInstance>> create_impl(const SandboxSpec& spec);
  Result<std::unique_ptr<SandboxInstance>> adopt_impl(const SandboxSpec& spec);

  std::shared_ptr<Shared> sh_;
};

Result<std::unique_ptr<SandboxInstance>> ContainerBackend::create_impl(const SandboxSpec& spec) {
  if (!valid_sandbox_name(spec.id))
    return fail(Code::kInvalidArgument, "invalid sandbox id '" + spec.id + "'");
  if (spec.disk_bytes == 0 || spec.memory_bytes == 0)
    return fail(Code::kInvalidArgument, "memory and disk sizes must be > 0");
  if (spec.nofile < 16) return fail(Code::kInvalidArgument, "nofile must be >= 16");
  for (const auto& [k, v] : spec.env) {
    if (k.empty() || k.find_first_of("=", 0) != std::string::npos ||
        k.find('\0') != std::string::npos || v.find('\0') != std::string::npos)
      return fail(Code::kInvalidArgument, "invalid environment variable name '" + k + "'");
  }

  container::RootRecipe recipe = sh_->common;
  recipe.id = spec.id;
  recipe.disk_bytes = spec.disk_bytes;
  if (spec.layers.empty()) {
    if (spec.image != "host" && !spec.image.empty())
      return fail(Code::kInvalidArgument, "image '" + spec.image + "' has no layers");
    recipe.lowers = {sh_->host.rootfs};
    recipe.ro_binds = sh_->host_binds;
  } else {
    // Digests to directories, all before anything of the sandbox exists.
    if (!sh_->opts.layers)
      return fail(Code::kNotFound,
                  "layer " + spec.layers.front() + " not found (this backend has no layer store)");
    for (const auto& digest : spec.layers) {
      auto dir = sh_->opts.layers->layer_dir(digest);
      if (!dir) return std::unexpected(dir.error());
      const std::string& l = *dir;
      // The resolver's answer goes into overlay's lowerdir= option string.
      if (l.empty() || l[0] != '/' || l.find_first_of(",:\\") != std::string::npos)
        return fail(Code::kInvalidArgument,
                    "layer path '" + l + "' must be absolute without ',', ':' or '\\'");
      struct stat st {};
      if (::stat(l.c_str(), &st) != 0) return sys_fail("stat(layer " + l + ")");
      if (!S_ISDIR(st.st_mode))
        return fail(Code::kInvalidArgument, "layer " + l + " is not a directory");
      recipe.lowers.push_back(l);
    }
  }

  // The sandbox's own range (or the shared default); its layers are idmapped to
  // it unless it is the range the files are stored in.
  const uint32_t base = spec.uid_base ? spec.uid_base : sh_->opts.uid_base;
  TP_TRY(sys::validate_id_base(base));
  std::vector<UniqueFd> lower_fds;
  // A new idmap namespace's child, reaped after the sandbox's owners (it has long exited then).
  IdmapChild idmap_child;
  if (base != sh_->opts.uid_base) {
    auto ns = sh_->idmaps->get(base, &idmap_child);
    if (!ns) return std::unexpected(ns.error());
    for (const auto& l : recipe.lowers) {
      auto fd = idmapped_clone(l, (*ns)->get());
      if (!fd) return std::unexpected(fd.error());
      recipe.lower_fds.push_back(fd->get());
      lower_fds.push_back(std::move(*fd));
    }
  }

  // Owners, released in reverse on any failure.
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return sys_fail("socketpair(AF_UNIX, SOCK_STREAM)");
  UniqueFd agent_host(sv[0]), agent_child(sv[1]);

  // The plan goes to the spawner first; what the daemon makes meanwhile (cgroups,
  // the agent's listening socket) follows on the agent socket (kRecvSetup), so that
  // the daemon's share and the clone overlap.
  const std::string cg_dir = sh_->cgroups->delegated_dir(spec.id);
  recipe.cgroup_entries = sh_->cgroups->entry_files(spec.id);
  recipe.setup_cgroup_dir = !cg_dir.empty();
  recipe.setup_listen = true;
  ChildPlan plan;
  container::build_root_ops(recipe, &plan);
  // Set by the child itself: the spawner's prlimit() would need CAP_SYS_RESOURCE
  // over a process whose euid (the sandbox's root) differs from its own.
  plan.set_rlimit(RLIMIT_NOFILE, "RLIMIT_NOFILE", spec.nofile);
  plan.set_rlimit(RLIMIT_CORE, "RLIMIT_CORE", 0);
  if (spec.best_effort) plan.sched_idle();
  plan.finish();
  plan.seccomp = spec.nested_isolation ? sh_->seccomp_nested.get() : sh_->seccomp.get();
  // The agent is the spawner's own binary (the child goes on as it, no exec) unless
  // the backend was given another one.
  plan.exe_fd = sh_->agent_is_spawner ? -1 : sh_->agent_exe.get();
  for (const char* a : {"tp-agent", "--fd", "3"}) plan.argv.push_back(plan.keep(a));
  // The agent's cgroup fd; the child places it at fd 4.
  if (!cg_dir.empty())
    for (const char* a : {"--cgroup-fd", "4"}) plan.argv.push_back(plan.keep(a));
  // Live restore: the agent's listening socket, fd 5 in the agent.
  for (const char* a : {"--listen-fd", "5"}) plan.argv.push_back(plan.keep(a));
  // Its own oom_score_adj, opened by the spawner, fd 6 (commands are born above it).
  if (sh_->agent_is_spawner)
    for (const char* a : {"--oom-fd", "6"}) plan.argv.push_back(plan.keep(a));
  std::map<std::string, std::string> env = spec.env;
  env.try_emplace("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
  env.try_emplace("HOME", "/root");
  for (const auto& [k, v] : env) plan.envp.push_back(plan.keep(k + "=" + v));
  plan.agent_child = agent_child.get();

  spawn::Request req = plan.to_request();
  req.clone_flags = kNamespaces;
  // The user namespace is owned by the sandbox's root, `base`: the kernel charges a
  // namespace's per-user counters (inotify instances and watches, POSIX mqueue
  // bytes, pending signals, processes) to its owner in the parent namespace too;
  // owned by host root, every sandbox drew on host root's budget (one sandbox
  // holding 128 inotify instances left systemd and the daemon with none).
  req.owner_uid = base;
  req.uid_map = req.gid_map = sys::id_map_text(base);
  if (sh_->agent_is_spawner) req.flags |= spawn::kRequestOomFd;
  auto started = sh_->spawner->send(std::move(req));
  // The spawner has its own copies now (or none will be needed).
  agent_child.reset();
  lower_fds.clear();
  if (!started) return std::unexpected(started.error());
  // From here on a failure must collect the child (if the spawner made one): the
  // closed agent socket tells it to give up, finish() reaps it.
  auto give_up = [&](Error err) -> Result<std::unique_ptr<SandboxInstance>> {
    agent_host.reset();
    if (auto child = started->finish(plan.steps)) {
      (void)child->signal(SIGKILL);
      (void)child->reap();
    }
    return std::unexpected(std::move(err));
  };

  // Live restore: <run_dir>/<id>.sock, bound here, where the sandbox cannot
  // reach it; the agent gets the fd.
  const container::RunState& runs = *sh_->runs;
  auto listen_made = runs.make_socket(spec.id);
  if (!listen_made) {
    runs.remove(spec.id);
    return give_up(listen_made.error());
  }
  UniqueFd listen_sock = std::move(*listen_made);
  struct RunStateOwner {
    const container::RunState& runs;
    const std::string& id;
    bool owned = true;
    ~RunStateOwner() {
      if (owned) runs.remove(id);
    }
  } run_state_owner{runs, spec.id};

  // The limits are written while the child sets up its root (below): it runs only
  // our setup code and the idle agent until create() returns.
  if (auto m = sh_->cgroups->make_dirs(spec.id); !m) return give_up(m.error());
  bool cgroup_owned = true;
  auto drop_cgroup = [&] {
    if (!cgroup_owned) return;
    (void)sh_->cgroups->kill_all(spec.id);
    if (auto r = sh_->cgroups->remove(spec.id); !r)
      TP_SB_ERROR(spec.id, "unwind: {}", r.error().message());
  };
  auto fail_all = [&](Error err) {
    auto r = give_up(std::move(err));
    drop_cgroup();
    return r;
  };
  // Delegation: the sandbox's root (`base`) owns its cgroup directory (v2;
  // v1: the freezer one) and the files a delegatee writes, so that its agent
  // can make, join, kill and remove one cgroup per command. The agent gets the
  // directory as an fd: the sandbox has no cgroupfs (no /sys, mount denied).
  UniqueFd cg_fd;
  if (!cg_dir.empty()) {
    auto own = [&](const std::string& p, bool must) -> Result<void> {
      if (::chown(p.c_str(), base, base) == 0 || (!must && errno == ENOENT)) return {};
      return sys_fail("chown(" + p + ")");
    };
    Result<void> d = own(cg_dir, true);
    for (const auto& f : sh_->cgroups->delegated_files())
      if (d) d = own(cg_dir + "/" + f, false);
    // Nested isolation (the function tier): the memory and pids cgroups too, so that
    // the sandbox's root can make a cgroup with limits of its own for each call below
    // them. The sandbox's own limit files stay the host's (not writable from inside);
    // a sub-cgroup's limits are bounded by the sandbox's.
    if (spec.nested_isolation)
      for (const auto& dir : sh_->cgroups->limit_dirs(spec.id))
        if (d && dir != cg_dir) d = own(dir, true);
    if (d) {
      cg_fd.reset(::open(cg_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      if (!cg_fd) d = sys_fail("open(" + cg_dir + ", O_DIRECTORY)");
    }
    if (!d) return fail_all(d.error());
  }
  // The child moves itself into its cgroups through these (opened as root here: the
  // kernel checks the opener, and the child is not root on the host).
  std::vector<int> setup_fds;
  std::vector<UniqueFd> entry_fds;
  for (const auto& path : recipe.cgroup_entries) {
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd) return fail_all(sys_fail("open(" + path + ", O_WRONLY)").error());
    setup_fds.push_back(fd.get());
    entry_fds.push_back(std::move(fd));
  }
  if (cg_fd) setup_fds.push_back(cg_fd.get());
  setup_fds.push_back(listen_sock.get());
  if (auto s = send_setup(agent_host.get(), setup_fds); !s) return fail_all(s.error());
  entry_fds.clear();
  cg_fd.reset();
  listen_sock.reset();  // the agent has its own

  // Meanwhile the child joins its cgroups and builds its root.
  auto limits = sh_->cgroups->write_limits(
      spec.id, {spec.memory_bytes, spec.cpus, spec.pids_max, spec.best_effort});
  // Live restore: who the init is, recorded on its agent's socket while it still
  // sets up (an error here unwinds below, once the start is over).
  Result<void> recorded = fail(Code::kInternal, "no pid");
  if (pid_t early = started->wait_pid(); early > 0) recorded = runs.record(spec.id, early);
  auto child = started->finish(plan.steps);
  if (!child) {
    drop_cgroup();
    return std::unexpected(child.error());
  }
  sys::Pidfd proc = std::move(*child);
  const pid_t pid = proc.pid();
  auto abort_child = [&](Error err) -> Result<std::unique_ptr<SandboxInstance>> {
    (void)proc.signal(SIGKILL);
    (void)proc.reap();
    drop_cgroup();
    return std::unexpected(std::move(err));
  };
  if (!limits) return abort_child(limits.error());
  // EOF also comes when the child died without a word (killed, e.g. by the OOM killer).
  if (proc.exited()) {
    siginfo_t si{};
    ::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(proc.fd()), &si,
             WEXITED | WNOWAIT | WNOHANG);
    return abort_child(Error{Code::kInternal, 0,
                             "sandbox init exited during setup (" +
                                 std::string(si.si_code == CLD_EXITED ? "status " : "signal ") +
                                 std::to_string(si.si_status) + ")"});
  }
  if (!recorded) recorded = runs.record(spec.id, pid);
  if (!recorded) return abort_child(recorded.error());
  run_state_owner.owned = false;
  cgroup_owned = false;
  TP_SB_DEBUG(spec.id, "started, pid {}, host uids {}..{}", pid, base, base + sys::kIdMapCount - 1);
  auto inst =
      std::make_unique<ContainerInstance>(sh_, spec.id, SavedState{pid, 0}, std::move(agent_host));
  inst->set_restore(runs.socket_path(spec.id), false);
  return inst;
}

Result<std::unique_ptr<SandboxInstance>> ContainerBackend::adopt_impl(const SandboxSpec& spec) {
  if (!valid_sandbox_name(spec.id))
    return fail(Code::kInvalidArgument, "invalid sandbox id '" + spec.id + "'");
  // Either layout: adopt() does not care which version made the sandbox.
  auto st = sh_->runs->find(spec.id);
  if (!st) return std::unexpected(st.error());
  auto opened = open_saved(SavedState{st->pid, st->start});
  if (!opened)
    return fail(Code::kNotFound,
                "init of sandbox " + spec.id + " (pid " + std::to_string(st->pid) + ") is gone");
  opened->close();  // reopened, and checked again, for the destroy
  for (const auto& d : sh_->cgroups->dirs(spec.id)) {
    struct stat cs {};
    if (::stat(d.c_str(), &cs) != 0 || !S_ISDIR(cs.st_mode))
      return fail(Code::kNotFound, "cgroup " + d + " of sandbox " + spec.id + " is missing");
  }
  // Paused when the previous daemon left it, or being frozen when it died (a pause or
  // a paced teardown under way): its agent must run to be reached again, and its
  // processes to die if it is to be destroyed (the node freezes it again when its
  // record says paused).
  if (auto asked = sys::freeze_requested(sys::real_sys(), *sh_->cgroups, spec.id);
      asked && *asked) {
    TP_TRY(sys::set_frozen(sys::real_sys(), *sh_->cgroups, spec.id, false));
    TP_SB_INFO(spec.id, "thawed to be adopted");
  }
  TP_SB_INFO(spec.id, "adopted, pid {}", st->pid);
  auto inst =
      std::make_unique<ContainerInstance>(sh_, spec.id, SavedState{st->pid, st->start}, UniqueFd());
  inst->set_restore(st->socket, true);
  return inst;
}

// Makes `path` a root-owned entry of the wanted kind and mode, keeping it when it
// already is one (a restarted daemon's re-adopted sandboxes still use it).
Result<void> ensure_node(const std::string& path, mode_t type, mode_t mode, dev_t rdev,
                         const char* link_target = nullptr) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    bool same = (st.st_mode & S_IFMT) == type && st.st_uid == 0 && st.st_gid == 0;
    if (type == S_IFCHR) same = same && st.st_rdev == rdev && (st.st_mode & 07777) == mode;
    if (type == S_IFDIR && S_ISDIR(st.st_mode)) {
      if (::lchown(path.c_str(), 0, 0) != 0 || ::chmod(path.c_str(), mode) != 0)
        return sys_fail("chown/chmod(" + path + ")");
      return {};
    }
    if (type == S_IFLNK) {
      char buf[256];
      ssize_t n = ::readlink(path.c_str(), buf, sizeof buf);
      same = same && n >= 0 && std::string_view(buf, static_cast<size_t>(n)) == link_target;
    }
    if (same) return {};
    if (::unlink(path.c_str()) != 0) return sys_fail("unlink(" + path + ")");
  } else if (errno != ENOENT) {
    return sys_fail("lstat(" + path + ")");
  }
  int rc = type == S_IFDIR   ? ::mkdir(path.c_str(), mode)
           : type == S_IFLNK ? ::symlink(link_target, path.c_str())
                             : ::mknod(path.c_str(), S_IFCHR | mode, rdev);
  if (rc != 0) return sys_fail((type == S_IFCHR ? "mknod(" : "create(") + path + ")");
  if (::lchown(path.c_str(), 0, 0) != 0) return sys_fail("lchown(" + path + ")");
  // Past the daemon's umask.
  if (type != S_IFLNK && ::chmod(path.c_str(), mode) != 0) return sys_fail("chmod(" + path + ")");
  return {};
}

// The host side of the sandboxes' /dev and masked /proc directories (see
// RootRecipe). Every sandbox binds the same directories; they are root-owned,
// so a sandbox (whose ids never include host root) cannot change them, and
// the binds are read-only as well.
Result<void> prepare_shared_dirs(const std::string& containers_dir, container::RootRecipe* r) {
  const std::string empty = containers_dir + "/empty";
  TP_TRY(ensure_node(empty, S_IFDIR, 0555, 0));
  r->empty_dir = empty;
  r->prep_locked = sys::locked_flags(empty);
  const std::string dev = containers_dir + "/dev";
  struct statvfs sv {};
  if (::statvfs(containers_dir.c_str(), &sv) != 0)
    return sys_fail("statvfs(" + containers_dir + ")");
  if (sv.f_flag & ST_NODEV) {
    spdlog::info(
        "{} is on a nodev file system: each sandbox's /dev binds the host's nodes one by one",
        containers_dir);
    return {};
  }
  TP_TRY(ensure_node(dev, S_IFDIR, 0755, 0));
  for (int i = 0; container::kDevices[i].name; ++i) {
    const auto& d = container::kDevices[i];
    TP_TRY(ensure_node(dev + "/" + d.name, S_IFCHR, 0666, makedev(d.major, d.minor)));
  }
  // Mount points: devpts and the sandbox's tmpfs cover them.
  TP_TRY(ensure_node(dev + "/pts", S_IFDIR, 0755, 0));
  TP_TRY(ensure_node(dev + "/shm", S_IFDIR, 0755, 0));
  for (int i = 0; container::kDevSymlinks[i][0]; ++i)
    TP_TRY(ensure_node(dev + "/" + container::kDevSymlinks[i][0], S_IFLNK, 0777, 0,
                       container::kDevSymlinks[i][1]));
  r->dev_dir = dev;
  r->dev_locked = sys::locked_flags(dev);
  return {};
}

// The /proc entries of `names` this kernel has. A /proc without its global
// entries (mounted with subset=pid) tells nothing: then keep them all.
std::vector<std::string> present_in_proc(const char* const names[]) {
  const bool full = ::access("/proc/meminfo", F_OK) == 0;
  std::vector<std::string> out;
  for (int i = 0; names[i]; ++i)
    if (!full || ::access((std::string("/proc/") + names[i]).c_str(), F_OK) == 0)
      out.emplace_back(names[i]);
  return out;
}

// data_dir and its parents must be searchable by the sandbox's root (an
// unprivileged host uid) because the child resolves paths under it.
Result<void> check_traversable(const std::string& path) {
  std::string cur = path;
  while (!cur.empty() && cur != "/") {
    struct stat st {};
    if (::stat(cur.c_str(), &st) != 0) return sys_fail("stat(" + cur + ")");
    if ((st.st_mode & S_IXOTH) == 0)
      return fail(Code::kInvalidArgument,
                  fmt::format("{} is not searchable by others (mode {:o}); sandboxes run as an "
                              "unprivileged host uid and need o+x on data_dir and its parents",
                              cur, st.st_mode & 07777));
    auto slash = cur.find_last_of('/');
    cur = slash == 0 ? "/" : cur.substr(0, slash);
  }
  return {};
}

}  // namespace

std::string default_run_dir(const std::string& cgroup_name) {
  struct statfs fs {};
  if (::statfs("/run", &fs) != 0 || fs.f_type != TMPFS_MAGIC) return {};
  if (::mkdir("/run/tidepool", 0755) != 0 && errno != EEXIST) return {};
  struct stat st {};
  if (::lstat("/run/tidepool", &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != 0) return {};
  return "/run/tidepool/" + cgroup_name;
}

Result<std::unique_ptr<Backend>> make_container_backend(const ContainerOptions& opts) {
  if (opts.data_dir.empty() || opts.data_dir[0] != '/')
    return fail(Code::kInvalidArgument, "data_dir must be an absolute path");
  TP_TRY(sys::validate_id_base(opts.uid_base));
  auto sh = std::make_shared<Shared>();
  sh->opts = opts;
  sh->idmaps = std::make_unique<IdmapCache>(opts.uid_base);
  while (sh->opts.data_dir.size() > 1 && sh->opts.data_dir.back() == '/')
    sh->opts.data_dir.pop_back();
  const std::string& dd = sh->opts.data_dir;
  if (::mkdir(dd.c_str(), 0755) != 0 && errno != EEXIST) return sys_fail("mkdir(" + dd + ")");
  TP_TRY(check_traversable(dd));
  sh->mnt_dir = dd + "/containers/mnt";
  for (const std::string& d : {dd + "/containers", sh->mnt_dir}) {
    if (::mkdir(d.c_str(), 0755) != 0 && errno != EEXIST) return sys_fail("mkdir(" + d + ")");
  }
  // Root only: the agents' sockets are the daemon's way in, not the sandboxes'.
  std::string run_dir = opts.run_dir.empty() ? dd + "/containers/run" : opts.run_dir;
  while (run_dir.size() > 1 && run_dir.back() == '/') run_dir.pop_back();
  if (run_dir.empty() || run_dir[0] != '/')
    return fail(Code::kInvalidArgument, "run_dir must be an absolute path");
  TP_TRY(ensure_node(run_dir, S_IFDIR, 0700, 0));
  // Sandboxes of a run that used the data dir's run dir are still found there.
  std::vector<std::string> earlier;
  if (const std::string old = dd + "/containers/run";
      old != run_dir && ::access(old.c_str(), F_OK) == 0)
    earlier.push_back(old);
  sh->runs = std::make_unique<container::RunState>(run_dir, std::move(earlier));

  sh->agent_exe.reset(::open(opts.agent_path.c_str(), O_PATH | O_CLOEXEC));
  if (!sh->agent_exe) return sys_fail("open(" + opts.agent_path + ", O_PATH)");
  struct stat st {};
  if (::fstat(sh->agent_exe.get(), &st) != 0) return sys_fail("fstat(" + opts.agent_path + ")");
  if (!S_ISREG(st.st_mode) || (st.st_mode & S_IXOTH) == 0)
    return fail(Code::kInvalidArgument,
                "agent " + opts.agent_path + " must be a regular file executable by others");
  const std::string& spawner_path = opts.spawner_path.empty() ? opts.agent_path : opts.spawner_path;
  sh->spawner_exe.reset(::open(spawner_path.c_str(), O_PATH | O_CLOEXEC));
  if (!sh->spawner_exe) return sys_fail("open(" + spawner_path + ", O_PATH)");
  struct stat sst {};
  if (::fstat(sh->spawner_exe.get(), &sst) != 0) return sys_fail("fstat(" + spawner_path + ")");
  sh->agent_is_spawner = sst.st_dev == st.st_dev && sst.st_ino == st.st_ino;

  sh->common.mnt_dir = sh->mnt_dir;
  TP_TRY(prepare_shared_dirs(dd + "/containers", &sh->common));
  sh->common.masked_proc_files = present_in_proc(container::kMaskedProcFiles);
  sh->common.masked_proc_dirs = present_in_proc(container::kMaskedProcDirs);
  if (sh->common.dev_dir.empty()) {
    // The sandboxes' /dev nodes are binds of the host's: a node owned by a host uid
    // in the sandboxes' range could be chmod-ed by every sandbox (e.g. mode 000 on
    // /dev/null breaks the host). Such a host is misconfigured; say so loudly.
    for (int i = 0; container::kDevices[i].name; ++i) {
      const std::string p = std::string("/dev/") + container::kDevices[i].name;
      struct stat ds {};
      auto in_range = [&](uint32_t id) {
        return (id >= opts.uid_base && id - opts.uid_base < sys::kIdMapCount) ||
               (id >= opts.ranges_first && id - opts.ranges_first < opts.ranges_ids);
      };
      if (::stat(p.c_str(), &ds) == 0 && (in_range(ds.st_uid) || in_range(ds.st_gid)))
        spdlog::error(
            "{} is owned by {}:{}, inside the sandboxes' id range: every sandbox can change it "
            "(fix: chown root:root {})",
            p, ds.st_uid, ds.st_gid, p);
    }
  }

  auto layout = sys::detect_layout(sys::real_sys());
  if (!layout) return std::unexpected(layout.error());
  sh->cgroups = std::make_unique<sys::CgroupManager>(sys::real_sys(), *layout, opts.cgroup_name);
  TP_TRY(sh->cgroups->init());

  auto seccomp = sys::build_sandbox_filter();
  if (!seccomp) return std::unexpected(seccomp.error());
  sh->seccomp = std::move(*seccomp);
  auto nested = sys::build_sandbox_filter({.allow_mounts = true, .allow_setns = true});
  if (!nested) return std::unexpected(nested.error());
  sh->seccomp_nested = std::move(*nested);

  auto spawner = container::Spawner::start(sh->spawner_exe.get(), spawner_path,
                                           std::chrono::milliseconds(opts.spawner_timeout_ms));
  if (!spawner) return std::unexpected(spawner.error());
  sh->spawner = std::move(*spawner);

  auto host = image::ensure_host_image(dd, opts.uid_base);
  if (!host) return std::unexpected(host.error());
  sh->host = *host;
  for (const auto& b : sh->host.ro_binds) sh->host_binds.emplace_back(b, sys::locked_flags(b));
  if (opts.ranges_ids > 0) {
    // Per-sandbox ranges need idmapped mounts of the data dir's file system
    // (Linux >= 5.12; overlayfs over idmapped layers >= 5.19): say so now rather
    // than at the first create.
    TP_TRY(sys::validate_id_base(opts.ranges_first));
    auto idmap = make_idmap_userns(opts.uid_base, opts.ranges_first);
    if (!idmap) return std::unexpected(idmap.error());
    if (auto fd = idmapped_clone(sh->host.rootfs, idmap->ns.get()); !fd)
      return fail(Code::kInvalidArgument, "per-sandbox uid ranges need idmapped mounts on " + dd +
                                              ": " + fd.error().message() +
                                              " (--uid-ranges 0 shares one range instead)");
  }
  spdlog::info(
      "container backend: data_dir {}, cgroup {} ({}), image files at uid {}, sandbox ranges {}",
      dd, opts.cgroup_name,
      layout->version == sys::CgroupVersion::kV2 ? "v2 " + layout->v2_root : std::string("v1"),
      opts.uid_base,
      opts.ranges_ids
          ? fmt::format("{}..{} ({} of 65536 ids)", opts.ranges_first,
                        opts.ranges_first + opts.ranges_ids - 1, opts.ranges_ids / sys::kIdMapCount)
          : std::string("none (one shared range)"));
  return std::unique_ptr<Backend>(std::make_unique<ContainerBackend>(std::move(sh)));
}

}  // namespace tp::runtime
