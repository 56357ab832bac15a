// CgroupManager logic against the fake seam: layouts, limit files, attach, stats, kill and cleanup.
#include "sys/cgroup.h"

#include <gtest/gtest.h>

#include <tuple>

#include "fake_sys_api.h"

namespace tp::sys {
namespace {

constexpr const char* kHybridMountinfo =
    "22 27 0:21 / /proc rw,relatime - proc proc rw\n"
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer\n"
    "39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

constexpr const char* kV2Mountinfo =
    "22 27 0:21 / /proc rw,relatime - proc proc rw\n"
    "31 23 0:28 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate\n";

CgroupLayout v1_layout() {
  FakeSysApi f;
  return *parse_layout(kHybridMountinfo, f);
}

CgroupLayout v2_layout() { return CgroupLayout{CgroupVersion::kV2, "/cg", {}}; }

TEST(CgroupLayoutTest, HybridHostUsesV1WithOptionalControllers) {
  FakeSysApi f;
  auto l = parse_layout(kHybridMountinfo, f);
  ASSERT_TRUE(l);
  EXPECT_EQ(l->version, CgroupVersion::kV1);
  EXPECT_EQ(l->v1_mounts.at("memory"), "/sys/fs/cgroup/memory");
  EXPECT_EQ(l->v1_mounts.at("cpuacct"), "/sys/fs/cgroup/cpuacct");
  EXPECT_EQ(l->v1_mounts.at("freezer"), "/sys/fs/cgroup/freezer");
  EXPECT_FALSE(l->v1_mounts.contains("cpuset"));
}

TEST(CgroupLayoutTest, PureV2) {
  FakeSysApi f;
  auto l = parse_layout(kV2Mountinfo, f);
  ASSERT_TRUE(l);
  EXPECT_EQ(l->version, CgroupVersion::kV2);
  EXPECT_EQ(l->v2_root, "/sys/fs/cgroup");
}

TEST(CgroupLayoutTest, UnifiedMountNeedsControllersWhenV1Incomplete) {
  std::string mi =
      "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
      "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
  FakeSysApi f;
  f.files["/sys/fs/cgroup/unified/cgroup.controllers"] = "hugetlb\n";
  EXPECT_FALSE(parse_layout(mi, f));
  f.files["/sys/fs/cgroup/unified/cgroup.controllers"] = "cpu memory pids\n";
  auto l = parse_layout(mi, f);
  ASSERT_TRUE(l);
  EXPECT_EQ(l->version, CgroupVersion::kV2);
  EXPECT_EQ(l->v2_root, "/sys/fs/cgroup/unified");
}

TEST(CgroupLayoutTest, CoMountedCpuCpuacctShareOneDirectory) {
  std::string mi =
      "1 0 0:1 / /c/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
      "2 0 0:2 / /c/memory rw - cgroup cgroup rw,memory\n"
      "3 0 0:3 / /c/pids rw - cgroup cgroup rw,pids\n";
  FakeSysApi f;
  auto l = parse_layout(mi, f);
  ASSERT_TRUE(l);
  CgroupManager m(f, *l, "tp");
  auto d = m.dirs("a");
  EXPECT_EQ(d.size(), 3u);
}

class CgroupV1Test : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const auto& [c, mnt] : layout_.v1_mounts) f_.dirs.insert(mnt);
    f_.auto_files = {"cgroup.procs",      "memory.limit_in_bytes", "memory.memsw.limit_in_bytes",
                     "memory.swappiness", "cpu.cfs_quota_us",      "cpu.cfs_period_us",
                     "pids.max",          "freezer.state"};
    ASSERT_TRUE(m_.init());
  }
  CgroupLayout layout_ = v1_layout();
  FakeSysApi f_;
  CgroupManager m_{f_, layout_, "tidepool"};
};

