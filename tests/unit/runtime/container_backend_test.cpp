// Real tests of the container backend: need root, cgroups and user namespaces;
// they skip otherwise. They use the static fake agent (tests/payloads/fake_agent.c).
#include "runtime/container/container_backend.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "common/ids.h"
#include "image/image_store.h"
#include "protocol/wire.h"
#include "runtime/container/run_state.h"
#include "runtime/container/spawner_client.h"
#include "runtime/sandbox_state.h"
#include "sys/cgroup.h"
#include "sys/fd.h"

namespace tp::runtime {
namespace {

namespace fs = std::filesystem;

std::string slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string fake_agent_path() {
  if (const char* b = getenv("TP_BIN_DIR")) {
    std::string p = std::string(b) + "/../payloads/fake_agent";
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return (fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "payloads/fake_agent")
      .string();
}

// The spawner: the real tp-agent of this build (the fake agent is exec'd by its children).
std::string spawner_path() {
  if (const char* b = getenv("TP_BIN_DIR")) return std::string(b) + "/tp-agent";
  return (fs::read_symlink("/proc/self/exe").parent_path() / "tp-agent").string();
}

int count_fds() {
  int n = 0;
  for (auto& e : fs::directory_iterator("/proc/self/fd")) (void)e, ++n;
  return n;
}

// Reads bytes from the agent fd with a timeout.
std::string read_some(int fd, size_t want, int timeout_ms = 5000) {
  std::string out;
  while (out.size() < want) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) break;
    char buf[256];
    ssize_t n = read(fd, buf, std::min(sizeof buf, want - out.size()));
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

bool wait_ready(int fd) {
  std::string hdr = read_some(fd, 4);
  if (hdr.size() != 4) return false;
  uint32_t len = static_cast<uint8_t>(hdr[0]) | static_cast<uint8_t>(hdr[1]) << 8 |
                 static_cast<uint8_t>(hdr[2]) << 16 |
                 static_cast<uint32_t>(static_cast<uint8_t>(hdr[3])) << 24;
  std::string rest = read_some(fd, len);
  proto::FrameReader r;
  r.feed(hdr.data(), hdr.size());
  r.feed(rest.data(), rest.size());
  auto m = r.next();
  return m && m->type == proto::MsgType::kReady && m->u64(proto::Tag::kVersion) == 1;
}

// Runs a shell line through the fake agent; returns its exit status.
int run(SandboxInstance& sb, const std::string& cmd) {
  std::string line = cmd + "\n";
  if (write(sb.agent_fd(), line.data(), line.size()) != static_cast<ssize_t>(line.size()))
    return -1;
  std::string ans;
  while (ans.find('\n') == std::string::npos) {
    std::string s = read_some(sb.agent_fd(), 1, 20000);
    if (s.empty()) return -2;
    ans += s;
  }
  if (!ans.starts_with("exit ")) return -3;
  return std::atoi(ans.c_str() + 5);
}

// Exit status of a command that must have run (an agent failure is not a "non-zero exit").
int status_of(SandboxInstance& sb, const std::string& cmd) {
  int st = run(sb, cmd);
  EXPECT_GE(st, 0) << "agent did not answer for: " << cmd;
  return st;
}

// The layer store as the backend sees it: digest -> directory, counting calls.
class FakeLayers : public image::LayerResolver {
 public:
  Result<std::string> layer_dir(const std::string& digest) override {
    std::lock_guard lk(mu);
    ++calls;
    if (!image::valid_layer_digest(digest))
      return fail(Code::kInvalidArgument, "invalid layer digest '" + digest + "'");
    auto it = dirs.find(digest);
    if (it == dirs.end()) return fail(Code::kNotFound, "layer " + digest + " not found");
    return it->second;
  }
  // A digest for a directory (made up: the backend never looks inside digests).
  std::string add(const std::string& dir) {
    std::lock_guard lk(mu);
    std::string d = "sha256:" + std::string(64, static_cast<char>('a' + dirs.size()));
    dirs[d] = dir;
    return d;
  }
  std::mutex mu;
  std::map<std::string, std::string> dirs;
  int calls = 0;
};

class ContainerBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root";
    if (access("/proc/self/ns/user", F_OK) != 0) GTEST_SKIP() << "no user namespaces";
    char tmpl[] = "/tmp/tp-ct-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    chmod(dir_.c_str(), 0755);
    opts_.data_dir = dir_;
    opts_.agent_path = fake_agent_path();
    opts_.spawner_path = spawner_path();
    opts_.cgroup_name = "tp-test-" + ids::random_hex(4);
    layers_ = std::make_shared<FakeLayers>();
    opts_.layers = layers_;
    auto layout = sys::detect_layout(sys::real_sys());
    ASSERT_TRUE(layout) << layout.error().message();
    cg_ = std::make_unique<sys::CgroupManager>(sys::real_sys(), *layout, opts_.cgroup_name);
    auto b = make_container_backend(opts_);
    ASSERT_TRUE(b) << b.error().message();
    backend_ = std::move(*b);
    fds_before_ = count_fds();
  }
  void TearDown() override {
    backend_.reset();
    if (cg_) {
      EXPECT_TRUE(cg_->list().empty());
      for (const auto& d : cg_->dirs("x")) rmdir(fs::path(d).parent_path().c_str());
    }
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  SandboxSpec spec(const std::string& id = {}) {
    SandboxSpec s;
    s.id = id.empty() ? "t-" + ids::random_hex(6) : id;
    s.memory_bytes = 256ull << 20;
    s.disk_bytes = 32ull << 20;
    s.tmp_bytes = 16ull << 20;
    s.cpus = 0.5;
    s.pids_max = 100;
    s.nofile = 1024;
    return s;
  }

  void expect_gone(const std::string& id, pid_t pid) {
    EXPECT_EQ(kill(pid, 0), -1);
    EXPECT_EQ(errno, ESRCH);
    for (const auto& d : cg_->dirs(id)) EXPECT_FALSE(fs::exists(d)) << d;
    EXPECT_EQ(slurp("/proc/self/mountinfo").find(dir_), std::string::npos);
  }

  std::string dir_;
  std::shared_ptr<FakeLayers> layers_;
  ContainerOptions opts_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<sys::CgroupManager> cg_;
  int fds_before_ = 0;
};

TEST_F(ContainerBackendTest, CreateIsolatesAndDestroyLeavesNothing) {
  auto s = spec();
  s.env["FOO"] = "bar";
  auto r = backend_->create(s);
  ASSERT_TRUE(r) << r.error().message();
  auto& sb = **r;
  pid_t pid = sb.pid();
  ASSERT_TRUE(wait_ready(sb.agent_fd()));
  EXPECT_TRUE(sb.alive());
  EXPECT_EQ(sb.id(), s.id);

  for (const char* ns : {"user", "mnt", "pid", "uts", "ipc", "net", "cgroup"}) {
    auto mine = fs::read_symlink(std::string("/proc/self/ns/") + ns);
    auto theirs = fs::read_symlink("/proc/" + std::to_string(pid) + "/ns/" + ns);
    EXPECT_NE(mine, theirs) << ns;
  }
  std::string map = slurp("/proc/" + std::to_string(pid) + "/uid_map");
  std::istringstream ms(map);
  uint64_t in = 9, out = 0, count = 0;
  ms >> in >> out >> count;
  EXPECT_EQ(in, 0u);
  EXPECT_EQ(out, opts_.uid_base);
  EXPECT_EQ(count, 65536u);
  std::string status = slurp("/proc/" + std::to_string(pid) + "/status");
  EXPECT_NE(status.find("Seccomp:\t2"), std::string::npos);
  EXPECT_NE(status.find("NoNewPrivs:\t1"), std::string::npos);
  EXPECT_NE(status.find("Uid:\t100000\t100000"), std::string::npos);

  // Root: the overlay, without host secrets.
  std::string root = "/proc/" + std::to_string(pid) + "/root";
  EXPECT_FALSE(fs::exists(root + "/etc/shadow"));
  EXPECT_FALSE(fs::exists(root + "/etc/gshadow"));
  EXPECT_FALSE(fs::exists(root + "/etc/ssl/private"));
  EXPECT_TRUE(fs::is_empty(root + "/root"));
  EXPECT_TRUE(fs::is_empty(root + "/home"));
  EXPECT_TRUE(fs::exists(root + "/usr/bin/sh"));
  EXPECT_EQ(slurp(root + "/etc/passwd").find("daemon:"), std::string::npos);

  // Cgroup limits.
  const auto& l = cg_->layout();
  if (l.version == sys::CgroupVersion::kV1) {
    std::string mem = l.v1_mounts.at("memory") + "/" + opts_.cgroup_name + "/" + s.id;
    EXPECT_EQ(std::stoull(slurp(mem + "/memory.limit_in_bytes")), s.memory_bytes);
    EXPECT_NE(slurp(mem + "/cgroup.procs").find(std::to_string(pid)), std::string::npos);
    std::string pids = l.v1_mounts.at("pids") + "/" + opts_.cgroup_name + "/" + s.id;
    EXPECT_EQ(std::stoull(slurp(pids + "/pids.max")), 100u);
    std::string cpu = l.v1_mounts.at("cpu") + "/" + opts_.cgroup_name + "/" + s.id;
    EXPECT_EQ(std::stoull(slurp(cpu + "/cpu.cfs_quota_us")), 50000u);
  } else {
    std::string d = l.v2_root + "/" + opts_.cgroup_name + "/" + s.id;
    EXPECT_EQ(std::stoull(slurp(d + "/memory.max")), s.memory_bytes);
    EXPECT_EQ(std::stoull(slurp(d + "/pids.max")), 100u);
  }
  std::string limits = slurp("/proc/" + std::to_string(pid) + "/limits");
  EXPECT_NE(limits.find("Max open files            1024                 1024"), std::string::npos)
      << limits;

  // From inside.
  EXPECT_EQ(status_of(sb, "exit 3"), 3);
  EXPECT_EQ(status_of(sb, "test \"$(id -u)\" = 0"), 0);
  EXPECT_EQ(status_of(sb, "test \"$(cat /proc/sys/kernel/hostname)\" = " + s.id), 0);
  EXPECT_EQ(status_of(sb, "test \"$FOO\" = bar && test \"$HOME\" = /root"), 0);
  EXPECT_EQ(status_of(sb, "test $$ -gt 1 && test -r /proc/1/status"), 0);
  // Loopback is up and is the only interface.
  EXPECT_EQ(
      status_of(
          sb,
          "/usr/bin/python3 -S -c 'import socket; s = socket.socket(); s.bind((\"127.0.0.1\", 0)); "
          "s.listen(); socket.create_connection(s.getsockname())'"),
      0);
  EXPECT_EQ(status_of(sb, "test \"$(grep -c : /proc/net/dev)\" = 1"), 0);
  EXPECT_EQ(status_of(sb, "/usr/bin/python3 -S -c 'import os; assert os.getuid() == 0'"), 0);
  EXPECT_EQ(status_of(sb, "echo 127.0.0.2 x >> /etc/hosts && grep -q 127.0.0.2 /etc/hosts"), 0);
  EXPECT_NE(status_of(sb, "touch /usr/tp-should-fail"), 0);
  EXPECT_NE(status_of(sb, "echo x >> /proc/1/exe"),
            0);  // the agent binary is not writable from inside
  EXPECT_NE(status_of(sb, "echo 1 > /proc/sys/kernel/hostname"), 0);
  EXPECT_EQ(status_of(sb, "test ! -s /proc/kcore && test -c /dev/null && test -e /dev/pts/ptmx"),
            0);
  EXPECT_EQ(status_of(sb, "echo x > /tmp/f && echo x > /dev/shm/f"), 0);
  EXPECT_NE(status_of(sb, "unshare -U true"), 0);
  EXPECT_NE(status_of(sb, "unshare -m true"),
            0);  // would need a fresh mount ns: mount API is refused
  EXPECT_NE(status_of(sb, "mount -t tmpfs none /mnt"), 0);
  EXPECT_NE(status_of(sb, "dd if=/dev/zero of=/big bs=1M count=64 2>/dev/null"),
            0);  // disk limit 32 MiB
  EXPECT_FALSE(fs::exists(root + "/../../" + dir_ + "/containers/mnt/upper"));

  auto u = sb.usage();
  ASSERT_TRUE(u) << u.error().message();
  EXPECT_GT(u->memory_bytes, 0u);
  EXPECT_GE(u->pids, 1u);
  EXPECT_GE(u->memory_peak_bytes, u->memory_bytes);

  ASSERT_TRUE(sb.destroy());
  ASSERT_TRUE(sb.destroy());  // idempotent
  EXPECT_FALSE(sb.alive());
  expect_gone(s.id, pid);
  r->reset();
  EXPECT_EQ(count_fds(), fds_before_);
}

// A sandbox with a uid range of its own (SandboxSpec::uid_base) runs as that
// range on the host, owns its namespace and cgroup as that range's root, and sees
// the image files (stored as opts_.uid_base + N) through idmapped layers as N.
// A daemon with many sandboxes holds more descriptors than a sandbox's
// RLIMIT_NOFILE: the child inherits them, so the limit must come after it has
// moved what the agent needs (at 1024 it once failed every create past ~330
// sandboxes with EMFILE from F_DUPFD_CLOEXEC).
TEST_F(ContainerBackendTest, ALowFileLimitHoldsWhenTheDaemonHasManyDescriptors) {
  rlimit rl{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
  if (rl.rlim_max < 400) GTEST_SKIP() << "hard RLIMIT_NOFILE " << rl.rlim_max;
  rlimit raised{rl.rlim_max, rl.rlim_max};
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &raised), 0);
  std::vector<int> held;
  for (int i = 0; i < 300; ++i) held.push_back(dup(0));  // every number below 300 taken
  auto s = spec();
  s.nofile = 256;
  auto r = backend_->create(s);
  for (int fd : held) close(fd);
  setrlimit(RLIMIT_NOFILE, &rl);
  ASSERT_TRUE(r) << r.error().message();
  ASSERT_TRUE(wait_ready((*r)->agent_fd()));
  EXPECT_NE(slurp("/proc/" + std::to_string((*r)->pid()) + "/limits")
                .find("Max open files            256"),
            std::string::npos);
  ASSERT_TRUE((*r)->destroy());
}

TEST_F(ContainerBackendTest, OwnRangeMapsRootAndIdmapsTheLayers) {
  const uint32_t bases[] = {(1u << 20) + 7 * 65536, (1u << 20) + 9 * 65536};
  std::vector<std::unique_ptr<SandboxInstance>> sbs;
  for (uint32_t base : bases) {
    auto s = spec();
    s.uid_base = base;
    auto r = backend_->create(s);
    ASSERT_TRUE(r) << r.error().message();
    ASSERT_TRUE(wait_ready((*r)->agent_fd()));
    sbs.push_back(std::move(*r));
  }
  for (size_t i = 0; i < sbs.size(); ++i) {
    auto& sb = *sbs[i];
    const std::string b = std::to_string(bases[i]);
    const std::string proc = "/proc/" + std::to_string(sb.pid());
    std::istringstream ms(slurp(proc + "/uid_map"));
    uint64_t in = 9, out = 0, count = 0;
    ms >> in >> out >> count;
    EXPECT_EQ(out, bases[i]);
    EXPECT_EQ(count, 65536u);
    EXPECT_NE(slurp(proc + "/status").find("Uid:\t" + b + "\t" + b + "\t" + b + "\t" + b),
              std::string::npos);
    EXPECT_NE(slurp(proc + "/status").find("Gid:\t" + b + "\t" + b), std::string::npos);
    const std::string dir = cg_->delegated_dir(sb.id());
    struct stat st {};
    if (!dir.empty() && stat(dir.c_str(), &st) == 0) {
      EXPECT_EQ(st.st_uid, bases[i]);
    }
    // The skeleton's files are root's inside, and copy-up writes them.
    EXPECT_EQ(status_of(sb,
                        "test \"$(stat -c %u:%g /etc/passwd /etc /root)\" = "
                        "\"$(printf '0:0\\n0:0\\n0:0')\""),
              0);
    EXPECT_EQ(
        status_of(sb, "echo 127.0.0.3 y >> /etc/hosts && test \"$(stat -c %u /etc/hosts)\" = 0"),
        0);
    EXPECT_EQ(status_of(sb,
                        "echo z > /root/own && chown 1000:1000 /root/own && test \"$(stat -c "
                        "%u /root/own)\" = 1000"),
              0);
  }
  // The stored files stay the store's: owner and content.
  struct stat st {};
  ASSERT_EQ(stat((dir_ + "/images/host/rootfs/etc/passwd").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, opts_.uid_base);
  EXPECT_EQ(slurp(dir_ + "/images/host/rootfs/etc/hosts").find("127.0.0.3"), std::string::npos);
  for (auto& sb : sbs) {
    pid_t pid = sb->pid();
    std::string id = sb->id();
    ASSERT_TRUE(sb->destroy());
    expect_gone(id, pid);
  }
  sbs.clear();
  // The idmap of a range is made once: creating in it again leaks no fd.
  const int fds = count_fds();
  for (int i = 0; i < 2; ++i) {
    auto s = spec();
    s.uid_base = bases[0];
    auto r = backend_->create(s);
    ASSERT_TRUE(r) << r.error().message();
    ASSERT_TRUE((*r)->destroy());
  }
  EXPECT_EQ(count_fds(), fds);
}

// Creates in their own ranges at once: each makes an idmap namespace through a
// helper child, and no helper may keep another's pipe open (they waited for each
// other forever once).
TEST_F(ContainerBackendTest, ConcurrentCreatesInOwnRangesAllStart) {
  constexpr int kN = 8;
  std::vector<std::future<Result<std::unique_ptr<SandboxInstance>>>> made;
  for (int i = 0; i < kN; ++i) {
    auto s = spec();
    s.uid_base = (1u << 20) + static_cast<uint32_t>(20 + i) * 65536;
    made.push_back(std::async(std::launch::async, [this, s] { return backend_->create(s); }));
  }
  std::vector<std::unique_ptr<SandboxInstance>> sbs;
  for (auto& f : made) {
    // A deadlock guard, not a timing threshold.
    if (f.wait_for(std::chrono::seconds(120)) != std::future_status::ready) {
      ADD_FAILURE() << "a create never returned";
      std::abort();
    }
    auto r = f.get();
    ASSERT_TRUE(r) << r.error().message();
    sbs.push_back(std::move(*r));
  }
  for (auto& sb : sbs) EXPECT_TRUE(wait_ready(sb->agent_fd()));
  for (auto& sb : sbs) EXPECT_TRUE(sb->destroy());
}

// The sandbox's cgroup directory (v2; v1: the freezer's) is delegated to the
// sandbox's root and reaches the agent as fd 4, named by --cgroup-fd 4.
TEST_F(ContainerBackendTest, CgroupIsDelegatedToTheSandboxRoot) {
  auto s = spec();
  auto r = backend_->create(s);
  ASSERT_TRUE(r) << r.error().message();
  pid_t pid = (*r)->pid();
  const std::string dir = cg_->delegated_dir(s.id);
  ASSERT_FALSE(dir.empty()) << "no freezer hierarchy: the agent falls back to process groups";
  struct stat st {};
  ASSERT_EQ(stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, opts_.uid_base);
  EXPECT_EQ(st.st_gid, opts_.uid_base);
  int owned = 0;
  for (const auto& f : cg_->delegated_files()) {
    if (stat((dir + "/" + f).c_str(), &st) != 0) continue;  // e.g. no cgroup.kill before 5.14
    EXPECT_EQ(st.st_uid, opts_.uid_base) << f;
    ++owned;
  }
  EXPECT_GE(owned, 3);
  // Nothing else is handed over (e.g. the limits).
  const bool v2 = cg_->layout().version == sys::CgroupVersion::kV2;
  if (stat((dir + (v2 ? "/pids.max" : "/freezer.self_freezing")).c_str(), &st) == 0) {
    EXPECT_EQ(st.st_uid, 0u);
  }
  EXPECT_NE(
      slurp("/proc/" + std::to_string(pid) + "/cmdline").find(std::string("--cgroup-fd\0004", 13)),
      std::string::npos);
  std::error_code ec;
  EXPECT_EQ(fs::read_symlink("/proc/" + std::to_string(pid) + "/fd/4", ec).string(), dir);
  // A sub-cgroup left behind (an agent killed mid-command) does not keep destroy from removing it
  // all.
  ASSERT_EQ(mkdir((dir + "/c1").c_str(), 0755), 0);
  ASSERT_TRUE((*r)->destroy());
  expect_gone(s.id, pid);
  r->reset();
}

TEST_F(ContainerBackendTest, MemoryAndPidLimitsHold) {
  auto s = spec();
  s.memory_bytes = 64ull << 20;
  s.pids_max = 16;
  auto r = backend_->create(s);
  ASSERT_TRUE(r) << r.error().message();
  auto& sb = **r;
  ASSERT_TRUE(wait_ready(sb.agent_fd()));
  // 200 MiB in a 64 MiB sandbox without swap: the OOM killer takes the hog, not the sandbox.
  EXPECT_EQ(
      status_of(
          sb,
          "/usr/bin/python3 -S -c 'b = bytearray(200 << 20); b[::4096] = b\"x\" * len(b[::4096])'"),
      137);
  auto u = sb.usage();
  ASSERT_TRUE(u);
  EXPECT_GE(u->oom_kills, 1u);
  EXPECT_LE(u->memory_peak_bytes, s.memory_bytes);
  // 20 sleepers in a 16-task sandbox: some forks fail, the agent survives.
  EXPECT_NE(status_of(sb, "for i in $(seq 20); do sleep 1 & done; wait"), -1);
  EXPECT_EQ(status_of(sb, "true"), 0);
  EXPECT_TRUE(sb.alive());
  ASSERT_TRUE(sb.destroy());
}

// What other tiers ask of a container sandbox reaches it through the spawner's plan: a
// best-effort sandbox (its init and so all of its processes under SCHED_IDLE, the lowest
// CPU weight) and one with nested isolation (the function tier's workers: the mount API
// open to its root, its memory and pids cgroups delegated), against a default sandbox.
TEST_F(ContainerBackendTest, BestEffortAndNestedIsolationReachTheSandbox) {
  const std::string mount_in_own_ns = "unshare -m sh -c 'mount -t tmpfs none /tmp'";
  auto plain = backend_->create(spec());
  ASSERT_TRUE(plain) << plain.error().message();
  ASSERT_TRUE(wait_ready((*plain)->agent_fd()));
  EXPECT_EQ(sched_getscheduler((*plain)->pid()), SCHED_OTHER);
  EXPECT_NE(status_of(**plain, mount_in_own_ns), 0);  // seccomp refuses mount(2)
  ASSERT_TRUE((*plain)->destroy());

  auto s = spec();
  s.best_effort = true;
  s.nested_isolation = true;
  auto r = backend_->create(s);
  ASSERT_TRUE(r) << r.error().message();
  auto& sb = **r;
  ASSERT_TRUE(wait_ready(sb.agent_fd()));
  EXPECT_EQ(sched_getscheduler(sb.pid()), SCHED_IDLE);
  EXPECT_EQ(status_of(sb, "test \"$(cut -d' ' -f41 /proc/self/stat)\" = 5"), 0)
      << "a command is not SCHED_IDLE (policy 5) too";
  EXPECT_EQ(status_of(sb, mount_in_own_ns), 0);
  const bool v2 = cg_->layout().version == sys::CgroupVersion::kV2;
  for (const auto& d : cg_->limit_dirs(s.id)) {
    struct stat st {};
    ASSERT_EQ(stat(d.c_str(), &st), 0) << d;
    EXPECT_EQ(st.st_uid, opts_.uid_base) << d;
  }
  // The lowest CPU weight: an idle cpu cgroup where the kernel has them (5.15+; its
  // weight is then the kernel's own lowest), else v1 cpu.shares 2, v2 cpu.weight 1
  // (where the controller is on).
  int weights = 0;
  for (const auto& d : cg_->dirs(s.id)) {
    for (const auto& [file, lowest] :
         {std::pair{"/cpu.idle", "1\n"}, {"/cpu.shares", "2\n"}, {"/cpu.weight", "1\n"}}) {
      if (!fs::exists(d + file)) continue;
      EXPECT_EQ(slurp(d + file), lowest) << d;
      ++weights;
      break;
    }
  }
  if (!v2) {
    EXPECT_EQ(weights, 1);
  }
  const pid_t pid = sb.pid();
  ASSERT_TRUE(sb.destroy());
  expect_gone(s.id, pid);
}

TEST_F(ContainerBackendTest, InvalidSpecsAreRefusedBeforeAnything) {
  auto bad_id = spec("../etc");
  auto r = backend_->create(bad_id);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kInvalidArgument);
  auto bad_env = spec();
  bad_env.env["A=B"] = "x";
  EXPECT_FALSE(backend_->create(bad_env));
  // A spec names layers by digest: a host path is not one.
  auto bad_layer = spec();
  bad_layer.image = "custom";
  bad_layer.layers = {"/tmp/a,upperdir=/x"};
  r = backend_->create(bad_layer);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kInvalidArgument);
  // Nor does the resolver's answer reach overlay's option string unchecked.
  auto odd = spec();
  odd.image = "custom";
  odd.layers = {layers_->add("/tmp/a,upperdir=/x")};
  r = backend_->create(odd);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kInvalidArgument);
  // An image other than host needs layers.
  auto none = spec();
  none.image = "custom";
  EXPECT_EQ(backend_->create(none).error().code, Code::kInvalidArgument);
  EXPECT_TRUE(cg_->list().empty());
}

