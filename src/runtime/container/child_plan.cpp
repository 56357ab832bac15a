#include "runtime/container/child_plan.h"

#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

namespace tp::runtime::container {

// Same lists as docker/crun's defaults, plus kallsyms: with kptr_restrict=0 and
// perf_event_paranoid<=1 it shows kernel addresses (a KASLR bypass) to anyone.
const char* const kMaskedProcFiles[] = {
    "kcore", "keys", "latency_stats", "timer_list", "timer_stats", "sched_debug", "kpagecgroup",
    "kpageflags", "kpagecount", "sysrq-trigger", "config.gz", "kallsyms",
    // The agent (pid 1): its OOM score stays out of the sandbox's reach (its memory is
    // already: it is not dumpable and commands have no CAP_SYS_PTRACE).
    "1/oom_score_adj", "1/oom_adj", "1/task/1/oom_score_adj", "1/task/1/oom_adj", nullptr};
const DeviceNode kDevices[] = {{"null", 1, 3},    {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8},
                               {"urandom", 1, 9}, {"tty", 5, 0},  {nullptr, 0, 0}};
const char* const kDevSymlinks[][2] = {{"ptmx", "pts/ptmx"},          {"fd", "/proc/self/fd"},
                                       {"stdin", "/proc/self/fd/0"},  {"stdout", "/proc/self/fd/1"},
                                       {"stderr", "/proc/self/fd/2"}, {nullptr, nullptr}};
const UserNsLimit kUserNsLimits[] = {{"max_inotify_instances", "32"},
                                     {"max_inotify_watches", "16384"},
                                     {"max_user_namespaces", "0"},
                                     {nullptr, nullptr}};
// Pseudo-terminals per sandbox: every devpts instance draws on the host-wide
// kernel.pty.max (kernel.pty.reserve keeps a share for the host's own instance).
const int kPtyMax = 64;
// bus, fs and irq were read-only binds of themselves (two mount calls each); hidden,
// they cost one and show less of the host (its PCI and input devices, its file
// systems' and IRQs' settings). /proc/sys stays visible, read-only.
const char* const kMaskedProcDirs[] = {"acpi", "scsi", "asound", "firmware",
                                       "bus",  "fs",   "irq",    nullptr};
const char* const kReadOnlyProcDirs[] = {"sys", nullptr};

namespace {

std::string flag_names(unsigned long f) {
  std::string s;
  auto add = [&](unsigned long bit, const char* n) {
    if (f & bit) s += std::string(s.empty() ? "" : "|") + n;
  };
  add(MS_BIND, "MS_BIND");
  add(MS_REC, "MS_REC");
  add(MS_REMOUNT, "MS_REMOUNT");
  add(MS_PRIVATE, "MS_PRIVATE");
  add(MS_RDONLY, "MS_RDONLY");
  add(MS_NOSUID, "MS_NOSUID");
  add(MS_NODEV, "MS_NODEV");
  add(MS_NOEXEC, "MS_NOEXEC");
  return s.empty() ? "0" : s;
}

}  // namespace

void ChildPlan::mount(const std::string& src, const std::string& target, const std::string& fstype,
                      unsigned long flags, const std::string& data, bool ignore_missing) {
  Op op{OpKind::kMount};
  op.ignore_missing = ignore_missing;
  op.flags = flags;
  op.a = src.empty() ? nullptr : keep(src);
  op.b = keep(target);
  op.c = fstype.empty() ? nullptr : keep(fstype);
  op.d = data.empty() ? nullptr : keep(data);
  op.step = step("mount(" + (src.empty() ? std::string("none") : src) + ", " + target + ", " +
                 (fstype.empty() ? std::string("none") : fstype) + ", " + flag_names(flags) +
                 (data.empty() ? std::string() : ", " + data) + ")");
  ops.push_back(op);
}

void ChildPlan::bind_ro(const std::string& src, const std::string& target, unsigned long extra,
                        bool ignore_missing) {
  mount(src, target, "", MS_BIND | MS_REC, "", ignore_missing);
  // The remount must repeat flags the kernel locked on the source (e.g. nosuid, atime).
  mount("", target, "", MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | extra, "",
        ignore_missing);
}

void ChildPlan::mkdir(const std::string& path, uint32_t mode) {
  Op op{OpKind::kMkdir};
  op.a = keep(path);
  op.mode = mode;
  op.step = step("mkdir(" + path + ")");
  ops.push_back(op);
}

void ChildPlan::touch(const std::string& path) {
  Op op{OpKind::kTouch};
  op.a = keep(path);
  op.step = step("open(" + path + ", O_CREAT)");
  ops.push_back(op);
}

void ChildPlan::symlink(const std::string& target, const std::string& path) {
  Op op{OpKind::kSymlink};
  op.a = keep(target);
  op.b = keep(path);
  op.step = step("symlink(" + target + ", " + path + ")");
  ops.push_back(op);
}

void ChildPlan::write_file(const std::string& path, const std::string& data, bool ignore_missing) {
  Op op{OpKind::kWriteFile};
  op.ignore_missing = ignore_missing;
  op.a = keep(path);
  op.b = keep(data);
  op.step = step("write(" + path + ", \"" + data + "\")");
  ops.push_back(op);
}

void ChildPlan::set_rlimit(int resource, const std::string& name, uint64_t value) {
  Op op{OpKind::kSetRlimit};
  op.mode = static_cast<uint32_t>(resource);
  op.flags = value;
  op.step = step("setrlimit(" + name + ", " + std::to_string(value) + ")");
  limits.push_back(op);
}

void ChildPlan::sched_idle() {
  Op op{OpKind::kSchedIdle};
  op.step = step("sched_setscheduler(0, SCHED_IDLE)");
  limits.push_back(op);
}

void ChildPlan::move_mount(int fd, const std::string& what, const std::string& target) {
  Op op{OpKind::kMoveMount};
  op.fd = fd;
  op.a = keep(target);
  op.step = step("move_mount(" + what + ", " + target + ")");
  ops.push_back(op);
}

void ChildPlan::simple(OpKind k, const std::string& desc, const std::string& a,
                       unsigned long flags) {
  Op op{k};
  op.a = a.empty() ? nullptr : keep(a);
  op.flags = flags;
  op.step = step(desc);
  ops.push_back(op);
}

void ChildPlan::set_ids(uint32_t uid, uint32_t gid) {
  Op op{OpKind::kSetIds};
  op.flags = uid;
  op.mode = gid;
  op.step = step("setresgid/setgroups/setresuid(" + std::to_string(uid) + ")");
  ops.push_back(op);
}

void ChildPlan::finish() {
  // In spawn::ExecStep's order.
  exec_steps_base = static_cast<uint32_t>(steps.size());
  steps.push_back("fcntl(F_DUPFD_CLOEXEC)");
  steps.push_back("open(/dev/null) for stdio");
  steps.push_back("dup3(agent socket, 3) / dup3(agent listening socket, 5)");
  steps.push_back("close_range(6 or 7, ~0)");
  steps.push_back("prctl(PR_SET_NO_NEW_PRIVS) + seccomp(SECCOMP_SET_MODE_FILTER)");
  steps.push_back("execveat(tp-agent, \"\", AT_EMPTY_PATH)");
  steps.push_back("dup3(cgroup directory, 4)");
}

spawn::Request ChildPlan::to_request() const {
  spawn::Request r;
  auto with_slot = [&](Op op) {
    if (op.fd >= 0) op.fd = r.slot(op.fd);
    return op;
  };
  for (const auto& op : ops) r.ops.push_back(with_slot(op));
  for (const auto& op : limits) r.limits.push_back(with_slot(op));
  for (const char* a : argv) r.argv.emplace_back(a);
  for (const char* e : envp) r.envp.emplace_back(e);
  if (seccomp) r.seccomp = seccomp->insns;
  r.exec_steps_base = exec_steps_base;
  r.agent_slot = r.slot(agent_child);
  if (agent_listen >= 0) r.listen_slot = r.slot(agent_listen);
  if (cgroup_fd >= 0) r.cgroup_slot = r.slot(cgroup_fd);
  if (exe_fd >= 0) r.exe_slot = r.slot(exe_fd);
  if (log_fd >= 0) r.log_slot = r.slot(log_fd);
  return r;
}

spawn::ExecPlan ChildPlan::in_process(int sync_rd, int sync_wr, int err_rd, int err_wr,
                                      std::vector<char*>* args) const {
  // Without an exec the child would go on in the daemon's memory.
  if (exe_fd < 0) std::abort();
  args->clear();
  for (const char* a : argv) args->push_back(const_cast<char*>(a));
  args->push_back(nullptr);
  const size_t env_at = args->size();
  for (const char* e : envp) args->push_back(const_cast<char*>(e));
  args->push_back(nullptr);
  spawn::ExecPlan e;
  e.ops = ops.data();
  e.n_ops = static_cast<uint32_t>(ops.size());
  e.limits = limits.data();
  e.n_limits = static_cast<uint32_t>(limits.size());
  e.argv = args->data();
  e.envp = args->data() + env_at;
  if (seccomp) e.seccomp = seccomp->fprog;
  e.sync_rd = sync_rd;
  e.err_wr = err_wr;
  e.agent_child = agent_child;
  e.cgroup_fd = cgroup_fd;
  e.agent_listen = agent_listen;
  e.log_fd = log_fd;
  e.exe_fd = exe_fd;
  e.exec_steps_base = exec_steps_base;
  e.drop_first[0] = sync_wr;
  e.drop_first[1] = err_rd;
  return e;
}

int run_in_clone(void* exec_plan) {
  spawn::run_child(*static_cast<const spawn::ExecPlan*>(exec_plan));
}

std::optional<Error> read_child_failure(int err_rd, const ChildPlan& plan,
                                        const std::string& prefix, const char* unnamed) {
  ChildFailure f{};
  ssize_t n;
  do n = ::read(err_rd, &f, sizeof f);
  while (n < 0 && errno == EINTR);
  if (n < 0) return Error{code_from_errno(errno), errno, prefix + "read(error pipe)"};
  if (n == 0) return std::nullopt;
  std::string step =
      (n == sizeof f && f.step >= 0 && static_cast<size_t>(f.step) < plan.steps.size())
          ? plan.steps[static_cast<size_t>(f.step)]
          : unnamed;
  return Error{code_from_errno(f.err), f.err, prefix + step};
}

void build_root_ops(const RootRecipe& r, ChildPlan* p) {
  const std::string& m = r.mnt_dir;
  const std::string root = m + "/root";
  // Before anything can block: the daemon learns our pid even if the spawner dies.
  p->simple(OpKind::kHello, "readlink(/proc/self) + write(error pipe)");
  // The daemon makes the cgroups (and the agent's listening socket) while the
  // spawner clones: they arrive on the agent socket, and the child joins them before
  // anything else happens in it.
  Op setup{OpKind::kRecvSetup};
  setup.mode = static_cast<uint32_t>(r.cgroup_entries.size());
  setup.flags = (r.setup_cgroup_dir ? spawn::kSetupCgroupDir : 0) |
                (r.setup_listen ? spawn::kSetupListen : 0);
  setup.step = p->step("recvmsg(agent socket): the daemon's setup message");
  for (const auto& path : r.cgroup_entries) p->step("write(" + path + ", \"0\")");
  p->ops.push_back(setup);
  p->simple(OpKind::kWaitSync, "read(sync pipe)");
  p->simple(OpKind::kBecomeRoot, "setresgid/setgroups/setresuid(0) in the user namespace");
  // After we moved into the sandbox's cgroups, so that they are the cgroup ns root.
  p->simple(OpKind::kUnshare, "unshare(CLONE_NEWCGROUP)", "", CLONE_NEWCGROUP);
  p->simple(OpKind::kSethostname, "sethostname(" + r.id + ")", r.id);
  p->simple(OpKind::kLoopbackUp, "ioctl(lo, SIOCSIFFLAGS, IFF_UP)");
  p->mount("", "/", "", MS_REC | MS_PRIVATE, "");
  p->mount("tmpfs", m, "tmpfs", MS_NOSUID | MS_NODEV,
           "size=" + std::to_string(r.disk_bytes) + ",mode=0755");
  p->mkdir(m + "/upper", 0755);
  p->mkdir(m + "/work", 0700);
  // /tmp and /dev/shm are directories of this same tmpfs, bound below: every
  // superblock registers a memcg-aware shrinker, and each memory cgroup on the host
  // keeps a slot for every one there has been at once (docs/lifecycle.md, "Density"),
  // so two tmpfs instances fewer per sandbox shrink every sandbox's kernel memory.
  p->mkdir(m + "/tmp", 01777);
  p->mkdir(m + "/shm", 01777);
  p->mkdir(root, 0755);
  std::string lower;
  if (!r.lower_fds.empty()) {
    // Idmapped layers: files stored as ids uid_base.. appear as the sandbox's own
    // range (so as 0.. inside) without a copy per sandbox.
    p->mkdir(m + "/lower", 0700);
    for (size_t i = 0; i < r.lower_fds.size(); ++i) {
      const std::string at = m + "/lower/" + std::to_string(i);
      p->mkdir(at, 0700);
      p->move_mount(r.lower_fds[i], "idmapped " + r.lowers[i], at);
      lower += (lower.empty() ? "" : ":") + at;
    }
  } else {
    for (const auto& l : r.lowers) lower += (lower.empty() ? "" : ":") + l;
  }
  // userxattr: in a user namespace overlayfs cannot read trusted.overlay.*, so
  // opaque directories in image layers are marked with user.overlay.opaque
  // (src/image/layer_unpack.h); whiteouts are 0/0 character devices either way.
  p->mount("overlay", root, "overlay", 0,
           "lowerdir=" + lower + ",upperdir=" + m + "/upper,workdir=" + m + "/work,userxattr");
  for (const auto& [src, locked] : r.ro_binds) p->bind_ro(src, root + src, locked);
  // Layer images may lack the mount points; on the host image they exist (no copy-up then).
  for (const char* d : {"/proc", "/dev", "/tmp"}) p->mkdir(root + d, 0755);

  // /proc, with what would reveal or change host state masked or read-only.
  const std::string proc = root + "/proc";
  const std::string dev = root + "/dev";
  const std::string null_dev = r.dev_dir.empty() ? "/dev/null" : r.dev_dir + "/null";
  p->mount("proc", proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "");
  // The limits of the sandbox's user namespace: /proc/sys/user resolves to the writer's
  // namespace. Written through the sandbox's own /proc, before its sys goes read-only:
  // through the host's, the entries of every live sandbox's namespace share one dcache
  // hash chain (same parent, same name), so each create walked all of them (O(live
  // sandboxes), 6% of a 1,000-sandbox burst's CPU). Missing on older kernels (no inotify
  // limits before 5.11): skipped.
  for (int i = 0; kUserNsLimits[i].name; ++i)
    p->write_file(proc + "/sys/user/" + kUserNsLimits[i].name, kUserNsLimits[i].value, true);
  for (int i = 0; kReadOnlyProcDirs[i]; ++i)
    p->bind_ro(proc + "/" + kReadOnlyProcDirs[i], proc + "/" + kReadOnlyProcDirs[i], MS_NOEXEC,
               true);
  for (const auto& f : r.masked_proc_files)
    p->mount(null_dev, proc + "/" + f, "", MS_BIND, "", true);
  // One bind each of the empty directory, without a read-only remount: it is owned by
  // host root (an id no sandbox maps) with mode 0555, so no sandbox id may create,
  // change or chmod anything in it whatever the mount's flags, and a sandbox cannot
  // remount or unmount (seccomp refuses the mount API; the binds below it too).
  for (const auto& d : r.masked_proc_dirs)
    p->mount(r.empty_dir, proc + "/" + d, "", MS_BIND, "", true);

  if (!r.dev_dir.empty()) {
    // /dev: one read-only bind of the prepared directory (not nodev: its nodes must work).
    p->mount(r.dev_dir, dev, "", MS_BIND, "");
    p->mount("", dev, "", MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC | r.dev_locked,
             "");
  } else {
    p->mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=65536,mode=0755");
    for (int i = 0; kDevices[i].name; ++i) {
      const std::string d = kDevices[i].name;
      p->touch(dev + "/" + d);
      p->mount("/dev/" + d, dev + "/" + d, "", MS_BIND, "");
    }
    p->mkdir(dev + "/pts", 0755);
    p->mkdir(dev + "/shm", 01777);
    for (int i = 0; kDevSymlinks[i][0]; ++i)
      p->symlink(kDevSymlinks[i][1], dev + "/" + kDevSymlinks[i][0]);
  }
  p->mount("devpts", dev + "/pts", "devpts", MS_NOSUID | MS_NOEXEC,
           "newinstance,ptmxmode=0666,mode=0620,gid=5,max=" + std::to_string(kPtyMax));
  // Binds keep the tmpfs mount's nosuid and nodev.
  p->mount(m + "/shm", dev + "/shm", "", MS_BIND, "");
  p->mount(m + "/tmp", root + "/tmp", "", MS_BIND, "");

  p->simple(OpKind::kChdir, "chdir(" + root + ")", root);
  p->simple(OpKind::kPivotRoot, "pivot_root(., .)");
  p->simple(OpKind::kUmountDetach, "umount2(old root, MNT_DETACH)", ".");
  p->simple(OpKind::kChdir, "chdir(/)", "/");
}

}  // namespace tp::runtime::container