TEST_F(CgroupV1Test, ADefaultCpuPeriodIsLeftAsItIs) {
  // A new cpu cgroup reads the default period: only the quota is written.
  ASSERT_TRUE(m_.make_dirs("sb1"));
  const std::string cpu = "/sys/fs/cgroup/cpu/tidepool/sb1";
  f_.files[cpu + "/cpu.cfs_period_us"] = "100000\n";
  ASSERT_TRUE(m_.write_limits("sb1", {512ull << 20, 1.5, 64}));
  EXPECT_EQ(f_.written(cpu + "/cpu.cfs_period_us"), "<unwritten>");
  EXPECT_EQ(f_.written(cpu + "/cpu.cfs_quota_us"), "150000");
  // Any other period (a cgroup left by someone else) is set.
  f_.files[cpu + "/cpu.cfs_period_us"] = "250000\n";
  ASSERT_TRUE(m_.write_limits("sb1", {512ull << 20, 1.5, 64}));
  EXPECT_EQ(f_.written(cpu + "/cpu.cfs_period_us"), "100000");
}

TEST_F(CgroupV1Test, CreateWritesLimitsInEveryController) {
  ASSERT_TRUE(m_.create("sb1", {512ull << 20, 1.5, 64}));
  const std::string mem = "/sys/fs/cgroup/memory/tidepool/sb1";
  EXPECT_EQ(f_.written(mem + "/memory.limit_in_bytes"), std::to_string(512ull << 20));
  EXPECT_EQ(f_.written(mem + "/memory.memsw.limit_in_bytes"), std::to_string(512ull << 20));
  EXPECT_EQ(f_.written(mem + "/memory.swappiness"), "<unwritten>");
  EXPECT_EQ(f_.written("/sys/fs/cgroup/cpu/tidepool/sb1/cpu.cfs_quota_us"), "150000");
  EXPECT_EQ(f_.written("/sys/fs/cgroup/cpu/tidepool/sb1/cpu.cfs_period_us"), "100000");
  EXPECT_EQ(f_.written("/sys/fs/cgroup/pids/tidepool/sb1/pids.max"), "64");
  for (const char* c : {"memory", "cpu", "cpuacct", "pids", "freezer"})
    EXPECT_TRUE(f_.dirs.contains(std::string("/sys/fs/cgroup/") + c + "/tidepool/sb1")) << c;
  // memsw must follow memory.limit_in_bytes (the kernel requires memsw >= limit).
  size_t i_lim = 0, i_sw = 0;
  for (size_t i = 0; i < f_.writes.size(); ++i) {
    if (f_.writes[i].first == mem + "/memory.limit_in_bytes") i_lim = i;
    if (f_.writes[i].first == mem + "/memory.memsw.limit_in_bytes") i_sw = i;
  }
  EXPECT_LT(i_lim, i_sw);
}

TEST_F(CgroupV1Test, TcpBuffersAreCappedAtTheMemoryLimitWhereV1CanAccountThem) {
  ASSERT_TRUE(m_.create("sb0", {64ull << 20, 0, 0}));
  EXPECT_EQ(f_.written("/sys/fs/cgroup/memory/tidepool/sb0/memory.kmem.tcp.limit_in_bytes"),
            "<unwritten>");  // no such file: nothing to set
  f_.auto_files.push_back("memory.kmem.tcp.limit_in_bytes");
  ASSERT_TRUE(m_.create("sb1", {64ull << 20, 0, 0}));
  EXPECT_EQ(f_.written("/sys/fs/cgroup/memory/tidepool/sb1/memory.kmem.tcp.limit_in_bytes"),
            std::to_string(64ull << 20));
}