TEST_F(ContainerBackendTest, UnknownLayerDigestIsNotFoundBeforeAnything) {
  std::string lower = dir_ + "/l0";
  fs::create_directories(lower);
  auto s = spec();
  s.image = "custom";
  const std::string unknown = "sha256:" + std::string(64, '0');
  s.layers = {layers_->add(lower), unknown};
  auto r = backend_->create(s);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kNotFound);
  EXPECT_NE(r.error().message().find(unknown), std::string::npos) << r.error().message();
  for (const auto& d : cg_->dirs(s.id)) EXPECT_FALSE(fs::exists(d));
  EXPECT_FALSE(fs::exists(dir_ + "/containers/run/" + s.id + ".sock"));
  EXPECT_EQ(count_fds(), fds_before_);
  // A stored digest whose directory vanished: also not found, also nothing left.
  s.layers = {layers_->add(dir_ + "/no-such-layer")};
  r = backend_->create(s);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kNotFound);
  EXPECT_NE(r.error().message().find("no-such-layer"), std::string::npos);
  for (const auto& d : cg_->dirs(s.id)) EXPECT_FALSE(fs::exists(d));
  EXPECT_EQ(count_fds(), fds_before_);
}

TEST_F(ContainerBackendTest, WithoutALayerStoreOnlyTheHostImageRuns) {
  ContainerOptions o = opts_;
  o.layers = nullptr;
  auto b = make_container_backend(o);
  ASSERT_TRUE(b) << b.error().message();
  auto s = spec();
  s.image = "custom";
  s.layers = {"sha256:" + std::string(64, '1')};
  auto r = (*b)->create(s);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kNotFound);
  auto host = (*b)->create(spec());
  ASSERT_TRUE(host) << host.error().message();
  EXPECT_TRUE(wait_ready((*host)->agent_fd()));
  ASSERT_TRUE((*host)->destroy());
}

