// raw_floor: the raw kernel floor of a container sandbox, and our runtime against it.
//
// The floor is a minimal loop doing only what a sandbox needs, with nothing of
// Tidepool in the way: clone(CLONE_VM | user, mount, pid, uts, ipc, net, cgroup
// namespaces) on a private stack, uid/gid maps, cgroups (v1: memory, cpu, pids
// mkdir + limits, the child born in them through its parent thread, rmdir; v2:
// one dir, attach), loopback up, a tmpfs-backed overlay root over a small
// 2-layer lower, /proc, pivot_root, exec of static busybox `true`, reap, clean
// up.
// The runtime is ContainerBackend::create + destroy with the fake agent (or
// --agent PATH), measured in interleaved rounds with the floor so that load
// changes hit both alike, plus create + wait for kReady + destroy.
//
// Usage: raw_floor [--iterations N] [--json] [--agent PATH] [--no-backend]
//                  [--rounds N] [--samples] [--rates W,W,...] [--rate-seconds S]
// (--samples adds every floor time to the JSON; --rates lists the worker counts of
// the floor's sustained runs, "none" for none; --rate-seconds makes each of those runs
// last S seconds instead of a fixed count: what bench/run.sh uses.)
// Needs root, /bin/busybox (busybox-static). No assertions: it reports.
#include <fcntl.h>
#include <linux/close_range.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "common/ids.h"
#include "common/log.h"
#include "runtime/container/container_backend.h"
#include "sys/cgroup.h"
#include "sys/raw_syscall.h"
#include "sys/sys_api.h"
#include "sys/userns.h"