TEST_F(CgroupV1Test, BestEffortGetsTheLowestWeightThenAnIdleGroupWhereTheKernelHasOne) {
  f_.auto_files.push_back("cpu.shares");
  ASSERT_TRUE(m_.create("be0", {64ull << 20, 1, 0, true}));
  const std::string cpu0 = "/sys/fs/cgroup/cpu/tidepool/be0";
  EXPECT_EQ(f_.written(cpu0 + "/cpu.shares"), "2");
  EXPECT_EQ(f_.written(cpu0 + "/cpu.idle"), "<unwritten>");  // before 5.15: no such file
  f_.auto_files.push_back("cpu.idle");
  ASSERT_TRUE(m_.create("be1", {64ull << 20, 1, 0, true}));
  const std::string cpu1 = "/sys/fs/cgroup/cpu/tidepool/be1";
  EXPECT_EQ(f_.written(cpu1 + "/cpu.idle"), "1");
  size_t i_shares = 0, i_idle = 0;
  for (size_t i = 0; i < f_.writes.size(); ++i) {
    if (f_.writes[i].first == cpu1 + "/cpu.shares") i_shares = i;
    if (f_.writes[i].first == cpu1 + "/cpu.idle") i_idle = i;
  }
  EXPECT_LT(i_shares, i_idle) << "an idle group refuses a new weight";
  ASSERT_TRUE(m_.create("normal", {64ull << 20, 1, 0}));
  EXPECT_EQ(f_.written("/sys/fs/cgroup/cpu/tidepool/normal/cpu.idle"), "<unwritten>");
  EXPECT_EQ(f_.written("/sys/fs/cgroup/cpu/tidepool/normal/cpu.shares"), "<unwritten>");
}

TEST_F(CgroupV1Test, NoSwapAccountingFallsBackToSwappinessZero) {
  f_.auto_files = {"cgroup.procs", "memory.limit_in_bytes", "memory.swappiness", "pids.max"};
  ASSERT_TRUE(m_.create("sb1", {1 << 20, 0, 0}));
  EXPECT_EQ(f_.written("/sys/fs/cgroup/memory/tidepool/sb1/memory.swappiness"), "0");
  EXPECT_EQ(f_.written("/sys/fs/cgroup/cpu/tidepool/sb1/cpu.cfs_quota_us"), "<unwritten>");
}

TEST_F(CgroupV1Test, FailedLimitUnwindsDirectories) {
  f_.fail_write["/sys/fs/cgroup/pids/tidepool/sb1/pids.max"] = EINVAL;
  auto r = m_.create("sb1", {1 << 20, 1, 10});
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("pids.max"), std::string::npos);
  EXPECT_TRUE(m_.list().empty());
}

TEST_F(CgroupV1Test, DuplicateIdIsAConflict) {
  ASSERT_TRUE(m_.create("sb1", {}));
  auto r = m_.create("sb1", {});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kConflict);
  EXPECT_EQ(m_.list(), std::vector<std::string>{"sb1"});  // the first one is untouched
}

TEST_F(CgroupV1Test, AttachWritesPidEverywhere) {
  ASSERT_TRUE(m_.create("sb1", {}));
  ASSERT_TRUE(m_.attach("sb1", 4242));
  for (const auto& d : m_.dirs("sb1")) EXPECT_EQ(f_.written(d + "/cgroup.procs"), "4242");
}

// The daemon thread's own cgroups as /proc/thread-self/cgroup shows them; its
// memory and pids cgroups are below the roots.
constexpr const char* kOwnCgroups =
    "6:pids:/daemon\n5:freezer:/\n4:memory:/daemon\n3:cpuset:/\n2:cpuacct:/\n1:cpu:/\n0::/daemon\n";