TEST_F(ContainerBackendTest, ChildSetupFailureNamesTheStepAndUnwinds) {
  // A layer the sandbox's (unprivileged) root cannot reach: the overlay mount in the child fails.
  std::string hidden = dir_ + "/hidden";
  ASSERT_EQ(mkdir(hidden.c_str(), 0700), 0);
  ASSERT_EQ(mkdir((hidden + "/layer").c_str(), 0755), 0);
  auto s = spec();
  s.image = "custom";
  s.layers = {layers_->add(hidden + "/layer")};
  auto r = backend_->create(s);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().context.find("mount(overlay"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().sys_errno, 0);
  for (const auto& d : cg_->dirs(s.id)) EXPECT_FALSE(fs::exists(d));
  EXPECT_EQ(count_fds(), fds_before_);
  // A second create with the same id works: nothing was left behind.
  auto ok = backend_->create(spec(s.id));
  ASSERT_TRUE(ok) << ok.error().message();
  EXPECT_TRUE(wait_ready((*ok)->agent_fd()));
}

TEST_F(ContainerBackendTest, LayerImage) {
  // A tiny image made of two layers: busybox in the lower, a file in the upper.
  std::string lower = dir_ + "/l0", upper = dir_ + "/l1";
  if (access("/bin/busybox", X_OK) != 0) GTEST_SKIP() << "no /bin/busybox";
  fs::create_directories(lower + "/bin");
  fs::create_directories(upper + "/etc");
  fs::copy_file("/bin/busybox", lower + "/bin/busybox");
  fs::create_symlink("busybox", lower + "/bin/sh");
  std::ofstream(upper + "/etc/marker") << "top\n";
  auto s = spec();
  s.image = "custom";
  s.layers = {layers_->add(upper), layers_->add(lower)};  // digests, top first
  int calls = layers_->calls;
  auto r = backend_->create(s);
  EXPECT_EQ(layers_->calls - calls, 2);
  ASSERT_TRUE(r) << r.error().message();
  ASSERT_TRUE(wait_ready((*r)->agent_fd()));
  EXPECT_EQ(
      run(**r, "/bin/busybox grep -q top /etc/marker && ! /bin/busybox test -e /usr/bin/python3"),
      0);
}