namespace {

namespace fs = std::filesystem;
namespace raw = tp::sys::raw;
using Clock = std::chrono::steady_clock;

constexpr size_t kStack = 64 << 10;
constexpr uint32_t kUidBase = 100000;

// ---- the floor ----------------------------------------------------------

struct FloorChild {
  int sync_rd, sync_wr;
  const char* mnt;       // tmpfs mount point
  const char* upper;     // mnt/upper
  const char* work;      // mnt/work
  const char* root;      // mnt/root
  const char* ovl_opts;  // lowerdir=...,upperdir=...,workdir=...
  const char* proc;      // root/proc
  const char* hostname;
  char* const* argv;
  char* const* envp;
};

int floor_child(void* arg) {
  auto* c = static_cast<FloorChild*>(arg);
  raw::call(SYS_close, c->sync_wr);
  char b;
  if (raw::call(SYS_read, c->sync_rd, &b, 1) != 1) raw::exit_now(120);
  if (raw::call(SYS_setresgid, 0, 0, 0) < 0 || raw::call(SYS_setresuid, 0, 0, 0) < 0)
    raw::exit_now(121);
  if (raw::call(SYS_unshare, CLONE_NEWCGROUP) < 0) raw::exit_now(122);
  raw::call(SYS_sethostname, c->hostname, strlen(c->hostname));
  long s = raw::call(SYS_socket, AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ifreq ifr{};
  std::memcpy(ifr.ifr_name, "lo", 3);
  ifr.ifr_flags = IFF_UP;
  if (raw::call(SYS_ioctl, s, SIOCSIFFLAGS, &ifr) < 0) raw::exit_now(123);
  raw::call(SYS_close, s);
  if (raw::call(SYS_mount, 0, "/", 0, MS_REC | MS_PRIVATE, 0) < 0) raw::exit_now(124);
  if (raw::call(SYS_mount, "tmpfs", c->mnt, "tmpfs", MS_NOSUID | MS_NODEV, "size=16m") < 0)
    raw::exit_now(125);
  raw::call(SYS_mkdirat, AT_FDCWD, c->upper, 0755);
  raw::call(SYS_mkdirat, AT_FDCWD, c->work, 0700);
  raw::call(SYS_mkdirat, AT_FDCWD, c->root, 0755);
  if (raw::call(SYS_mount, "overlay", c->root, "overlay", 0, c->ovl_opts) < 0) raw::exit_now(126);
  if (raw::call(SYS_mount, "proc", c->proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, 0) < 0)
    raw::exit_now(127);
  if (raw::call(SYS_chdir, c->root) < 0) raw::exit_now(128);
  if (raw::call(SYS_pivot_root, ".", ".") < 0) raw::exit_now(129);
  if (raw::call(SYS_umount2, ".", MNT_DETACH) < 0) raw::exit_now(130);
  unsigned long empty = 0;
  raw::call(SYS_rt_sigprocmask, SIG_SETMASK, &empty, nullptr, 8);
  raw::call(SYS_execve, "/bin/busybox", c->argv, c->envp);
  raw::exit_now(131);
}

class Floor {
 public:
  Floor(std::string dir, tp::sys::CgroupLayout layout)
      : dir_(std::move(dir)),
        cg_(tp::sys::real_sys(), std::move(layout), "tp-floor-" + tp::ids::random_hex(3)) {}

  bool prepare() {
    fs::create_directories(dir_ + "/l0/bin");
    fs::create_directories(dir_ + "/l1/proc");
    fs::create_directories(dir_ + "/l1/etc");
    fs::create_directories(dir_ + "/mnt");
    std::error_code ec;
    fs::copy_file("/bin/busybox", dir_ + "/l0/bin/busybox", ec);
    if (ec) {
      std::fprintf(stderr, "copy /bin/busybox: %s (install busybox-static)\n",
                   ec.message().c_str());
      return false;
    }
    std::ofstream(dir_ + "/l1/etc/hostname") << "floor\n";
    mnt_ = dir_ + "/mnt";
    upper_ = mnt_ + "/upper";
    work_ = mnt_ + "/work";
    root_ = mnt_ + "/root";
    proc_ = root_ + "/proc";
    ovl_ = "lowerdir=" + dir_ + "/l1:" + dir_ + "/l0,upperdir=" + upper_ + ",workdir=" + work_ +
           ",userxattr";
    auto r = cg_.init();
    if (!r) {
      std::fprintf(stderr, "cgroup init: %s\n", r.error().message().c_str());
      return false;
    }
    return true;
  }

  ~Floor() {
    for (const auto& d : cg_.dirs("x")) ::rmdir(fs::path(d).parent_path().c_str());
  }

  // One sandbox: create, run busybox true, reap, clean up. Returns false on failure.
  bool once(int worker, uint64_t n) {
    std::string id = "f" + std::to_string(worker) + "-" + std::to_string(n);
    if (!cg_.create(id, {64 << 20, 1.0, 64})) return false;
    static char a0[] = "true";
    static char* argv[] = {a0, nullptr};
    static char e0[] = "PATH=/bin";
    static char* envp[] = {e0, nullptr};
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return false;
    FloorChild c{p[0],          p[1],          mnt_.c_str(), upper_.c_str(),
                 work_.c_str(), root_.c_str(), ovl_.c_str(), proc_.c_str(),
                 id.c_str(),    argv,          envp};
    void* stack = mmap(nullptr, kStack, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    // Born in its cgroup (v1): the cheapest attach there is, the one the runtime uses too.
    std::vector<std::string> own;
    const bool born_in = cg_.can_enter_thread();
    if (born_in) {
      auto e = cg_.enter_thread(id);
      if (!e) {
        munmap(stack, kStack);
        close(p[0]);
        close(p[1]);
        (void)cg_.remove(id);
        return false;
      }
      own = std::move(*e);
    }
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid_t pid = clone(floor_child, static_cast<char*>(stack) + kStack,
                      CLONE_VM | CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWUTS |
                          CLONE_NEWIPC | CLONE_NEWNET | SIGCHLD,
                      &c);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (born_in && !cg_.leave_thread(own)) std::abort();
    close(p[0]);
    bool ok = pid > 0 && tp::sys::write_id_maps(pid, kUidBase) && (born_in || cg_.attach(id, pid));
    if (ok) ok = write(p[1], "x", 1) == 1;
    close(p[1]);
    int st = 0;
    if (pid > 0) {
      if (!ok) kill(pid, SIGKILL);
      while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
      }
    }
    munmap(stack, kStack);  // the child is gone: exec'd then exited, or died
    ok = ok && WIFEXITED(st) && WEXITSTATUS(st) == 0;
    if (!cg_.remove(id)) ok = false;
    return ok;
  }

 private:
  std::string dir_, mnt_, upper_, work_, root_, proc_, ovl_;
  tp::sys::CgroupManager cg_;
};

// ---- measurement ----------------------------------------------------------

struct Stats {
  double p50_ms = 0, p90_ms = 0, p99_ms = 0, mean_ms = 0;
  size_t n = 0, failures = 0;
};

Stats summarize(std::vector<double> v, size_t failures) {
  Stats s;
  s.failures = failures;
  s.n = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
  };
  s.p50_ms = at(0.50);
  s.p90_ms = at(0.90);
  s.p99_ms = at(0.99);
  double sum = 0;
  for (double x : v) sum += x;
  s.mean_ms = sum / static_cast<double>(v.size());
  return s;
}

// Runs `fn(worker, i)` `per_worker` times on each of `workers` threads; returns sandboxes/s.
double sustained(int workers, uint64_t per_worker, const std::function<bool(int, uint64_t)>& fn,
                 size_t* failures) {
  std::atomic<size_t> fails{0};
  auto t0 = Clock::now();
  std::vector<std::thread> ts;
  for (int w = 0; w < workers; ++w)
    ts.emplace_back([&, w] {
      for (uint64_t i = 0; i < per_worker; ++i)
        if (!fn(w, 1000000 + i)) ++fails;
    });
  for (auto& t : ts) t.join();
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  *failures = fails;
  return static_cast<double>(per_worker * static_cast<uint64_t>(workers)) / secs;
}

// Runs `fn(worker, i)` on each of `workers` threads until `seconds` have passed; returns
// sandboxes/s over the time until the last in-flight one finished.
double sustained_for(int workers, double seconds, const std::function<bool(int, uint64_t)>& fn,
                     size_t* failures) {
  std::atomic<size_t> fails{0}, done{0};
  auto t0 = Clock::now();
  auto end =
      t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  std::vector<std::thread> ts;
  for (int w = 0; w < workers; ++w)
    ts.emplace_back([&, w] {
      for (uint64_t i = 0; Clock::now() < end; ++i) fn(w, 2000000 + i) ? ++done : ++fails;
    });
  for (auto& t : ts) t.join();
  *failures = fails;
  return static_cast<double>(done.load()) /
         std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string fake_agent_default() {
  auto exe = fs::read_symlink("/proc/self/exe");
  return (exe.parent_path().parent_path() / "payloads/fake_agent").string();
}

std::string join_rates(const std::map<int, double>& m) {
  std::string out;
  for (const auto& [w, r] : m)
    out += (out.empty() ? "" : ",") + ("\"" + std::to_string(w) + "\":" + std::to_string(r));
  return out;
}

std::string join_samples(const std::vector<double>& v) {
  std::string out;
  char b[32];
  for (double x : v) {
    std::snprintf(b, sizeof b, "%s%.4f", out.empty() ? "" : ",", x);
    out += b;
  }
  return out;
}

bool wait_ready(int fd) {
  // The kReady frame is the first thing the agent writes; its arrival is what the node waits for.
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, 10000) <= 0) return false;
  char buf[256];
  return read(fd, buf, sizeof buf) > 0;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t iterations = 200;
  bool json = false, with_backend = true, samples = false;
  int rounds = 10;
  double rate_seconds = 0;
  std::vector<int> rates{1, 2};
  std::string agent = fake_agent_default();
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--iterations" && i + 1 < argc)
      iterations = std::stoull(argv[++i]);
    else if (a == "--json")
      json = true;
    else if (a == "--agent" && i + 1 < argc)
      agent = argv[++i];
    else if (a == "--no-backend")
      with_backend = false;
    else if (a == "--samples")
      samples = true;
    else if (a == "--rounds" && i + 1 < argc)
      rounds = std::max(1, std::stoi(argv[++i]));
    else if (a == "--rate-seconds" && i + 1 < argc)
      rate_seconds = std::stod(argv[++i]);
    else if (a == "--rates" && i + 1 < argc) {
      rates.clear();
      std::string l = argv[++i];
      for (size_t p = 0; l != "none" && p < l.size();) {
        size_t q = l.find(',', p);
        if (q == std::string::npos) q = l.size();
        rates.push_back(std::max(1, std::stoi(l.substr(p, q - p))));
        p = q + 1;
      }
    } else {
      std::fprintf(stderr,
                   "usage: %s [--iterations N] [--json] [--agent PATH] [--no-backend] [--rounds N] "
                   "[--samples]"
                   " [--rates W,W,...|none] [--rate-seconds S]\n",
                   argv[0]);
      return 2;
    }
  }
  if (geteuid() != 0) {
    std::fprintf(stderr, "raw_floor needs root\n");
    return 1;
  }
  spdlog::set_level(spdlog::level::warn);
  char tmpl[] = "/tmp/tp-floor-XXXXXX";
  if (!mkdtemp(tmpl)) return 1;
  std::string dir = tmpl;
  chmod(dir.c_str(), 0755);
  int rc = 0;
  {
    auto layout = tp::sys::detect_layout(tp::sys::real_sys());
    if (!layout) {
      std::fprintf(stderr, "cgroups: %s\n", layout.error().message().c_str());
      fs::remove_all(dir);
      return 1;
    }
    Floor floor(dir + "/floor", *layout);
    fs::create_directories(dir + "/floor");
    if (!floor.prepare()) {
      fs::remove_all(dir);
      return 1;
    }
    std::unique_ptr<tp::runtime::Backend> backend;
    std::string cg_name = "tp-bench-" + tp::ids::random_hex(3);
    if (with_backend) {
      tp::runtime::ContainerOptions o;
      o.data_dir = dir + "/data";
      o.agent_path = agent;
      // The spawner is the real agent binary next to us; a stand-in agent is exec'd by it.
      o.spawner_path = (fs::read_symlink("/proc/self/exe").parent_path() / "tp-agent").string();
      o.cgroup_name = cg_name;
      auto b = tp::runtime::make_container_backend(o);
      if (!b) {
        std::fprintf(stderr, "container backend: %s\n", b.error().message().c_str());
        with_backend = false;
      } else {
        backend = std::move(*b);
      }
    }
    uint64_t seq = 0;
    std::vector<double> t_create_only, t_destroy_only;  // split of the create+destroy rows
    auto backend_once = [&](bool ready) -> bool {
      tp::runtime::SandboxSpec s;
      s.id = "b" + std::to_string(seq++) + "-" + tp::ids::random_hex(3);
      s.disk_bytes = 16 << 20;
      s.tmp_bytes = 16 << 20;
      s.memory_bytes = 64 << 20;
      auto t0 = Clock::now();
      auto r = backend->create(s);
      if (!r) {
        std::fprintf(stderr, "create: %s\n", r.error().message().c_str());
        return false;
      }
      auto t1 = Clock::now();
      bool ok = !ready || wait_ready((*r)->agent_fd());
      auto t2 = Clock::now();
      ok = (*r)->destroy() && ok;
      if (!ready) {
        t_create_only.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        t_destroy_only.push_back(
            std::chrono::duration<double, std::milli>(Clock::now() - t2).count());
      }
      return ok;
    };
    std::atomic<uint64_t> bseq{0};
    auto backend_worker = [&](int, uint64_t) {
      tp::runtime::SandboxSpec s;
      s.id = "w" + std::to_string(bseq++) + "-" + tp::ids::random_hex(3);
      s.disk_bytes = 16 << 20;
      s.tmp_bytes = 16 << 20;
      s.memory_bytes = 64 << 20;
      auto r = backend->create(s);
      return r && (*r)->destroy().has_value();
    };

    // Warm-up, then interleaved rounds so that load changes hit every variant alike.
    for (int i = 0; i < 5; ++i) {
      floor.once(0, 900000 + static_cast<uint64_t>(i));
      if (with_backend) backend_once(false);
    }
    std::vector<double> t_floor, t_create, t_ready;
    size_t f_floor = 0, f_create = 0, f_ready = 0;
    const int kRounds = rounds;
    for (int round = 0; round < kRounds; ++round) {
      uint64_t n =
          iterations / kRounds + (static_cast<uint64_t>(round) < iterations % kRounds ? 1 : 0);
      for (uint64_t i = 0; i < n; ++i) {
        auto t0 = Clock::now();
        bool ok = floor.once(0, static_cast<uint64_t>(round) * 100000 + i);
        double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        ok ? t_floor.push_back(ms) : (void)++f_floor;
      }
      if (!with_backend) continue;
      for (uint64_t i = 0; i < n; ++i) {
        auto t0 = Clock::now();
        bool ok = backend_once(false);
        double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        ok ? t_create.push_back(ms) : (void)++f_create;
      }
      for (uint64_t i = 0; i < n; ++i) {
        auto t0 = Clock::now();
        bool ok = backend_once(true);
        double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        ok ? t_ready.push_back(ms) : (void)++f_ready;
      }
    }
    t_create_only.erase(t_create_only.begin(),
                        t_create_only.begin() + std::min<size_t>(5, t_create_only.size()));
    t_destroy_only.erase(t_destroy_only.begin(),
                         t_destroy_only.begin() + std::min<size_t>(5, t_destroy_only.size()));
    Stats sf = summarize(t_floor, f_floor), sc = summarize(t_create, f_create),
          sr = summarize(t_ready, f_ready);
    Stats s_co = summarize(t_create_only, 0), s_do = summarize(t_destroy_only, 0);
    size_t fail1 = 0, fail2 = 0, bfail1 = 0, bfail2 = 0;
    auto floor_fn = [&](int w, uint64_t i) { return floor.once(w, i); };
    std::map<int, double> floor_rates;
    for (int w : rates) {
      size_t f = 0;
      floor_rates[w] =
          rate_seconds > 0
              ? sustained_for(w, rate_seconds, floor_fn, &f)
              : sustained(w, std::max<uint64_t>(1, iterations / static_cast<uint64_t>(w)), floor_fn,
                          &f);
      (w == 1 ? fail1 : fail2) += f;
    }
    double floor_r1 = floor_rates.count(1) ? floor_rates[1] : 0;
    double floor_r2 = floor_rates.count(2) ? floor_rates[2] : 0;
    double be_r1 = 0, be_r2 = 0;
    if (with_backend) {
      be_r1 = sustained(1, iterations, backend_worker, &bfail1);
      be_r2 = sustained(2, iterations / 2, backend_worker, &bfail2);
    }
    double ratio = sf.p50_ms > 0 ? sc.p50_ms / sf.p50_ms : 0;
    double ratio_ready = sf.p50_ms > 0 ? sr.p50_ms / sf.p50_ms : 0;
    if (json) {
      auto st = [](const Stats& s) {
        char b[256];
        std::snprintf(b, sizeof b,
                      "{\"n\":%zu,\"failures\":%zu,\"p50_ms\":%.3f,\"p90_ms\":%.3f,\"p99_ms\":%.3f,"
                      "\"mean_ms\":%.3f}",
                      s.n, s.failures, s.p50_ms, s.p90_ms, s.p99_ms, s.mean_ms);
        return std::string(b);
      };
      std::printf(
          "{\"iterations\":%llu,\"cgroup\":\"%s\",\"floor\":%s,\"floor_rate_1w\":%.1f,\"floor_rate_"
          "2w\":%.1f,"
          "\"backend_create_destroy\":%s,\"backend_create_ready_destroy\":%s,\"backend_rate_1w\":%."
          "1f,"
          "\"backend_rate_2w\":%.1f,\"ratio_p50\":%.3f,\"ratio_ready_p50\":%.3f,\"agent\":\"%s\","
          "\"backend_create_only\":%s,\"backend_destroy_only\":%s,\"floor_rates\":{%s},"
          "\"floor_samples_ms\":[%s]}\n",
          static_cast<unsigned long long>(iterations),
          layout->version == tp::sys::CgroupVersion::kV1 ? "v1" : "v2", st(sf).c_str(), floor_r1,
          floor_r2, st(sc).c_str(), st(sr).c_str(), be_r1, be_r2, ratio, ratio_ready, agent.c_str(),
          st(s_co).c_str(), st(s_do).c_str(), join_rates(floor_rates).c_str(),
          samples ? join_samples(t_floor).c_str() : "");
    } else {
      auto row = [](const char* name, const Stats& s) {
        std::printf("%-34s %8.2f %8.2f %8.2f %8.2f %6zu %5zu\n", name, s.p50_ms, s.p90_ms, s.p99_ms,
                    s.mean_ms, s.n, s.failures);
      };
      std::printf("cgroups %s, %llu iterations in %d interleaved rounds\n",
                  layout->version == tp::sys::CgroupVersion::kV1 ? "v1" : "v2",
                  static_cast<unsigned long long>(iterations), kRounds);
      std::printf("%-34s %8s %8s %8s %8s %6s %5s\n", "", "p50 ms", "p90", "p99", "mean", "n",
                  "fail");
      row("floor (full, CLONE_VM, bb true)", sf);
      if (with_backend) {
        row("ContainerBackend create+destroy", sc);
        row("  create only", s_co);
        row("  destroy only", s_do);
        row("create + wait kReady + destroy", sr);
        std::printf("ratio runtime/floor p50: %.2f (with kReady %.2f); agent %s\n", ratio,
                    ratio_ready, agent.c_str());
      }
      std::printf("sustained floor:   %.0f/s (1 worker), %.0f/s (2 workers); failures %zu/%zu\n",
                  floor_r1, floor_r2, fail1, fail2);
      if (with_backend)
        std::printf("sustained runtime: %.0f/s (1 worker), %.0f/s (2 workers); failures %zu/%zu\n",
                    be_r1, be_r2, bfail1, bfail2);
    }
    if (f_floor || f_create || f_ready || fail1 || fail2 || bfail1 || bfail2) rc = 3;
    backend.reset();
    if (with_backend) {
      tp::sys::CgroupManager cg(tp::sys::real_sys(), *layout, cg_name);
      for (const auto& d : cg.dirs("x")) ::rmdir(fs::path(d).parent_path().c_str());
    }
  }
  fs::remove_all(dir);
  return rc;
}