TEST_F(CgroupV1Test, EnterThreadMovesOnlyTheCallerAndLeaveRestoresIt) {
  ASSERT_TRUE(m_.can_enter_thread());
  f_.files["/proc/thread-self/cgroup"] = kOwnCgroups;
  for (const char* d : {"/sys/fs/cgroup/memory/daemon", "/sys/fs/cgroup/pids/daemon"})
    f_.dirs.insert(d);
  ASSERT_TRUE(m_.create("sb1", {}));
  f_.writes.clear();
  auto prev = m_.enter_thread("sb1");
  ASSERT_TRUE(prev) << prev.error().message();
  EXPECT_EQ(*prev, (std::vector<std::string>{
                       "/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpuacct", "/sys/fs/cgroup/freezer",
                       "/sys/fs/cgroup/memory/daemon", "/sys/fs/cgroup/pids/daemon"}));
  // "0" into `tasks` moves the calling thread only; cgroup.procs is never touched.
  std::vector<std::pair<std::string, std::string>> want;
  for (const auto& d : m_.dirs("sb1")) want.emplace_back(d + "/tasks", "0");
  EXPECT_EQ(f_.writes, want);
  f_.writes.clear();
  ASSERT_TRUE(m_.leave_thread(*prev));
  want.clear();
  for (const auto& d : *prev) want.emplace_back(d + "/tasks", "0");
  EXPECT_EQ(f_.writes, want);
}

TEST_F(CgroupV1Test, FailedEnterPutsTheThreadBack) {
  f_.files["/proc/thread-self/cgroup"] = kOwnCgroups;
  for (const char* d : {"/sys/fs/cgroup/memory/daemon", "/sys/fs/cgroup/pids/daemon"})
    f_.dirs.insert(d);
  ASSERT_TRUE(m_.create("sb1", {}));
  f_.fail_write["/sys/fs/cgroup/memory/tidepool/sb1/tasks"] = ENOMEM;
  f_.writes.clear();
  auto prev = m_.enter_thread("sb1");
  ASSERT_FALSE(prev);
  EXPECT_EQ(prev.error().sys_errno, ENOMEM);
  // Entered cpu, cpuacct and freezer, failed at memory: back out of those three.
  std::vector<std::pair<std::string, std::string>> want = {
      {"/sys/fs/cgroup/cpu/tidepool/sb1/tasks", "0"},
      {"/sys/fs/cgroup/cpuacct/tidepool/sb1/tasks", "0"},
      {"/sys/fs/cgroup/freezer/tidepool/sb1/tasks", "0"},
      {"/sys/fs/cgroup/cpu/tasks", "0"},
      {"/sys/fs/cgroup/cpuacct/tasks", "0"},
      {"/sys/fs/cgroup/freezer/tasks", "0"}};
  EXPECT_EQ(f_.writes, want);
}

TEST_F(CgroupV1Test, EnterNeedsTheThreadsOwnCgroups) {
  ASSERT_TRUE(m_.create("sb1", {}));
  f_.files["/proc/thread-self/cgroup"] = "1:cpu:/\n";  // no memory, pids, ... line
  f_.writes.clear();
  EXPECT_FALSE(m_.enter_thread("sb1"));
  EXPECT_TRUE(f_.writes.empty());  // nothing moved
}

TEST_F(CgroupV1Test, LeaveFallsBackToTheRootWhenThePreviousCgroupIsGone) {
  // The daemon's memory cgroup vanished meanwhile: the thread goes to the root, never stays.
  std::vector<std::string> prev = {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpuacct",
                                   "/sys/fs/cgroup/freezer", "/sys/fs/cgroup/memory/gone",
                                   "/sys/fs/cgroup/pids"};
  ASSERT_TRUE(m_.leave_thread(prev));
  EXPECT_EQ(f_.written("/sys/fs/cgroup/memory/tasks"), "0");
  EXPECT_EQ(f_.written("/sys/fs/cgroup/memory/gone/tasks"), "<unwritten>");
  // Not even the root takes it: an error, the caller must not go on.
  f_.fail_write["/sys/fs/cgroup/memory/tasks"] = EIO;
  EXPECT_FALSE(m_.leave_thread(prev));
}