TEST_F(ContainerBackendTest, TwentyInARowLeakNothing) {
  std::vector<std::unique_ptr<SandboxInstance>> v;
  std::vector<std::pair<std::string, pid_t>> ids;
  for (int i = 0; i < 20; ++i) {
    auto r = backend_->create(spec());
    ASSERT_TRUE(r) << r.error().message();
    ids.emplace_back((*r)->id(), (*r)->pid());
    v.push_back(std::move(*r));
  }
  for (auto& sb : v) EXPECT_TRUE(wait_ready(sb->agent_fd()));
  for (auto& sb : v) ASSERT_TRUE(sb->destroy());
  v.clear();
  for (auto& [id, pid] : ids) expect_gone(id, pid);
  EXPECT_TRUE(cg_->list().empty());
  EXPECT_EQ(count_fds(), fds_before_);
}

TEST_F(ContainerBackendTest, ConcurrentCreatesFromSeveralThreads) {
  std::vector<std::unique_ptr<SandboxInstance>> made[4];
  std::vector<std::string> errors[4];
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < 4; ++i) {
        auto r = backend_->create(spec());
        if (r)
          made[t].push_back(std::move(*r));
        else
          errors[t].push_back(r.error().message());
      }
    });
  for (auto& th : ts) th.join();
  std::vector<std::pair<std::string, pid_t>> ids;
  for (int t = 0; t < 4; ++t) {
    EXPECT_TRUE(errors[t].empty()) << errors[t].front();
    for (auto& sb : made[t]) {
      EXPECT_TRUE(wait_ready(sb->agent_fd()));
      ids.emplace_back(sb->id(), sb->pid());
    }
  }
  EXPECT_EQ(ids.size(), 16u);
  for (auto& v : made) v.clear();  // destructors destroy
  for (auto& [id, pid] : ids) expect_gone(id, pid);
  EXPECT_EQ(count_fds(), fds_before_);
}

