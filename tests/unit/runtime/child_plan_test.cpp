// The sandbox recipe without root: which mounts, in which order, with which options.
#include "runtime/container/child_plan.h"

#include <gtest/gtest.h>
#include <sys/mount.h>

namespace tp::runtime::container {
namespace {

// `dev_dir`: the prepared /dev (empty: a data dir on a nodev file system).
ChildPlan make_plan(std::vector<std::string> lowers,
                    std::vector<std::pair<std::string, unsigned long>> binds,
                    std::string dev_dir = "/d/containers/dev") {
  RootRecipe r;
  r.id = "n0-abc";
  r.mnt_dir = "/d/containers/mnt";
  r.lowers = std::move(lowers);
  r.ro_binds = std::move(binds);
  r.disk_bytes = 1 << 20;
  r.dev_dir = std::move(dev_dir);
  r.dev_locked = MS_RELATIME;
  r.empty_dir = "/d/containers/empty";
  r.prep_locked = MS_RELATIME;
  r.cgroup_entries = {"/cg/memory/tp/n0-abc/tasks", "/cg/pids/tp/n0-abc/tasks"};
  r.setup_cgroup_dir = r.setup_listen = true;
  for (int i = 0; kMaskedProcFiles[i]; ++i) r.masked_proc_files.emplace_back(kMaskedProcFiles[i]);
  for (int i = 0; kMaskedProcDirs[i]; ++i) r.masked_proc_dirs.emplace_back(kMaskedProcDirs[i]);
  ChildPlan p;
  build_root_ops(r, &p);
  p.finish();
  return p;
}

int index_of(const ChildPlan& p, const std::string& desc_prefix) {
  for (size_t i = 0; i < p.ops.size(); ++i)
    if (p.steps[p.ops[i].step].starts_with(desc_prefix)) return static_cast<int>(i);
  return -1;
}

TEST(ChildPlanTest, OrderOfTheRecipe) {
  auto p = make_plan({"/img/rootfs"}, {{"/usr", MS_RELATIME}});
  ASSERT_FALSE(p.ops.empty());
  // First the pid (nothing may block before it), then into the cgroups, then nothing
  // before the spawner wrote the id maps.
  EXPECT_EQ(p.ops[0].kind, OpKind::kHello);
  EXPECT_EQ(p.ops[1].kind, OpKind::kRecvSetup);
  EXPECT_EQ(p.ops[1].mode, 2u);
  EXPECT_EQ(p.ops[1].flags, spawn::kSetupCgroupDir | spawn::kSetupListen);
  // A failed write of entry i is step + 1 + i.
  EXPECT_EQ(p.steps[p.ops[1].step + 1], "write(/cg/memory/tp/n0-abc/tasks, \"0\")");
  EXPECT_EQ(p.steps[p.ops[1].step + 2], "write(/cg/pids/tp/n0-abc/tasks, \"0\")");
  EXPECT_EQ(p.ops[2].kind, OpKind::kWaitSync);
  EXPECT_EQ(p.ops[3].kind, OpKind::kBecomeRoot);
  // The cgroup namespace is made once the child is in its cgroups.
  EXPECT_GT(index_of(p, "unshare(CLONE_NEWCGROUP)"), 3);
  int priv = index_of(p, "mount(none, /, none, MS_REC|MS_PRIVATE");
  int tmpfs = index_of(p, "mount(tmpfs, /d/containers/mnt, tmpfs");
  int ovl = index_of(p,
                     "mount(overlay, /d/containers/mnt/root, overlay, 0, "
                     "lowerdir=/img/rootfs,upperdir=/d/containers/mnt/upper,workdir=/d/containers/"
                     "mnt/work,userxattr)");
  int usr = index_of(p, "mount(/usr, /d/containers/mnt/root/usr, none, MS_BIND|MS_REC)");
  int proc = index_of(p, "mount(proc, /d/containers/mnt/root/proc, proc");
  int pivot = index_of(p, "pivot_root");
  ASSERT_GE(priv, 0);
  EXPECT_LT(priv, tmpfs);
  EXPECT_LT(tmpfs, ovl);
  EXPECT_LT(ovl, usr);
  EXPECT_LT(usr, proc);
  EXPECT_LT(proc, pivot);
  EXPECT_EQ(p.ops[static_cast<size_t>(usr + 1)].flags,
            MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_RELATIME);
  EXPECT_EQ(p.ops.back().kind, OpKind::kChdir);
  EXPECT_STREQ(p.ops[static_cast<size_t>(tmpfs)].d, "size=1048576,mode=0755");
}

TEST(ChildPlanTest, SensitiveProcEntriesAreMaskedAndOptional) {
  auto p = make_plan({"/a", "/b"}, {});
  for (const char* f :
       {"kcore", "keys", "sysrq-trigger", "timer_list", "sched_debug", "kpageflags"}) {
    int i = index_of(
        p, std::string("mount(/d/containers/dev/null, /d/containers/mnt/root/proc/") + f + ",");
    ASSERT_GE(i, 0) << f;
    EXPECT_TRUE(p.ops[static_cast<size_t>(i)].ignore_missing);
  }
  // Masked directories: one bind each of the root-owned empty directory.
  for (const char* d : {"acpi", "bus", "fs", "irq"}) {
    int i = index_of(p, std::string("mount(/d/containers/empty, /d/containers/mnt/root/proc/") + d +
                            ", none, MS_BIND)");
    ASSERT_GE(i, 0) << d;
    EXPECT_TRUE(p.ops[static_cast<size_t>(i)].ignore_missing);
    EXPECT_NE(p.ops[static_cast<size_t>(i + 1)].flags & MS_REMOUNT, MS_REMOUNT) << d;
  }
  EXPECT_EQ(index_of(p, "mount(/d/containers/mnt/root/proc/bus"), -1);
  int sys = index_of(p, "mount(/d/containers/mnt/root/proc/sys, /d/containers/mnt/root/proc/sys");
  ASSERT_GE(sys, 0);
  EXPECT_TRUE(p.ops[static_cast<size_t>(sys + 1)].flags & MS_RDONLY);
  EXPECT_GE(index_of(p, "mount(overlay, /d/containers/mnt/root, overlay, 0, lowerdir=/a:/b,"), 0);
  EXPECT_EQ(index_of(p, "mount(/usr"), -1);  // layer images get no host binds
}

TEST(ChildPlanTest, OnlyTheMasksThisKernelNeeds) {
  RootRecipe r;
  r.mnt_dir = "/m";
  r.lowers = {"/a"};
  r.dev_dir = "/p/dev";
  r.empty_dir = "/p/empty";
  r.masked_proc_files = {"keys"};
  ChildPlan p;
  build_root_ops(r, &p);
  EXPECT_GE(index_of(p, "mount(/p/dev/null, /m/root/proc/keys, none, MS_BIND)"), 0);
  EXPECT_EQ(index_of(p, "mount(/p/dev/null, /m/root/proc/kcore"), -1);
  EXPECT_EQ(index_of(p, "mount(/p/empty"), -1);
}

TEST(ChildPlanTest, DevIsOneReadOnlyBindOfThePreparedDir) {
  auto p = make_plan({"/a"}, {});
  int dev = index_of(p, "mount(/d/containers/dev, /d/containers/mnt/root/dev, none, MS_BIND)");
  ASSERT_GE(dev, 0);
  // Not nodev: the nodes must work. Read-only: every sandbox shares the directory.
  EXPECT_EQ(p.ops[static_cast<size_t>(dev + 1)].flags,
            MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC | MS_RELATIME);
  EXPECT_EQ(index_of(p, "mount(/dev/null"), -1);  // nothing of the host's /dev
  EXPECT_EQ(index_of(p, "symlink("), -1);         // the links are in the prepared dir
  int pts = index_of(p,
                     "mount(devpts, /d/containers/mnt/root/dev/pts, devpts, MS_NOSUID|MS_NOEXEC, "
                     "newinstance,ptmxmode=0666");
  EXPECT_GT(pts, dev);
  // /tmp and /dev/shm: directories of the writable layer's tmpfs (one superblock),
  // sticky and world-writable, bound after /dev.
  int tmp_dir = index_of(p, "mkdir(/d/containers/mnt/tmp)");
  int shm_dir = index_of(p, "mkdir(/d/containers/mnt/shm)");
  ASSERT_GE(tmp_dir, 0);
  ASSERT_GE(shm_dir, 0);
  EXPECT_EQ(p.ops[static_cast<size_t>(tmp_dir)].mode, 01777u);
  EXPECT_EQ(p.ops[static_cast<size_t>(shm_dir)].mode, 01777u);
  EXPECT_GT(index_of(p,
                     "mount(/d/containers/mnt/shm, /d/containers/mnt/root/dev/shm, none, "
                     "MS_BIND)"),
            dev);
  EXPECT_GT(index_of(p, "mount(/d/containers/mnt/tmp, /d/containers/mnt/root/tmp, none, MS_BIND)"),
            tmp_dir);
  // No tmpfs but the writable layer's (and none at all with a prepared /dev).
  int tmpfs_mounts = 0;
  for (const auto& s : p.steps) tmpfs_mounts += s.find(", tmpfs, ") != std::string::npos;
  EXPECT_EQ(tmpfs_mounts, 1);
  EXPECT_GE(index_of(p, "sethostname(n0-abc)"), 0);
}

TEST(ChildPlanTest, DevOnANodevDataDirBindsTheHostNodes) {
  auto p = make_plan({"/a"}, {}, "");
  EXPECT_GE(index_of(p, "mount(tmpfs, /d/containers/mnt/root/dev, tmpfs, MS_NOSUID|MS_NOEXEC"), 0);
  for (const char* d : {"null", "zero", "full", "random", "urandom", "tty"})
    EXPECT_GE(index_of(p, std::string("mount(/dev/") + d + ", /d/containers/mnt/root/dev/" + d +
                              ", none, MS_BIND)"),
              0)
        << d;
  EXPECT_GE(index_of(p, "mount(/dev/null, /d/containers/mnt/root/proc/keys, none, MS_BIND)"), 0);
  EXPECT_GE(index_of(p, "symlink(pts/ptmx, /d/containers/mnt/root/dev/ptmx)"), 0);
  EXPECT_GE(index_of(p, "mount(devpts, /d/containers/mnt/root/dev/pts"), 0);
}

TEST(ChildPlanTest, ExecStepsHaveDescriptions) {
  auto p = make_plan({"/a"}, {});
  ASSERT_EQ(p.steps.size(), p.exec_steps_base + 7);
  EXPECT_NE(p.steps[p.exec_steps_base + 5].find("execveat"), std::string::npos);
  EXPECT_NE(p.steps.back().find("cgroup directory, 4"), std::string::npos);
}

}  // namespace
}  // namespace tp::runtime::container