TEST_F(CgroupV1Test, StatsParseV1Files) {
  ASSERT_TRUE(m_.create("sb1", {}));
  const std::string mem = "/sys/fs/cgroup/memory/tidepool/sb1";
  f_.files[mem + "/memory.usage_in_bytes"] = "1000\n";
  f_.files[mem + "/memory.max_usage_in_bytes"] = "5000\n";
  f_.files[mem + "/memory.oom_control"] = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
  f_.files["/sys/fs/cgroup/pids/tidepool/sb1/pids.current"] = "7\n";
  f_.files["/sys/fs/cgroup/cpuacct/tidepool/sb1/cpuacct.usage"] = "2500000\n";
  auto s = m_.stats("sb1");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->memory_bytes, 1000u);
  EXPECT_EQ(s->memory_peak_bytes, 5000u);
  EXPECT_EQ(s->oom_kills, 3u);
  EXPECT_EQ(s->pids, 7u);
  EXPECT_EQ(s->cpu_usage_us, 2500u);
  EXPECT_FALSE(m_.stats("nope"));
  auto k = m_.oom_kills("sb1");
  ASSERT_TRUE(k);
  EXPECT_EQ(*k, 3u);
  EXPECT_FALSE(m_.oom_kills("nope"));
}

TEST_F(CgroupV1Test, KillAllFreezesKillsThawsAndWaits) {
  ASSERT_TRUE(m_.create("sb1", {}));
  for (const auto& d : m_.dirs("sb1")) f_.files[d + "/cgroup.procs"] = "11\n12\n";
  f_.on_kill = [&](pid_t) {
    // The processes leave every cgroup once killed (and thawed, in reality).
    for (const auto& d : m_.dirs("sb1")) f_.files[d + "/cgroup.procs"] = "";
  };
  const std::string fz = "/sys/fs/cgroup/freezer/tidepool/sb1/freezer.state";
  f_.files[fz] = "FROZEN\n";
  ASSERT_TRUE(m_.kill_all("sb1"));
  ASSERT_EQ(f_.kills.size(), 2u);
  EXPECT_EQ(f_.kills[0], (std::pair<pid_t, int>{11, 9}));
  EXPECT_EQ(f_.kills[1], (std::pair<pid_t, int>{12, 9}));
  // Frozen before the kills, thawed after.
  std::vector<std::string> states;
  for (const auto& [p, d] : f_.writes)
    if (p == fz) states.push_back(d);
  EXPECT_EQ(states, (std::vector<std::string>{"FROZEN", "THAWED"}));
  ASSERT_TRUE(m_.remove("sb1"));
  EXPECT_TRUE(m_.list().empty());
}

// v1 can leave a freeze FREEZING (a task that went to sleep just as it began) until
// FROZEN is written again. kill_all asked only once and then waited its whole 5 s
// before killing unfrozen tasks.
TEST_F(CgroupV1Test, KillAllAsksAgainForAFreezeLeftUnderWay) {
  ASSERT_TRUE(m_.create("sb1", {}));
  for (const auto& d : m_.dirs("sb1")) f_.files[d + "/cgroup.procs"] = "11\n";
  const std::string fz = "/sys/fs/cgroup/freezer/tidepool/sb1/freezer.state";
  int asked = 0;
  std::string state_at_kill;
  f_.on_write = [&](const std::string& p, const std::string& d) {
    if (p == fz && d == "FROZEN" && ++asked == 1) f_.files[fz] = "FREEZING\n";
  };
  f_.on_kill = [&](pid_t) {
    state_at_kill = f_.files[fz];
    for (const auto& d : m_.dirs("sb1")) f_.files[d + "/cgroup.procs"] = "";
  };
  ASSERT_TRUE(m_.kill_all("sb1"));
  EXPECT_EQ(asked, 2);
  EXPECT_EQ(state_at_kill, "FROZEN");
  EXPECT_LT(f_.pauses, 1000);  // polls of 1 ms: well before the 5 s limit
  EXPECT_EQ(f_.written(fz), "THAWED");
}