// The spawners this process started (one per backend), by their name.
std::vector<pid_t> my_spawners() {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string st = slurp(e.path().string() + "/stat");
    auto open = st.find('('), close = st.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    std::istringstream rest(st.substr(close + 2));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (st.substr(open + 1, close - open - 1) == "tp-spawner" && ppid == getpid() && state != "Z")
      out.push_back(std::stoi(name));
  }
  return out;
}

std::vector<std::string> fd_targets_of(pid_t pid) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec))
    out.push_back(e.path().filename().string() + " " + fs::read_symlink(e.path(), ec).string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST_F(ContainerBackendTest, SpawnerDeathIsRepairedAndItsSandboxesLiveOn) {
  auto a = backend_->create(spec());
  ASSERT_TRUE(a) << a.error().message();
  ASSERT_TRUE(wait_ready((*a)->agent_fd()));
  auto sp = my_spawners();
  ASSERT_EQ(sp.size(), 1u);
  ASSERT_EQ(kill(sp[0], SIGKILL), 0);
  // The sandbox is our child (CLONE_PARENT), not the spawner's: it does not notice.
  for (int i = 0; i < 200 && my_spawners() == sp; ++i) usleep(10000);
  EXPECT_EQ(status_of(**a, "true"), 0);
  EXPECT_TRUE((*a)->alive());
  // The next create finds the spawner gone and starts another.
  auto b = backend_->create(spec());
  ASSERT_TRUE(b) << b.error().message();
  ASSERT_TRUE(wait_ready((*b)->agent_fd()));
  EXPECT_EQ(status_of(**b, "true"), 0);
  auto now = my_spawners();
  ASSERT_EQ(now.size(), 1u);
  EXPECT_NE(now[0], sp[0]);
  ASSERT_TRUE((*a)->destroy());
  ASSERT_TRUE((*b)->destroy());
  a->reset();
  b->reset();
  EXPECT_EQ(count_fds(), fds_before_);  // the dead spawner's socket and pidfd went with it
}

TEST_F(ContainerBackendTest, WedgedSpawnerIsReplacedAndTheCreateLeavesNothing) {
  ContainerOptions o = opts_;
  o.spawner_timeout_ms = 300;
  backend_.reset();
  auto b = make_container_backend(o);
  ASSERT_TRUE(b) << b.error().message();
  backend_ = std::move(*b);
  auto sp = my_spawners();
  ASSERT_EQ(sp.size(), 1u);
  ASSERT_EQ(kill(sp[0], SIGSTOP), 0);
  auto s = spec();
  auto r = backend_->create(s);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kUnavailable) << r.error().message();
  EXPECT_NE(r.error().message().find("spawner"), std::string::npos) << r.error().message();
  for (const auto& d : cg_->dirs(s.id)) EXPECT_FALSE(fs::exists(d)) << d;
  EXPECT_FALSE(fs::exists(dir_ + "/containers/run/" + s.id + ".sock"));
  // The stopped one was killed; a new one serves.
  auto ok = backend_->create(spec());
  ASSERT_TRUE(ok) << ok.error().message();
  ASSERT_TRUE(wait_ready((*ok)->agent_fd()));
  auto now = my_spawners();
  ASSERT_EQ(now.size(), 1u);
  EXPECT_NE(now[0], sp[0]);
  // Killed (a zombie until the next create or the backend's end reaps it).
  std::string st = slurp("/proc/" + std::to_string(sp[0]) + "/stat");
  EXPECT_TRUE(st.empty() || st.substr(st.rfind(')') + 2, 1) == "Z") << st;
  ok->reset();
  backend_.reset();
  EXPECT_EQ(kill(sp[0], 0), -1);  // reaped by now
}

TEST_F(ContainerBackendTest, SandboxInitGetsOnlyItsOwnDescriptors) {
  // Descriptors of the daemon without CLOEXEC, as a careless library would leave them.
  int leak[2];
  ASSERT_EQ(pipe(leak), 0);
  auto r = backend_->create(spec());
  ASSERT_TRUE(r) << r.error().message();
  ASSERT_TRUE(wait_ready((*r)->agent_fd()));
  // The (fake) agent was exec'd with 0..2 on /dev/null, 3 its socket, 4 its cgroup, 5 its
  // listening socket: nothing of the daemon's, of the spawner's or of the setup.
  auto fds = fd_targets_of((*r)->pid());
  ASSERT_EQ(fds.size(), 6u) << ::testing::PrintToString(fds);
  for (const auto& f : fds) EXPECT_EQ(f.find("pipe:"), std::string::npos) << f;
  EXPECT_EQ(fds[0], "0 /dev/null");
  EXPECT_EQ(fds[3].rfind("3 socket:", 0), 0u) << fds[3];
  EXPECT_EQ(fds[5].rfind("5 socket:", 0), 0u) << fds[5];
  // Between starts the spawner holds its stdio and its socket only.
  auto sp = my_spawners();
  ASSERT_EQ(sp.size(), 1u);
  auto spfds = fd_targets_of(sp[0]);
  ASSERT_EQ(spfds.size(), 4u) << ::testing::PrintToString(spfds);
  EXPECT_EQ(spfds[3].rfind("3 socket:", 0), 0u) << spfds[3];
  close(leak[0]);
  close(leak[1]);
}

TEST(SpawnerTest, RefusesAMalformedPlanAndServesOn) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root";
  sys::UniqueFd exe(open(spawner_path().c_str(), O_PATH | O_CLOEXEC));
  ASSERT_TRUE(exe);
  auto s = container::Spawner::start(exe.get(), spawner_path(), std::chrono::milliseconds(5000));
  ASSERT_TRUE(s) << s.error().message();
  const pid_t pid = (*s)->pid();
  ASSERT_GT(pid, 0);
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  auto attempt = [&](uint64_t flags, uint32_t owner) {
    spawn::Request req;
    req.agent_slot = req.slot(sv[1]);
    req.ops = {spawn::Op{spawn::OpKind::kHello}};
    req.argv = {"tp-agent"};
    req.clone_flags = flags;
    req.owner_uid = owner;
    req.uid_map = req.gid_map = "0 100000 65536\n";
    auto st = (*s)->send(std::move(req));
    EXPECT_TRUE(st) << st.error().message();
    return st ? st->finish({"hello"}) : Result<sys::Pidfd>(std::unexpected(st.error()));
  };
  // No user namespace: as root in the host's namespaces it would be host root. Refused.
  auto r = attempt(CLONE_NEWNS | CLONE_NEWPID, 100000);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kInvalidArgument) << r.error().message();
  EXPECT_NE(r.error().message().find("refused"), std::string::npos) << r.error().message();
  // A user namespace owned by host root: refused too.
  r = attempt(CLONE_NEWUSER | CLONE_NEWNS, 0);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Code::kInvalidArgument);
  // The same spawner, still serving.
  EXPECT_EQ((*s)->pid(), pid);
  EXPECT_EQ((*s)->started(), 1u);
  close(sv[0]);
  close(sv[1]);
}