TEST_F(CgroupV1Test, KillAllReportsProcessesThatDoNotDie) {
  ASSERT_TRUE(m_.create("sb1", {}));
  for (const auto& d : m_.dirs("sb1")) f_.files[d + "/cgroup.procs"] = "11\n";
  f_.files["/sys/fs/cgroup/freezer/tidepool/sb1/freezer.state"] = "FROZEN\n";
  auto r = m_.kill_all("sb1");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kUnavailable);
  EXPECT_FALSE(m_.remove("sb1"));  // still busy
}

TEST_F(CgroupV1Test, RemoveIsIdempotentAndRetriesBusy) {
  ASSERT_TRUE(m_.create("sb1", {}));
  f_.busy_dirs.insert("/sys/fs/cgroup/memory/tidepool/sb1");
  ASSERT_TRUE(m_.remove("sb1"));
  ASSERT_TRUE(m_.remove("sb1"));
  ASSERT_TRUE(m_.kill_all("sb1"));  // nothing there: fine
  EXPECT_TRUE(m_.list().empty());
}

TEST_F(CgroupV1Test, ListUnionsHierarchies) {
  ASSERT_TRUE(m_.create("a", {}));
  // A half-removed leftover present in one controller only still counts.
  f_.dirs.insert("/sys/fs/cgroup/pids/tidepool/b");
  EXPECT_EQ(m_.list(), (std::vector<std::string>{"a", "b"}));
  ASSERT_TRUE(m_.remove("b"));
  EXPECT_EQ(m_.list(), (std::vector<std::string>{"a"}));
}

TEST_F(CgroupV1Test, DelegatesTheFreezerCgroup) {
  EXPECT_EQ(m_.delegated_dir("sb1"), "/sys/fs/cgroup/freezer/tidepool/sb1");
  EXPECT_EQ(m_.delegated_files(),
            (std::vector<std::string>{"cgroup.procs", "tasks", "freezer.state"}));
  CgroupLayout no_freezer = layout_;
  no_freezer.v1_mounts.erase("freezer");
  CgroupManager m(f_, no_freezer, "tidepool");
  EXPECT_EQ(m.delegated_dir("sb1"), "");
}

TEST_F(CgroupV1Test, RemoveTakesCommandCgroupsFirst) {
  ASSERT_TRUE(m_.create("sb1", {}));
  const std::string fz = "/sys/fs/cgroup/freezer/tidepool/sb1";
  ASSERT_TRUE(f_.mkdir(fz + "/c3", 0755));
  ASSERT_TRUE(f_.mkdir(fz + "/c3/deeper", 0755));
  f_.listings = 0;
  ASSERT_TRUE(m_.remove("sb1"));
  // Only the hierarchy with sub-cgroups was listed (its three levels), none of the others.
  EXPECT_EQ(f_.listings, 3);
  EXPECT_FALSE(f_.dirs.contains(fz + "/c3"));
  EXPECT_FALSE(f_.dirs.contains(fz));
  EXPECT_TRUE(m_.list().empty());
}

TEST_F(CgroupV1Test, KillAllThawsCommandCgroups) {
  ASSERT_TRUE(m_.create("sb1", {}));
  const std::string fz = "/sys/fs/cgroup/freezer/tidepool/sb1";
  ASSERT_TRUE(f_.mkdir(fz + "/c3", 0755));
  f_.files[fz + "/freezer.state"] = "FROZEN\n";
  ASSERT_TRUE(m_.kill_all("sb1"));
  EXPECT_EQ(f_.written(fz + "/c3/freezer.state"), "THAWED");
  f_.writes.clear();
  m_.thaw_subtree("sb1");
  EXPECT_EQ(f_.written(fz + "/c3/freezer.state"), "THAWED");
  EXPECT_EQ(f_.written(fz + "/freezer.state"), "<unwritten>");  // only the agent's cgroups
}

// A freeze under way counts as asked for: a daemon killed while the kernel still said
// FREEZING leaves the sandbox so, and the next one must thaw it to reach its agent.
TEST_F(CgroupV1Test, AFreezeUnderWayCountsAsAskedForButNotAsFrozen) {
  ASSERT_TRUE(m_.create("sb1", {}));
  const std::string st = "/sys/fs/cgroup/freezer/tidepool/sb1/freezer.state";
  for (const auto& [state, asked, frozen] :
       {std::tuple{"THAWED\n", false, false}, std::tuple{"FREEZING\n", true, false},
        std::tuple{"FROZEN\n", true, true}}) {
    f_.files[st] = state;
    auto r = freeze_requested(f_, m_, "sb1");
    ASSERT_TRUE(r) << r.error().message();
    EXPECT_EQ(*r, asked) << state;
    auto z = is_frozen(f_, m_, "sb1");
    ASSERT_TRUE(z) << z.error().message();
    EXPECT_EQ(*z, frozen) << state;
  }
  f_.files.erase(st);
  EXPECT_FALSE(freeze_requested(f_, m_, "sb1"));  // unreadable: an error, not "thawed"
}

class CgroupV2Test : public ::testing::Test {
 protected:
  void SetUp() override {
    f_.dirs.insert("/cg");
    f_.files["/cg/cgroup.subtree_control"] = "";
    f_.auto_files = {"cgroup.procs", "cgroup.kill",     "cgroup.subtree_control",
                     "memory.max",   "memory.swap.max", "cpu.max",
                     "pids.max"};
    ASSERT_TRUE(m_.init());
  }
  FakeSysApi f_;
  CgroupManager m_{f_, v2_layout(), "tidepool"};
};

TEST_F(CgroupV2Test, InitEnablesControllersTopDown) {
  EXPECT_TRUE(f_.dirs.contains("/cg/tidepool"));
  std::vector<std::string> root, parent;
  for (const auto& [p, d] : f_.writes) {
    if (p == "/cg/cgroup.subtree_control") root.push_back(d);
    if (p == "/cg/tidepool/cgroup.subtree_control") parent.push_back(d);
  }
  EXPECT_EQ(root, (std::vector<std::string>{"+memory", "+pids", "+cpu"}));
  EXPECT_EQ(parent, root);
}

TEST_F(CgroupV2Test, ThreadsCannotEnterAV2Cgroup) {
  EXPECT_FALSE(m_.can_enter_thread());
  ASSERT_TRUE(m_.create("sb1", {}));
  EXPECT_FALSE(m_.enter_thread("sb1"));
}

TEST_F(CgroupV2Test, CreateWritesV2Limits) {
  ASSERT_TRUE(m_.create("sb1", {256ull << 20, 0.25, 32}));
  EXPECT_EQ(f_.written("/cg/tidepool/sb1/memory.max"), std::to_string(256ull << 20));
  EXPECT_EQ(f_.written("/cg/tidepool/sb1/memory.swap.max"), "0");
  EXPECT_EQ(f_.written("/cg/tidepool/sb1/cpu.max"), "25000 100000");
  EXPECT_EQ(f_.written("/cg/tidepool/sb1/pids.max"), "32");
  EXPECT_EQ(m_.dirs("sb1"), std::vector<std::string>{"/cg/tidepool/sb1"});
}

TEST_F(CgroupV2Test, StatsParseV2Files) {
  ASSERT_TRUE(m_.create("sb1", {}));
  const std::string d = "/cg/tidepool/sb1";
  f_.files[d + "/memory.current"] = "4096\n";
  f_.files[d + "/memory.peak"] = "8192\n";
  f_.files[d + "/cpu.stat"] = "usage_usec 777\nuser_usec 700\nsystem_usec 77\n";
  f_.files[d + "/pids.current"] = "2\n";
  f_.files[d + "/memory.events"] = "low 0\nhigh 0\nmax 4\noom 2\noom_kill 1\n";
  auto s = m_.stats("sb1");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->memory_bytes, 4096u);
  EXPECT_EQ(s->memory_peak_bytes, 8192u);
  EXPECT_EQ(s->cpu_usage_us, 777u);
  EXPECT_EQ(s->pids, 2u);
  EXPECT_EQ(s->oom_kills, 1u);
  auto k = m_.oom_kills("sb1");
  ASSERT_TRUE(k);
  EXPECT_EQ(*k, 1u);
}