TEST_F(ContainerBackendTest, CleanupOrphansKillsAllButKept) {
  auto a = backend_->create(spec());
  auto b = backend_->create(spec());
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(wait_ready((*a)->agent_fd()));
  ASSERT_TRUE(wait_ready((*b)->agent_fd()));
  // Simulate a daemon restart for `a`: forget the instance without destroying it.
  SandboxInstance* lost = a->release();
  pid_t lost_pid = lost->pid();
  std::string lost_id = lost->id();
  auto cleaned = backend_->cleanup_orphans({(*b)->id()});
  ASSERT_EQ(cleaned.size(), 1u);
  EXPECT_EQ(cleaned[0], lost_id);
  for (const auto& d : cg_->dirs(lost_id)) EXPECT_FALSE(fs::exists(d));
  EXPECT_TRUE((*b)->alive());
  EXPECT_EQ(run(**b, "true"), 0);
  // The forgotten owner still holds the zombie and fds; destroying it is harmless now.
  delete lost;
  EXPECT_EQ(kill(lost_pid, 0), -1);
  EXPECT_TRUE(backend_->cleanup_orphans({(*b)->id()}).empty());
}

}  // namespace
}  // namespace tp::runtime

namespace tp::runtime {
namespace {

// With the real tp-agent (when it has been built next to the test binary).
TEST(ContainerRealAgentTest, RunsACommandThroughTheWireProtocol) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root";
  std::string agent;
  if (const char* b = getenv("TP_BIN_DIR")) agent = std::string(b) + "/tp-agent";
  if (agent.empty() || access(agent.c_str(), X_OK) != 0)
    GTEST_SKIP() << "no tp-agent in TP_BIN_DIR";
  char tmpl[] = "/tmp/tp-ra-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string dir = tmpl;
  chmod(dir.c_str(), 0755);
  ContainerOptions o;
  o.data_dir = dir;
  o.agent_path = agent;
  o.cgroup_name = "tp-test-" + ids::random_hex(4);
  {
    auto b = make_container_backend(o);
    ASSERT_TRUE(b) << b.error().message();
    SandboxSpec s;
    s.id = "ra-" + ids::random_hex(4);
    auto r = (*b)->create(s);
    ASSERT_TRUE(r) << r.error().message();
    int fd = (*r)->agent_fd();
    proto::FrameReader reader;
    auto next = [&]() -> std::optional<proto::Message> {
      for (int i = 0; i < 200; ++i) {
        if (auto m = reader.next()) return m;
        std::string chunk = read_some(fd, 1, 10000);
        if (chunk.empty()) return std::nullopt;
        reader.feed(chunk.data(), chunk.size());
      }
      return std::nullopt;
    };
    auto ready = next();
    ASSERT_TRUE(ready);
    EXPECT_EQ(ready->type, proto::MsgType::kReady);
    proto::Message exec(proto::MsgType::kExec, 7);
    exec.add(proto::Tag::kArg, "/bin/sh")
        .add(proto::Tag::kArg, "-c")
        .add(proto::Tag::kArg, "test \"$(hostname)\" = " + s.id + " && exit 7");
    std::string frame = proto::encode(exec);
    ASSERT_EQ(write(fd, frame.data(), frame.size()), static_cast<ssize_t>(frame.size()));
    std::optional<proto::Message> m;
    do m = next();
    while (m && m->type != proto::MsgType::kExit && m->type != proto::MsgType::kError);
    ASSERT_TRUE(m);
    ASSERT_EQ(m->type, proto::MsgType::kExit) << m->str(proto::Tag::kMessage);
    EXPECT_EQ(m->i64(proto::Tag::kExitCode), 7);
    {
      // The command had a cgroup of its own, which the agent emptied before kExit
      // (and keeps for the next command).
      auto layout = sys::detect_layout(sys::real_sys());
      sys::CgroupManager cg(sys::real_sys(), *layout, o.cgroup_name);
      std::error_code ec;
      int subs = 0;
      for (const auto& e : std::filesystem::directory_iterator(cg.delegated_dir(s.id), ec)) {
        if (!e.is_directory(ec)) continue;
        ++subs;
        std::ifstream procs(e.path() / "cgroup.procs");
        std::string pid;
        EXPECT_FALSE(procs >> pid) << "a process is left in " << e.path();
      }
      EXPECT_FALSE(ec) << ec.message();
      EXPECT_EQ(subs, 1);
    }
    ASSERT_TRUE((*r)->destroy());
    auto layout = sys::detect_layout(sys::real_sys());
    sys::CgroupManager cg(sys::real_sys(), *layout, o.cgroup_name);
    EXPECT_TRUE(cg.list().empty());
    r->reset();
    b->reset();
    for (const auto& d : cg.dirs("x")) rmdir(std::filesystem::path(d).parent_path().c_str());
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tp::runtime

// Live restore below the sandbox manager: release(), a new backend, adopt().
namespace tp::runtime {
namespace {

// Frames over one fd, with the test's generous per-read timeout.
struct FrameConn {
  int fd;
  proto::FrameReader reader;
  std::optional<proto::Message> next() {
    for (int i = 0; i < 100000; ++i) {
      if (auto m = reader.next()) return m;
      std::string chunk = read_some(fd, 1, 20000);
      if (chunk.empty()) return std::nullopt;
      reader.feed(chunk.data(), chunk.size());
    }
    return std::nullopt;
  }
  bool send(const proto::Message& m) {
    std::string b = proto::encode(m);
    return write(fd, b.data(), b.size()) == static_cast<ssize_t>(b.size());
  }
  // Answers of `id` until its kExit or kError (acknowledging them).
  std::optional<proto::Message> until_end(uint32_t id, std::string* out = nullptr) {
    for (;;) {
      auto m = next();
      if (!m) return m;
      if (uint64_t seq = m->u64(proto::Tag::kSeq))
        send(proto::Message(proto::MsgType::kAck, 0).add_u64(proto::Tag::kSeq, seq));
      if (m->id != id) continue;
      if (out && m->type == proto::MsgType::kOutput) out->append(m->str(proto::Tag::kData));
      if (m->type == proto::MsgType::kExit || m->type == proto::MsgType::kError) return m;
    }
  }
};

int connect_unix(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path.c_str());
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

proto::Message sh_exec(uint32_t id, const std::string& script, const std::string& meta = {}) {
  proto::Message m(proto::MsgType::kExec, id);
  m.add(proto::Tag::kArg, "/bin/sh").add(proto::Tag::kArg, "-c").add(proto::Tag::kArg, script);
  if (!meta.empty()) m.add(proto::Tag::kMeta, meta);
  return m;
}

TEST_F(ContainerBackendTest, RunDirIsRootOnlyAndDestroyRemovesIt) {
  auto r = backend_->create(spec());
  ASSERT_TRUE(r) << r.error().message();
  auto& sb = **r;
  ASSERT_TRUE(wait_ready(sb.agent_fd()));
  std::string addr = sb.agent_address();
  ASSERT_EQ(addr, dir_ + "/containers/run/" + sb.id() + ".sock");
  struct stat st {};
  ASSERT_EQ(stat((dir_ + "/containers/run").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_EQ(st.st_uid, 0u);
  ASSERT_EQ(stat(addr.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  // The init it serves is recorded on the socket itself: one inode per sandbox.
  char state[128] = {};
  ASSERT_GT(getxattr(addr.c_str(), "trusted.tidepool.init", state, sizeof state - 1), 0);
  EXPECT_NE(std::string(state).find("pid " + std::to_string(sb.pid()) + "\n"), std::string::npos)
      << state;
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_ + "/containers/run"), {}), 1);
  // The agent got it as fd 5 (after its cgroup directory at fd 4; the fake agent
  // ignores both) and nothing else.
  const std::string fds = "/proc/" + std::to_string(sb.pid()) + "/fd/";
  ASSERT_EQ(stat((fds + "5").c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_FALSE(fs::exists(fds + "6"));
  std::string id = sb.id();
  pid_t pid = sb.pid();
  ASSERT_TRUE(sb.destroy());
  expect_gone(id, pid);
  EXPECT_FALSE(fs::exists(addr));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_ + "/containers/run"), {}), 0);
  EXPECT_EQ(sb.agent_address(), "");
}

TEST_F(ContainerBackendTest, ReleasedSandboxIsAdoptedByANewBackend) {
  SandboxSpec s = spec();
  auto r = backend_->create(s);
  ASSERT_TRUE(r) << r.error().message();
  ASSERT_TRUE(wait_ready((*r)->agent_fd()));
  ASSERT_EQ(status_of(**r, "true"), 0);
  pid_t pid = (*r)->pid();
  (*r)->release();
  EXPECT_TRUE((*r)->destroy().has_value());  // a no-op now
  r->reset();
  backend_.reset();  // the daemon goes away
  EXPECT_EQ(kill(pid, 0), 0) << "released sandbox must keep running";
  auto b = make_container_backend(opts_);
  ASSERT_TRUE(b) << b.error().message();
  backend_ = std::move(*b);
  auto a = backend_->adopt(s);
  ASSERT_TRUE(a) << a.error().message();
  EXPECT_EQ((*a)->agent_fd(), -1);
  EXPECT_EQ((*a)->pid(), pid);
  EXPECT_TRUE((*a)->alive());
  EXPECT_EQ((*a)->agent_address(), dir_ + "/containers/run/" + s.id + ".sock");
  auto u = (*a)->usage();
  ASSERT_TRUE(u) << u.error().message();
  EXPECT_GT(u->pids, 0u);
  // cleanup_orphans keeps what is kept.
  EXPECT_TRUE(backend_->cleanup_orphans({s.id}).empty());
  EXPECT_TRUE(fs::exists(dir_ + "/containers/run/" + s.id + ".sock"));
  ASSERT_TRUE((*a)->destroy());
  expect_gone(s.id, pid);
  EXPECT_FALSE(fs::exists(dir_ + "/containers/run/" + s.id + ".sock"));
  // Gone now: nothing to adopt.
  auto again = backend_->adopt(s);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code, Code::kNotFound);
}

// A sandbox its daemon left frozen (paused, or frozen for a paced teardown) is thawed
// by the adopt, so that its agent can answer the next daemon. (A v1 freeze the daemon
// died in the middle of, left FREEZING, is thawed the same way: sys::freeze_requested.)
TEST_F(ContainerBackendTest, AReleasedFrozenSandboxIsThawedByItsAdoption) {
  SandboxSpec s = spec();
  auto r = backend_->create(s);
  ASSERT_TRUE(r) << r.error().message();
  ASSERT_TRUE(wait_ready((*r)->agent_fd()));
  if (sys::freezer_dir(*cg_, s.id).empty()) GTEST_SKIP() << "no freezer";
  ASSERT_TRUE((*r)->freeze());
  pid_t pid = (*r)->pid();
  (*r)->release();
  r->reset();
  backend_.reset();
  auto b = make_container_backend(opts_);
  ASSERT_TRUE(b) << b.error().message();
  backend_ = std::move(*b);
  auto a = backend_->adopt(s);
  ASSERT_TRUE(a) << a.error().message();
  auto asked = sys::freeze_requested(sys::real_sys(), *cg_, s.id);
  ASSERT_TRUE(asked) << asked.error().message();
  EXPECT_FALSE(*asked);
  ASSERT_TRUE((*a)->destroy());
  expect_gone(s.id, pid);
}

// Sandboxes made before the run dir's layout changed (<id>/agent.sock and <id>/state,
// in the data dir) are adopted and cleaned up all the same, also by a backend whose
// run dir is elsewhere.
TEST_F(ContainerBackendTest, SandboxOfTheEarlierRunDirLayoutIsAdopted) {
  SandboxSpec s = spec();
  auto r = backend_->create(s);
  ASSERT_TRUE(r) << r.error().message();
  ASSERT_TRUE(wait_ready((*r)->agent_fd()));
  pid_t pid = (*r)->pid();
  (*r)->release();
  r->reset();
  backend_.reset();
  // What an earlier version left: its directory, the socket in it, the state file.
  const std::string run = dir_ + "/containers/run", legacy = run + "/" + s.id;
  ASSERT_EQ(mkdir(legacy.c_str(), 0700), 0);
  ASSERT_EQ(rename((run + "/" + s.id + ".sock").c_str(), (legacy + "/agent.sock").c_str()), 0);
  std::ofstream(legacy + "/state")
      << "pid " << pid << "\nstarttime " << proc_start_time(pid) << "\n";
  ContainerOptions o = opts_;
  o.run_dir = dir_ + "/run-elsewhere";
  auto b = make_container_backend(o);
  ASSERT_TRUE(b) << b.error().message();
  backend_ = std::move(*b);
  auto a = backend_->adopt(s);
  ASSERT_TRUE(a) << a.error().message();
  EXPECT_EQ((*a)->pid(), pid);
  EXPECT_EQ((*a)->agent_address(), legacy + "/agent.sock");
  // A new session through the old socket: the agent still listens on it.
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::strncpy(sa.sun_path, (legacy + "/agent.sock").c_str(), sizeof sa.sun_path - 1);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0) << strerror(errno);
  close(fd);
  EXPECT_TRUE(backend_->cleanup_orphans({s.id}).empty());
  EXPECT_TRUE(fs::exists(legacy + "/state"));
  // New sandboxes go to the configured run dir.
  auto n = backend_->create(spec());
  ASSERT_TRUE(n) << n.error().message();
  EXPECT_EQ((*n)->agent_address(), o.run_dir + "/" + (*n)->id() + ".sock");
  ASSERT_TRUE((*n)->destroy());
  ASSERT_TRUE((*a)->destroy());
  expect_gone(s.id, pid);
  EXPECT_FALSE(fs::exists(legacy));
}

TEST_F(ContainerBackendTest, AdoptRefusesAReusedPidAndCleanupRemovesRunDirs) {
  SandboxSpec s = spec();
  auto r = backend_->create(s);
  ASSERT_TRUE(r) << r.error().message();
  ASSERT_TRUE(wait_ready((*r)->agent_fd()));
  pid_t pid = (*r)->pid();
  const std::string run = dir_ + "/containers/run/" + s.id + ".sock";
  // Same pid, other start time: another process than the one recorded.
  const std::string forged = "pid " + std::to_string(pid) + "\nstarttime 1\n";
  ASSERT_EQ(setxattr(run.c_str(), "trusted.tidepool.init", forged.data(), forged.size(), 0), 0);
  auto a = backend_->adopt(s);
  ASSERT_FALSE(a);
  EXPECT_EQ(a.error().code, Code::kNotFound);
  EXPECT_EQ(kill(pid, 0), 0) << "a refused adopt touches nothing";
  // A run dir of a sandbox that is not kept goes with it.
  (*r)->release();
  r->reset();
  auto cleaned = backend_->cleanup_orphans({});
  ASSERT_EQ(cleaned.size(), 1u);
  EXPECT_FALSE(fs::exists(run));
  // The released init is our child here: reap it.
  int st;
  EXPECT_EQ(waitpid(pid, &st, 0), pid);
  for (const auto& d : cg_->dirs(s.id)) EXPECT_FALSE(fs::exists(d));
  auto none = backend_->adopt(spec("never-made"));
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code, Code::kNotFound);
}

TEST_F(ContainerBackendTest, FreezeStopsEveryProcessAndThawResumes) {
  auto r = backend_->create(spec());
  ASSERT_TRUE(r) << r.error().message();
  auto& sb = **r;
  ASSERT_TRUE(wait_ready(sb.agent_fd()));
  if (sys::freezer_dir(*cg_, sb.id()).empty()) GTEST_SKIP() << "no freezer";
  ASSERT_TRUE(sb.freeze());
  auto fz = sys::is_frozen(sys::real_sys(), *cg_, sb.id());
  ASSERT_TRUE(fz) << fz.error().message();
  EXPECT_TRUE(*fz);
  // A frozen agent does not answer: the line stays unread.
  const std::string line = "true\n";
  ASSERT_EQ(write(sb.agent_fd(), line.data(), line.size()), static_cast<ssize_t>(line.size()));
  pollfd p{sb.agent_fd(), POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 200), 0);
  ASSERT_TRUE(sb.thaw());
  fz = sys::is_frozen(sys::real_sys(), *cg_, sb.id());
  ASSERT_TRUE(fz);
  EXPECT_FALSE(*fz);
  std::string ans = read_some(sb.agent_fd(), 7, 20000);
  EXPECT_EQ(ans, "exit 0\n");
  // Destroying a frozen sandbox works too.
  ASSERT_TRUE(sb.freeze());
  std::string id = sb.id();
  pid_t pid = sb.pid();
  ASSERT_TRUE(sb.destroy());
  expect_gone(id, pid);
  EXPECT_FALSE(sb.freeze());
}

// A sandbox frozen behind its instance's back (as an adopted one can be: its previous
// daemon died while freezing it) is still destroyed: destroy thaws it for its PID 1 to
// die, instead of waiting for that forever.
TEST_F(ContainerBackendTest, DestroyEndsASandboxFrozenBehindItsBack) {
  auto r = backend_->create(spec());
  ASSERT_TRUE(r) << r.error().message();
  auto& sb = **r;
  ASSERT_TRUE(wait_ready(sb.agent_fd()));
  if (sys::freezer_dir(*cg_, sb.id()).empty()) GTEST_SKIP() << "no freezer";
  ASSERT_TRUE(sys::set_frozen(sys::real_sys(), *cg_, sb.id(), true));
  std::string id = sb.id();
  pid_t pid = sb.pid();
  auto done = std::async(std::launch::async, [&] { return sb.destroy(); });
  // A deadlock guard, not a timing threshold: on failure, thaw so that the test ends.
  if (done.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    (void)sys::set_frozen(sys::real_sys(), *cg_, id, false);
    ADD_FAILURE() << "destroy of a frozen sandbox did not end";
  }
  auto d = done.get();
  ASSERT_TRUE(d) << d.error().message();
  expect_gone(id, pid);
}

// With the real tp-agent: a command keeps running across release() and a
// new backend's adopt(); a new session lists it, replays its unacknowledged
// output, execs, and destroy leaves nothing.
TEST(ContainerRealAgentTest, AdoptedSandboxKeepsItsCommandsAndServesANewSession) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root";
  std::string agent;
  if (const char* b = getenv("TP_BIN_DIR")) agent = std::string(b) + "/tp-agent";
  if (agent.empty() || access(agent.c_str(), X_OK) != 0)
    GTEST_SKIP() << "no tp-agent in TP_BIN_DIR";
  char tmpl[] = "/tmp/tp-ra-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string dir = tmpl;
  chmod(dir.c_str(), 0755);
  ContainerOptions o;
  o.data_dir = dir;
  o.agent_path = agent;
  o.cgroup_name = "tp-test-" + ids::random_hex(4);
  auto layout = sys::detect_layout(sys::real_sys());
  ASSERT_TRUE(layout);
  sys::CgroupManager cg(sys::real_sys(), *layout, o.cgroup_name);
  SandboxSpec s;
  s.id = "ra-" + ids::random_hex(4);
  pid_t pid = 0;
  {
    auto b = make_container_backend(o);
    ASSERT_TRUE(b) << b.error().message();
    auto r = (*b)->create(s);
    ASSERT_TRUE(r) << r.error().message();
    pid = (*r)->pid();
    FrameConn c{(*r)->agent_fd(), {}};
    auto ready = c.next();
    ASSERT_TRUE(ready);
    ASSERT_EQ(ready->type, proto::MsgType::kReady);
    ASSERT_TRUE(c.send(proto::Message(proto::MsgType::kHello, 0).add_u64(proto::Tag::kEpoch, 1)));
    ASSERT_TRUE(c.send(sh_exec(3, "echo before; exec sleep 1000", "bg")));
    std::string out;
    while (out != "before\n") {
      auto m = c.next();
      ASSERT_TRUE(m);
      if (m->type == proto::MsgType::kOutput) out += m->str(proto::Tag::kData);
    }
    (*r)->release();
    r->reset();
  }  // the backend goes away; nothing acknowledged the output
  ASSERT_EQ(kill(pid, 0), 0);
  {
    auto b = make_container_backend(o);
    ASSERT_TRUE(b) << b.error().message();
    auto a = (*b)->adopt(s);
    ASSERT_TRUE(a) << a.error().message();
    int fd = connect_unix((*a)->agent_address());
    ASSERT_GE(fd, 0);
    FrameConn c{fd, {}};
    auto listed = c.next();
    ASSERT_TRUE(listed);
    ASSERT_EQ(listed->type, proto::MsgType::kResumed);
    EXPECT_EQ(listed->id, 3u);
    EXPECT_EQ(listed->str(proto::Tag::kMeta), "bg");
    EXPECT_TRUE(listed->flag(proto::Tag::kRunning));
    auto ready = c.next();
    ASSERT_TRUE(ready);
    ASSERT_EQ(ready->type, proto::MsgType::kReady);
    EXPECT_EQ(ready->u64(proto::Tag::kSession), 2u);
    EXPECT_EQ(ready->u64(proto::Tag::kHighId), 3u);
    ASSERT_TRUE(c.send(proto::Message(proto::MsgType::kHello, 0).add_u64(proto::Tag::kEpoch, 2)));
    // The replay: kStarted and the output nobody acknowledged.
    std::string replayed;
    while (replayed != "before\n") {
      auto m = c.next();
      ASSERT_TRUE(m);
      ASSERT_EQ(m->id, 3u);
      if (m->type == proto::MsgType::kOutput) replayed += m->str(proto::Tag::kData);
      c.send(proto::Message(proto::MsgType::kAck, 0)
                 .add_u64(proto::Tag::kSeq, m->u64(proto::Tag::kSeq)));
    }
    ASSERT_TRUE(c.send(sh_exec(4, "test \"$(hostname)\" = " + s.id + " && exit 7")));
    auto x = c.until_end(4);
    ASSERT_TRUE(x);
    ASSERT_EQ(x->type, proto::MsgType::kExit) << x->str(proto::Tag::kMessage);
    EXPECT_EQ(x->i64(proto::Tag::kExitCode), 7);
    // Freeze and thaw the adopted sandbox.
    if (!sys::freezer_dir(cg, s.id).empty()) {
      ASSERT_TRUE((*a)->freeze());
      ASSERT_TRUE((*a)->thaw());
      ASSERT_TRUE(c.send(proto::Message(proto::MsgType::kPing, 5)));
      auto ok = c.next();
      ASSERT_TRUE(ok);
      EXPECT_EQ(ok->type, proto::MsgType::kOk);
    }
    ASSERT_TRUE((*a)->destroy());
    close(fd);
    EXPECT_EQ(kill(pid, 0), -1);
    EXPECT_TRUE(cg.list().empty());
    EXPECT_FALSE(std::filesystem::exists(dir + "/containers/run/" + s.id + ".sock"));
    a->reset();
  }
  for (const auto& d : cg.dirs("x")) rmdir(std::filesystem::path(d).parent_path().c_str());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tp::runtime