TEST_F(CgroupV2Test, AFreezeUnderWayCountsAsAskedForButNotAsFrozen) {
  ASSERT_TRUE(m_.create("sb1", {}));
  const std::string d = "/cg/tidepool/sb1";
  f_.files[d + "/cgroup.freeze"] = "1\n";
  f_.files[d + "/cgroup.events"] = "populated 1\nfrozen 0\n";
  EXPECT_EQ(freeze_requested(f_, m_, "sb1").value_or(false), true);
  EXPECT_EQ(is_frozen(f_, m_, "sb1").value_or(true), false);
  f_.files[d + "/cgroup.events"] = "populated 1\nfrozen 1\n";
  EXPECT_EQ(is_frozen(f_, m_, "sb1").value_or(false), true);
  f_.files[d + "/cgroup.freeze"] = "0\n";
  EXPECT_EQ(freeze_requested(f_, m_, "sb1").value_or(true), false);
}

TEST_F(CgroupV2Test, KillAllUsesCgroupKill) {
  ASSERT_TRUE(m_.create("sb1", {}));
  ASSERT_TRUE(m_.kill_all("sb1"));
  EXPECT_EQ(f_.written("/cg/tidepool/sb1/cgroup.kill"), "1");
  EXPECT_TRUE(f_.kills.empty());
  ASSERT_TRUE(m_.remove("sb1"));
  EXPECT_FALSE(f_.dirs.contains("/cg/tidepool/sb1"));
}

TEST_F(CgroupV2Test, DelegatesTheSandboxCgroup) {
  EXPECT_EQ(m_.delegated_dir("sb1"), "/cg/tidepool/sb1");
  EXPECT_EQ(m_.delegated_files(),
            (std::vector<std::string>{"cgroup.procs", "cgroup.subtree_control", "cgroup.threads",
                                      "cgroup.kill"}));
}

TEST_F(CgroupV2Test, ProcsEmptyAndRemoveCoverCommandCgroups) {
  ASSERT_TRUE(m_.create("sb1", {}));
  const std::string d = "/cg/tidepool/sb1";
  ASSERT_TRUE(f_.mkdir(d + "/c1", 0755));
  f_.files[d + "/cgroup.procs"] = "7\n";
  f_.files[d + "/c1/cgroup.procs"] = "42\n";
  auto p = m_.procs("sb1");
  ASSERT_TRUE(p);
  EXPECT_EQ(*p, (std::vector<pid_t>{7, 42}));
  f_.files[d + "/cgroup.procs"] = "";
  // A member of the command cgroup alone keeps the sandbox from being empty.
  auto k = m_.kill_all("sb1");
  ASSERT_FALSE(k);
  EXPECT_EQ(k.error().code, Code::kUnavailable);
  f_.files[d + "/c1/cgroup.procs"] = "";
  ASSERT_TRUE(m_.kill_all("sb1"));
  ASSERT_TRUE(m_.remove("sb1"));
  EXPECT_FALSE(f_.dirs.contains(d + "/c1"));
  EXPECT_FALSE(f_.dirs.contains(d));
}

TEST(KeyedValueTest, FindsExactKeys) {
  EXPECT_EQ(keyed_value("oom 2\noom_kill 5\n", "oom_kill"), 5u);
  EXPECT_EQ(keyed_value("oom 2\noom_kill 5\n", "oom"), 2u);
  EXPECT_EQ(keyed_value("", "oom"), 0u);
}

}  // namespace
}  // namespace tp::sys
