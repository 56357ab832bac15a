#include "runtime/microvm/microvm_backend.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <x86intrin.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "common/log.h"
#include "protocol/wire.h"
#include "runtime/microvm/erofs_store.h"
#include "runtime/microvm/qemu_args.h"
#include "runtime/microvm/qemu_jail.h"
#include "runtime/microvm/qmp.h"
#include "runtime/microvm/template_store.h"
#include "runtime/sandbox_state.h"
#include "sys/cgroup.h"
#include "sys/fd.h"
#include "sys/pidfd.h"
#include "sys/sys_api.h"

namespace tp::runtime {
namespace microvm {
namespace {

using sys::UniqueFd;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Cold boots and template builds running at once (each is a core for seconds under TCG).
constexpr int kBootsAtOnce = 2;
// QEMU's own memory on top of the guest's RAM: its heap, the kernel and initrd it
// loaded, and under TCG the translation cache (qemu_args.h tb_size_mb).
constexpr uint64_t kOverheadTcg = 256ull << 20;
constexpr uint64_t kOverheadKvm = 128ull << 20;
constexpr uint32_t kQemuPids = 256;  // QEMU's threads (vCPUs, I/O workers)
constexpr auto kCloneReady = 30s;    // a clone's agent answers in well under a second
constexpr auto kBootReady = 120s;    // a cold boot under TCG on a loaded host
const char* const kAgentIdle = "tp-agent: the host left the port";

std::string read_tail(const std::string& path, size_t max) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) return {};
  std::streamoff size = f.tellg();
  std::streamoff from =
      size > static_cast<std::streamoff>(max) ? size - static_cast<std::streamoff>(max) : 0;
  f.seekg(from);
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return s;
}

// The last lines of a console or log, on one line, for an error message.
std::string last_lines(const std::string& path, size_t lines = 6) {
  std::string t = read_tail(path, 4096);
  std::vector<std::string> ls;
  std::istringstream in(t);
  for (std::string l; std::getline(in, l);) {
    while (!l.empty() && (l.back() == '\r' || l.back() == ' ')) l.pop_back();
    if (!l.empty()) ls.push_back(l);
  }
  std::string out;
  for (size_t i = ls.size() > lines ? ls.size() - lines : 0; i < ls.size(); ++i)
    out += (out.empty() ? "" : " | ") + ls[i];
  return out;
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) spdlog::warn("microvm: remove_all({}): {}", path, ec.message());
}

// Host TSC frequency in kHz (under TCG the guest's TSC is the host's): rdtsc
// against CLOCK_MONOTONIC over 50 ms, rounded to 1 MHz.
uint64_t measure_tsc_khz() {
  auto t0 = Clock::now();
  uint64_t c0 = __rdtsc();
  std::this_thread::sleep_for(50ms);
  uint64_t c1 = __rdtsc();
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  if (ns <= 0) return 0;
  double khz = static_cast<double>(c1 - c0) / (static_cast<double>(ns) / 1e6);
  return static_cast<uint64_t>(std::llround(khz / 1000.0)) * 1000;
}

// A counting semaphore for boots.
class Slots {
 public:
  explicit Slots(int n) : free_(n) {}
  void acquire() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return free_ > 0; });
    --free_;
  }
  void release() {
    std::lock_guard lk(mu_);
    ++free_;
    cv_.notify_one();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int free_;
};

struct SlotGuard {
  Slots& s;
  explicit SlotGuard(Slots& slots) : s(slots) { s.acquire(); }
  ~SlotGuard() { s.release(); }
};

// Everything the backend and its instances share.
struct VmShared {
  MicrovmOptions opts;
  std::string root;     // <data_dir>/microvm
  std::string run_dir;  // root/run
  std::string tpl_dir;  // root/templates
  std::string mnt_dir;  // root/mnt: the jails' mount point (in their namespaces)
  std::string assets_id;
  Accel accel = Accel::kTcg;
  // TCG: the host TSC frequency, measured on first use (50 ms), not at every daemon start.
  std::once_flag tsc_once;
  uint64_t tsc_khz = 0;
  uint64_t tsc() {
    std::call_once(tsc_once, [this] { tsc_khz = accel == Accel::kTcg ? measure_tsc_khz() : 0; });
    return tsc_khz;
  }
  UniqueFd qemu_exe;
  std::unique_ptr<sys::CgroupManager> cgroups;
  std::unique_ptr<ErofsStore> erofs;
  TemplateStore templates;
  Slots boots{kBootsAtOnce};
};

std::string sandbox_dir(const VmShared& sh, const std::string& id) { return sh.run_dir + "/" + id; }

// Makes `dir` (root, 0700) with q/ in it owned by `uid` (QEMU's): where QEMU may write.
Result<void> make_vm_dirs(const std::string& dir, uint32_t uid) {
  remove_tree(dir);
  if (::mkdir(dir.c_str(), 0700) != 0) return sys_fail("mkdir(" + dir + ")");
  const std::string q = dir + "/q";
  if (::mkdir(q.c_str(), 0700) != 0 || ::chown(q.c_str(), uid, uid) != 0)
    return sys_fail("mkdir/chown(" + q + ")");
  return {};
}

// QEMU's stderr, written by the daemon's open file, so QEMU needs no rights on it.
Result<UniqueFd> open_log(const std::string& q) {
  UniqueFd fd(
      ::open((q + "/qemu.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600));
  if (!fd) return sys_fail("open(" + q + "/qemu.log)");
  return fd;
}

Result<UniqueFd> connect_unix(const std::string& path) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (path.size() >= sizeof(sa.sun_path))
    return fail(Code::kInvalidArgument, "socket path too long: " + path);
  std::memcpy(sa.sun_path, path.data(), path.size());
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return sys_fail("socket(AF_UNIX)");
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0)
    return sys_fail("connect(" + path + ")");
  return fd;
}

// What went wrong with a QEMU that exited, from its status and its logs.
std::string exit_story(sys::Pidfd& proc, const std::string& q) {
  siginfo_t si{};
  std::string what = "QEMU is gone";
  if (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(proc.fd()), &si,
               WEXITED | WNOHANG | WNOWAIT) == 0 &&
      si.si_pid != 0) {
    if (si.si_code == CLD_EXITED && si.si_status == 1)
      what = "QEMU exited with status 1 (a guest kernel panic, or QEMU failed)";
    else if (si.si_code == CLD_EXITED && si.si_status == 0)
      what = "the guest powered off";
    else if (si.si_code == CLD_EXITED)
      what = "QEMU exited with status " + std::to_string(si.si_status);
    else
      what = "QEMU was killed by signal " + std::to_string(si.si_status);
  }
  std::string con = last_lines(q + "/console.log");
  std::string log = last_lines(q + "/qemu.log", 3);
  if (!log.empty()) what += "; qemu: " + log;
  if (!con.empty()) what += "; console: " + con;
  return what;
}

// Connects to the agent's port socket once QEMU made it (QEMU alive meanwhile).
Result<UniqueFd> connect_agent(sys::Pidfd& proc, const std::string& q, Clock::time_point deadline) {
  const std::string path = q + "/agent.sock";
  for (;;) {
    auto fd = connect_unix(path);
    if (fd) return fd;
    if (proc.exited()) return fail(Code::kInternal, "VM did not start: " + exit_story(proc, q));
    if (Clock::now() > deadline) return std::unexpected(fd.error());
    std::this_thread::sleep_for(2ms);
  }
}

// Waits until the agent's first frame (kReady) is readable, without taking it.
Result<void> wait_ready(int fd, sys::Pidfd& proc, const std::string& q,
                        Clock::time_point deadline) {
  for (;;) {
    pollfd p[2] = {{fd, POLLIN, 0}, {proc.fd(), POLLIN, 0}};
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0)
      return fail(Code::kDeadlineExceeded, "the guest's agent did not answer in time; console: " +
                                               last_lines(q + "/console.log"));
    int r = ::poll(p, 2, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return sys_fail("poll(agent)");
    if (p[0].revents & POLLIN) {
      unsigned char h[proto::kHeaderSize];
      ssize_t n = ::recv(fd, h, sizeof h, MSG_PEEK | MSG_DONTWAIT);
      if (n == static_cast<ssize_t>(sizeof h)) {
        if (h[4] != static_cast<unsigned char>(proto::MsgType::kReady))
          return fail(Code::kInternal,
                      "the guest's agent spoke first with frame type " + std::to_string(h[4]));
        return {};
      }
      if (n == 0)
        return fail(Code::kInternal, "VM ended before its agent was ready: " + exit_story(proc, q));
      if (n < 0 && errno != EAGAIN && errno != EINTR)
        return fail(Code::kInternal, "VM ended before its agent was ready (" +
                                         std::string(std::strerror(errno)) +
                                         "): " + exit_story(proc, q));
      std::this_thread::sleep_for(1ms);  // a partial header
      continue;
    }
    if (p[0].revents & (POLLHUP | POLLERR))
      return fail(Code::kInternal, "VM ended before its agent was ready: " + exit_story(proc, q));
    if (p[1].revents & POLLIN)
      return fail(Code::kInternal, "VM ended before its agent was ready: " + exit_story(proc, q));
  }
}

Result<void> write_all(int fd, const std::string& bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return sys_fail("send(agent)");
    off += static_cast<size_t>(n);
  }
  return {};
}

// kConfigure: the clone's own hostname, the wall clock, a fresh random seed.
Result<void> send_configure(int fd, const std::string& id) {
  proto::Message m(proto::MsgType::kConfigure, 0);
  m.add(proto::Tag::kName, id);
  auto now = std::chrono::system_clock::now().time_since_epoch();
  m.add_u64(
      proto::Tag::kRealtimeNs,
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count()));
  char seed[32];
  if (::getrandom(seed, sizeof seed, 0) != static_cast<ssize_t>(sizeof seed))
    return sys_fail("getrandom");
  m.add(proto::Tag::kData, std::string_view(seed, sizeof seed));
  return write_all(fd, proto::encode(m));
}

Result<UniqueFd> memfd_of(const std::string& name, const std::string& content) {
  UniqueFd fd(static_cast<int>(::memfd_create(name.c_str(), MFD_CLOEXEC)));
  if (!fd) return sys_fail("memfd_create(" + name + ")");
  size_t off = 0;
  while (off < content.size()) {
    ssize_t n = ::write(fd.get(), content.data() + off, content.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return sys_fail("write(" + name + ")");
    off += static_cast<size_t>(n);
  }
  if (::lseek(fd.get(), 0, SEEK_SET) != 0) return sys_fail("lseek(" + name + ")");
  return fd;
}

// One QEMU under way: its process, its cgroup id and its directory.
struct Launched {
  sys::Pidfd proc;
  std::string cgroup_id;
  std::string dir;  // run or template dir (holds q/)
};

class MicrovmInstance final : public SandboxInstance {
 public:
  MicrovmInstance(std::shared_ptr<VmShared> sh, std::string id, sys::Pidfd proc, UniqueFd agent,
                  bool adopted)
      : sh_(std::move(sh)),
        id_(std::move(id)),
        proc_(std::move(proc)),
        agent_(std::move(agent)),
        adopted_(adopted) {}
  ~MicrovmInstance() override {
    auto r = destroy();
    if (!r) TP_SB_ERROR(id_, "destroy in destructor: {}", r.error().message());
  }
  const std::string& id() const override { return id_; }
  int agent_fd() const override { return agent_.get(); }
  void close_agent_fd() override { agent_.reset(); }
  pid_t pid() const override { return proc_.pid(); }
  bool alive() override { return !destroyed_ && !proc_.exited(); }

  Result<Usage> usage() override {
    if (destroyed_) return fail(Code::kConflict, "sandbox " + id_ + " is destroyed");
    auto s = sh_->cgroups->stats(id_);
    if (!s) return std::unexpected(s.error());
    auto k = oom_kills();
    return Usage{s->memory_bytes, s->memory_peak_bytes, s->cpu_usage_us, s->pids, k ? *k : 0};
  }

  // The guest kernel's OOM kills, counted from its console (the kernel reports
  // each one at error level, which `quiet` still prints), plus QEMU's own.
  Result<uint64_t> oom_kills() override {
    if (destroyed_) return fail(Code::kConflict, "sandbox " + id_ + " is destroyed");
    std::lock_guard lk(console_mu_);
    std::ifstream f(q() + "/console.log", std::ios::binary);
    if (f) {
      f.seekg(static_cast<std::streamoff>(console_off_));
      std::string chunk((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      size_t last_nl = chunk.rfind('\n');
      if (last_nl != std::string::npos) {
        std::string_view done(chunk.data(), last_nl + 1);
        for (size_t p = 0; (p = done.find("out of memory: Killed process", p)) != std::string::npos;
             ++p)
          ++guest_ooms_;
        for (size_t p = 0; (p = done.find("Out of memory: Killed process", p)) != std::string::npos;
             ++p)
          ++guest_ooms_;
        console_off_ += last_nl + 1;
      }
    }
    auto host = sh_->cgroups->oom_kills(id_);
    return guest_ooms_ + (host ? *host : 0);
  }

  std::string agent_address() const override {
    return destroyed_ ? std::string() : q() + "/agent.sock";
  }

  Result<void> freeze() override { return run_state("stop"); }
  Result<void> thaw() override { return run_state("cont"); }

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
    if (proc_.exited() && !adopted_)
      TP_SB_WARN(id_, "VM ended by itself: {}", exit_story(proc_, q()));
    TP_TRY(proc_.signal(SIGKILL));
    if (adopted_) {
      // Not our child: its pidfd says when it is gone; its new parent reaps it.
      pollfd pfd{proc_.fd(), POLLIN, 0};
      while (::poll(&pfd, 1, -1) < 0 && errno == EINTR) {
      }
    }
    auto reaped = proc_.reap();
    if (!reaped) {
      TP_SB_ERROR(id_, "reap QEMU: {}", reaped.error().message());
      return std::unexpected(reaped.error());
    }
    auto rm = sh_->cgroups->remove(id_, 0);
    if (!rm) {
      (void)sh_->cgroups->kill_all(id_);
      rm = sh_->cgroups->remove(id_);
    }
    if (!rm) {
      TP_SB_ERROR(id_, "remove cgroup: {}", rm.error().message());
      return rm;
    }
    proc_.close();
    // A guest kernel that panicked said so on its console (QEMU may still have
    // been on its way out when the node, seeing the agent's stream end, got here).
    if (std::string con = read_tail(q() + "/console.log", 16384);
        con.find("Kernel panic") != std::string::npos) {
      std::string line = con.substr(con.find("Kernel panic"));
      line = line.substr(0, line.find('\n'));
      TP_SB_WARN(id_, "the guest kernel panicked: {}", line);
    }
    remove_tree(sandbox_dir(*sh_, id_));
    destroyed_ = true;
    TP_SB_DEBUG(id_, "destroyed");
    return {};
  }

 private:
  std::string q() const { return sandbox_dir(*sh_, id_) + "/q"; }
  Result<void> run_state(const char* cmd) {
    if (destroyed_) return fail(Code::kConflict, "sandbox " + id_ + " is destroyed");
    auto qmp = Qmp::connect(q() + "/qmp.sock", 5s);
    if (!qmp) return std::unexpected(qmp.error());
    auto r = qmp->execute(cmd);
    if (!r) return std::unexpected(r.error());
    return {};
  }

  std::shared_ptr<VmShared> sh_;
  std::string id_;
  sys::Pidfd proc_;
  UniqueFd agent_;
  bool adopted_;
  std::atomic<bool> destroyed_{false};  // as the container tier's (read concurrently)
  // The console scan of oom_kills(), which the node may run from two threads at once
  // (an exec's start and another's end).
  std::mutex console_mu_;
  uint64_t console_off_ = 0;
  uint64_t guest_ooms_ = 0;
};

class MicrovmBackend final : public Backend {
 public:
  explicit MicrovmBackend(std::shared_ptr<VmShared> sh) : sh_(std::move(sh)) {}
  ~MicrovmBackend() override { sh_->cgroups->remove_parent_if_empty(); }
  std::string tier() const override { return "microvm"; }

  Result<std::unique_ptr<SandboxInstance>> create(const SandboxSpec& spec) override {
    auto r = create_impl(spec);
    if (!r) TP_SB_ERROR(spec.id, "create failed: {}", r.error().message());
    return r;
  }

  Result<std::unique_ptr<SandboxInstance>> adopt(const SandboxSpec& spec) override {
    if (!valid_sandbox_name(spec.id))
      return fail(Code::kInvalidArgument, "invalid sandbox id '" + spec.id + "'");
    const std::string dir = sandbox_dir(*sh_, spec.id);
    auto st = read_state(dir);
    if (!st) return std::unexpected(st.error());
    auto proc = open_saved(*st);
    if (!proc) return fail(Code::kNotFound, "QEMU of sandbox " + spec.id + " is gone");
    struct stat ss {};
    if (::lstat((dir + "/q/agent.sock").c_str(), &ss) != 0 || !S_ISSOCK(ss.st_mode))
      return fail(Code::kNotFound, "agent socket of sandbox " + spec.id + " is missing");
    TP_SB_INFO(spec.id, "adopted VM, QEMU pid {}", st->pid);
    return std::unique_ptr<SandboxInstance>(
        std::make_unique<MicrovmInstance>(sh_, spec.id, std::move(*proc), UniqueFd(), true));
  }

  std::vector<std::string> cleanup_orphans(const std::vector<std::string>& keep) override {
    std::set<std::string> keep_set(keep.begin(), keep.end());
    std::set<std::string> cleaned;
    if (auto runs = sys::real_sys().list_dirs(sh_->run_dir)) {
      for (const auto& id : *runs) {
        if (keep_set.contains(id)) continue;
        const std::string dir = sandbox_dir(*sh_, id);
        if (auto st = read_state(dir)) {
          if (auto proc = open_saved(*st)) {
            (void)proc->signal(SIGKILL);
            pollfd pfd{proc->fd(), POLLIN, 0};
            (void)::poll(&pfd, 1, 5000);
          }
        }
        remove_tree(dir);
        cleaned.insert(id);
      }
    }
    for (const auto& id : sh_->cgroups->list()) {
      if (keep_set.contains(id)) continue;
      if (auto k = sh_->cgroups->kill_all(id); !k) {
        TP_SB_WARN(id, "orphan VM kill: {}", k.error().message());
        continue;
      }
      if (auto rm = sh_->cgroups->remove(id); !rm) {
        TP_SB_WARN(id, "orphan VM cgroup remove: {}", rm.error().message());
        continue;
      }
      cleaned.insert(id);
    }
    for (const auto& id : cleaned) TP_SB_INFO(id, "cleaned up orphan VM");
    return {cleaned.begin(), cleaned.end()};
  }

 private:
  Result<std::unique_ptr<SandboxInstance>> create_impl(const SandboxSpec& spec);
  Result<VmConfig> config_of(const SandboxSpec& spec);
  Result<Launched> launch(const std::string& name, const std::string& dir, const VmConfig& cfg,
                          uint32_t uid_base, int fd3, int fd4, uint64_t memory_bytes);
  Result<std::shared_ptr<const Template>> build_template(const VmConfig& cfg,
                                                         const std::string& key);
  // A sandbox's VM from `tpl` (a clone) or cold (tpl null); ready when it returns.
  Result<std::unique_ptr<SandboxInstance>> start(const SandboxSpec& spec, VmConfig cfg,
                                                 const Template* tpl);
  void kill_launched(Launched& l) {
    (void)l.proc.signal(SIGKILL);
    (void)l.proc.reap();
    (void)sh_->cgroups->kill_all(l.cgroup_id);
    (void)sh_->cgroups->remove(l.cgroup_id);
  }
  std::string key_of(const VmConfig& cfg) const {
    std::string k = sh_->assets_id + "|" + (sh_->accel == Accel::kKvm ? "kvm" : "tcg") + "|" +
                    std::to_string(cfg.vcpus) + "|" + std::to_string(cfg.memory_mb) + "|" +
                    std::to_string(cfg.disk_kb) + "|" + std::to_string(cfg.tmp_kb) + "|" +
                    std::to_string(cfg.pids) + "|" + kernel_cmdline(cfg);
    for (const auto& d : cfg.disks) k += "|" + d;
    return k;
  }

  std::shared_ptr<VmShared> sh_;
};

Result<VmConfig> MicrovmBackend::config_of(const SandboxSpec& spec) {
  VmConfig cfg;
  cfg.accel = sh_->accel;
  cfg.tsc_khz = sh_->tsc();
  cfg.vcpus = static_cast<uint32_t>(std::clamp(std::ceil(spec.cpus), 1.0, 16.0));
  cfg.memory_mb = std::max<uint64_t>(spec.memory_bytes >> 20, 128);
  cfg.disk_kb = std::max<uint64_t>(spec.disk_bytes >> 10, 16 << 10);
  cfg.tmp_kb = std::max<uint64_t>(spec.tmp_bytes >> 10, 1 << 10);
  cfg.pids = spec.pids_max;
  if (spec.layers.empty()) {
    if (spec.image != "host" && !spec.image.empty())
      return fail(Code::kInvalidArgument, "image '" + spec.image + "' has no layers");
    cfg.disks = {"/assets/host.erofs"};
    return cfg;
  }
  if (!sh_->opts.layers)
    return fail(Code::kNotFound, "layer " + spec.layers.front() + " not found (no layer store)");
  if (spec.layers.size() > 16)
    return fail(Code::kInvalidArgument, "the microvm tier takes images of at most 16 layers");
  for (const auto& digest : spec.layers) {
    auto dir = sh_->opts.layers->layer_dir(digest);
    if (!dir) return std::unexpected(dir.error());
    auto img = sh_->erofs->image_for(digest, *dir);
    if (!img) return std::unexpected(img.error());
    cfg.disks.push_back("/images/" + *img);
  }
  return cfg;
}

Result<Launched> MicrovmBackend::launch(const std::string& name, const std::string& dir,
                                        const VmConfig& cfg, uint32_t uid_base, int fd3, int fd4,
                                        uint64_t memory_bytes) {
  TP_TRY(make_vm_dirs(dir, uid_base + 1));
  auto log = open_log(dir + "/q");
  if (!log) return std::unexpected(log.error());
  VmConfig c = cfg;
  JailSpec j;
  j.name = name;
  j.mnt_dir = sh_->mnt_dir;
  j.vm_dir = dir + "/q";
  j.assets_dir = sh_->opts.assets_dir;
  j.images_dir = sh_->erofs->dir();
  j.kvm = sh_->accel == Accel::kKvm;
  j.uid_base = uid_base;
  j.qemu_exe = sh_->qemu_exe.get();
  j.fd3 = fd3;
  j.fd4 = fd4;
  j.log_fd = log->get();
  j.argv = qemu_args(c);
  j.cgroup_id = name;
  j.limits.memory_bytes = memory_bytes + (sh_->accel == Accel::kKvm ? kOverheadKvm : kOverheadTcg);
  j.limits.cpus = std::max(1.0, static_cast<double>(c.vcpus));
  j.limits.pids_max = kQemuPids;
  auto proc = spawn_jailed(j, *sh_->cgroups);
  if (!proc) {
    remove_tree(dir);
    return std::unexpected(proc.error());
  }
  return Launched{std::move(*proc), name, dir};
}

Result<std::shared_ptr<const Template>> MicrovmBackend::build_template(const VmConfig& base,
                                                                       const std::string& key) {
  SlotGuard slot(sh_->boots);
  const auto t0 = Clock::now();
  const std::string hash = fmt::format("{:016x}", std::hash<std::string>{}(key));
  const std::string name = "tpl-" + hash;
  const std::string dir = sh_->tpl_dir + "/" + hash;
  VmConfig cfg = base;
  cfg.memory = MemoryMode::kTemplate;
  auto tpl = std::make_shared<Template>();
  tpl->memory_bytes = cfg.memory_mb << 20;
  tpl->memory.reset(
      static_cast<int>(::memfd_create("tp-template", MFD_CLOEXEC | MFD_ALLOW_SEALING)));
  if (!tpl->memory) return sys_fail("memfd_create(tp-template)");
  if (::ftruncate(tpl->memory.get(), static_cast<off_t>(tpl->memory_bytes)) != 0)
    return sys_fail("ftruncate(template memory)");
  auto l =
      launch(name, dir, cfg, sh_->opts.default_uid_base, tpl->memory.get(), -1, tpl->memory_bytes);
  if (!l) return std::unexpected(l.error());
  struct Cleanup {
    MicrovmBackend* b;
    Launched& l;
    ~Cleanup() {
      b->kill_launched(l);
      remove_tree(l.dir);
    }
  } cleanup{this, *l};
  const std::string q = dir + "/q";
  const auto deadline = Clock::now() + kBootReady;
  auto qmp = Qmp::connect(q + "/qmp.sock", 10s);
  if (!qmp)
    return fail(Code::kInternal,
                "template VM: " + qmp.error().message() + "; " + exit_story(l->proc, q));
  {
    // One session to the end, so that the agent is in its loop when it is saved,
    // and gone from the port again, so that clones start without one.
    auto agent = connect_agent(l->proc, q, deadline);
    if (!agent) return std::unexpected(agent.error());
    TP_TRY(wait_ready(agent->get(), l->proc, q, deadline));
  }
  for (;;) {
    if (read_tail(q + "/console.log", 4096).find(kAgentIdle) != std::string::npos) break;
    if (l->proc.exited()) return fail(Code::kInternal, "template VM: " + exit_story(l->proc, q));
    if (Clock::now() > deadline)
      return fail(Code::kDeadlineExceeded, "template VM: the agent did not go idle");
    std::this_thread::sleep_for(5ms);
  }
  // Not stopped first: migration stops the guest itself to save the devices (its RAM,
  // shared, is left as it is then), and the saved run state stays "running", so
  // that clones run as soon as their state is loaded.
  boost::json::object cap{{"capability", "x-ignore-shared"}, {"state", true}};
  TP_TRY(qmp->execute("migrate-set-capabilities", {{"capabilities", boost::json::array{cap}}}));
  auto state = memfd_of("tp-template-state", "");
  if (!state) return std::unexpected(state.error());
  TP_TRY(qmp->execute("getfd", {{"fdname", "state"}}, state->get()));
  TP_TRY(qmp->execute("migrate", {{"uri", "fd:state"}}));
  for (;;) {
    auto m = qmp->execute("query-migrate");
    if (!m) return std::unexpected(m.error());
    std::string status;
    if (m->is_object())
      if (auto* s = m->as_object().if_contains("status"); s && s->is_string())
        status = s->as_string();
    if (status == "completed") break;
    if (status == "failed" || status == "cancelled")
      return fail(Code::kInternal, "template VM: saving its state " + status);
    if (Clock::now() > deadline)
      return fail(Code::kDeadlineExceeded, "template VM: saving its state took too long");
    std::this_thread::sleep_for(5ms);
  }
  (void)qmp->execute("quit", {}, -1, 2s);
  struct stat st {};
  if (::fstat(state->get(), &st) != 0) return sys_fail("fstat(template state)");
  tpl->state.resize(static_cast<size_t>(st.st_size));
  if (::pread(state->get(), tpl->state.data(), tpl->state.size(), 0) != st.st_size)
    return sys_fail("pread(template state)");
  // Only clones' private mappings from now on: the RAM cannot change any more.
  l->proc.signal(SIGKILL);
  (void)l->proc.reap();
  if (::fcntl(tpl->memory.get(), F_ADD_SEALS,
              F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0)
    return sys_fail("fcntl(template memory, F_ADD_SEALS)");
  spdlog::info("microvm: template {} ready in {} ms ({} MiB RAM, {} KiB device state)", hash,
               std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count(),
               cfg.memory_mb, tpl->state.size() >> 10);
  return std::shared_ptr<const Template>(std::move(tpl));
}

Result<std::unique_ptr<SandboxInstance>> MicrovmBackend::start(const SandboxSpec& spec,
                                                               VmConfig cfg, const Template* tpl) {
  const std::string dir = sandbox_dir(*sh_, spec.id);
  const uint32_t base = spec.uid_base ? spec.uid_base : sh_->opts.default_uid_base;
  std::optional<SlotGuard> slot;
  UniqueFd state;
  if (tpl) {
    cfg.memory = MemoryMode::kClone;
    auto s = memfd_of("tp-clone-state", tpl->state);
    if (!s) return std::unexpected(s.error());
    state = std::move(*s);
  } else {
    cfg.memory = MemoryMode::kPlain;
    slot.emplace(sh_->boots);
  }
  auto l = launch(spec.id, dir, cfg, base, tpl ? tpl->memory.get() : -1, state.get(),
                  cfg.memory_mb << 20);
  if (!l) return std::unexpected(l.error());
  state.reset();
  auto unwind = [&](Error e) -> Result<std::unique_ptr<SandboxInstance>> {
    kill_launched(*l);
    remove_tree(dir);
    return std::unexpected(std::move(e));
  };
  const std::string q = dir + "/q";
  const auto deadline = Clock::now() + (tpl ? kCloneReady : kBootReady);
  if (tpl) {
    // The template's device state, RAM left out: it is the file at fd 3.
    auto qmp = Qmp::connect(q + "/qmp.sock", 10s);
    if (!qmp)
      return unwind(
          Error{Code::kInternal, 0, qmp.error().message() + "; " + exit_story(l->proc, q)});
    boost::json::object cap{{"capability", "x-ignore-shared"}, {"state", true}};
    if (auto r =
            qmp->execute("migrate-set-capabilities", {{"capabilities", boost::json::array{cap}}});
        !r)
      return unwind(r.error());
    if (auto r = qmp->execute("migrate-incoming", {{"uri", "fd:4"}}); !r) return unwind(r.error());
  }
  auto agent = connect_agent(l->proc, q, deadline);
  if (!agent) return unwind(agent.error());
  if (auto r = send_configure(agent->get(), spec.id); !r) return unwind(r.error());
  if (auto r = wait_ready(agent->get(), l->proc, q, deadline); !r) {
    Error e = r.error();
    if (auto qmp = Qmp::connect(q + "/qmp.sock", 2s)) {
      // What QEMU says about the guest, for the message.
      for (const char* cmd : {"query-status", "query-migrate"})
        if (auto v = qmp->execute(cmd, {}, -1, 2s))
          e.context += std::string("; ") + cmd + ": " + boost::json::serialize(*v);
    }
    return unwind(e);
  }
  if (auto r = write_state(dir, l->proc.pid()); !r) return unwind(r.error());
  TP_SB_DEBUG(spec.id, "VM up ({}), QEMU pid {}, host uid {}", tpl ? "clone" : "cold boot",
              l->proc.pid(), base + 1);
  return std::unique_ptr<SandboxInstance>(std::make_unique<MicrovmInstance>(
      sh_, spec.id, std::move(l->proc), std::move(*agent), false));
}

Result<std::unique_ptr<SandboxInstance>> MicrovmBackend::create_impl(const SandboxSpec& spec) {
  if (!valid_sandbox_name(spec.id))
    return fail(Code::kInvalidArgument, "invalid sandbox id '" + spec.id + "'");
  if (spec.disk_bytes == 0 || spec.tmp_bytes == 0 || spec.memory_bytes == 0)
    return fail(Code::kInvalidArgument, "memory, disk and tmp sizes must be > 0");
  if (spec.memory_bytes < (128ull << 20))
    return fail(Code::kInvalidArgument, "the microvm tier needs memory_mb >= 128");
  auto cfg = config_of(spec);
  if (!cfg) return std::unexpected(cfg.error());
  if (sh_->opts.templates) {
    const std::string key = key_of(*cfg);
    auto tpl = sh_->templates.get(key, [&] { return build_template(*cfg, key); });
    if (tpl) {
      auto inst = start(spec, *cfg, tpl->get());
      if (inst) return inst;
      TP_SB_WARN(spec.id, "clone failed ({}); dropping the template, cold boot instead",
                 inst.error().message());
      sh_->templates.drop(key);
    } else {
      TP_SB_WARN(spec.id, "no template ({}): cold boot", tpl.error().message());
    }
  }
  return start(spec, *cfg, nullptr);
}

Result<std::unique_ptr<Backend>> make_backend(const MicrovmOptions& opts) {
  if (opts.data_dir.empty() || opts.data_dir[0] != '/')
    return fail(Code::kInvalidArgument, "data_dir must be an absolute path");
  auto sh = std::make_shared<VmShared>();
  sh->opts = opts;
  for (const char* f : {"vmlinuz", "initrd.img", "host.erofs", "assets.id"}) {
    const std::string p = opts.assets_dir + "/" + f;
    if (::access(p.c_str(), R_OK) != 0)
      return fail(Code::kNotFound,
                  "microvm asset " + p + " is missing (scripts/microvm-assets.sh builds it)");
  }
  {
    std::ifstream f(opts.assets_dir + "/assets.id");
    std::getline(f, sh->assets_id);
  }
  sh->qemu_exe.reset(::open(opts.qemu_path.c_str(), O_PATH | O_CLOEXEC));
  if (!sh->qemu_exe) return sys_fail("open(" + opts.qemu_path + ", O_PATH)");
  // QEMU runs unprivileged: KVM needs a /dev/kvm that every user may open (systemd's
  // default mode 0666). A root-only one (mode 0600) is not KVM for this tier.
  std::string why_tcg = "asked for";
  if (opts.accel == "kvm" || opts.accel == "auto") {
    struct stat ks {};
    UniqueFd kvm(::open("/dev/kvm", O_RDWR | O_CLOEXEC));
    if (!kvm) {
      why_tcg = std::string("/dev/kvm: ") + std::strerror(errno);
    } else if (::fstat(kvm.get(), &ks) != 0 || (ks.st_mode & 0006) != 0006) {
      why_tcg = fmt::format("/dev/kvm (mode {:o}) is not open to QEMU's unprivileged uid",
                            ks.st_mode & 0777);
    } else {
      sh->accel = Accel::kKvm;
    }
    if (opts.accel == "kvm" && sh->accel != Accel::kKvm)
      return fail(Code::kInvalidArgument, "--microvm-accel kvm: " + why_tcg);
  } else if (opts.accel != "tcg") {
    return fail(Code::kInvalidArgument, "accelerator must be auto, kvm or tcg");
  }
  sh->root = opts.data_dir + "/microvm";
  sh->run_dir = sh->root + "/run";
  sh->tpl_dir = sh->root + "/templates";
  sh->mnt_dir = sh->root + "/mnt";
  const std::pair<std::string, mode_t> dirs[] = {
      {opts.data_dir, 0755}, {sh->root, 0755}, {sh->run_dir, 0700}, {sh->mnt_dir, 0755}};
  for (const auto& [d, mode] : dirs) {
    if (::mkdir(d.c_str(), mode) != 0 && errno != EEXIST) return sys_fail("mkdir(" + d + ")");
  }
  // Templates belong to a daemon run: what an earlier one left is rebuilt on demand.
  remove_tree(sh->tpl_dir);
  if (::mkdir(sh->tpl_dir.c_str(), 0700) != 0) return sys_fail("mkdir(" + sh->tpl_dir + ")");
  sh->erofs = std::make_unique<ErofsStore>(sh->root + "/erofs", opts.mkfs_erofs_path,
                                           opts.storage_uid_base);
  TP_TRY(sh->erofs->init());
  auto layout = sys::detect_layout(sys::real_sys());
  if (!layout) return std::unexpected(layout.error());
  sh->cgroups =
      std::make_unique<sys::CgroupManager>(sys::real_sys(), *layout, opts.cgroup_name + "-microvm");
  TP_TRY(sh->cgroups->init());
  for (const auto& id : sh->cgroups->list())
    if (id.starts_with("tpl-")) {
      (void)sh->cgroups->kill_all(id);
      (void)sh->cgroups->remove(id);
    }
  spdlog::info("microvm backend: {} ({}), assets {} ({}), templates {}",
               sh->accel == Accel::kKvm ? "KVM" : "TCG",
               sh->accel == Accel::kKvm ? "hardware isolation"
                                        : fmt::format("not a security boundary: {}", why_tcg),
               opts.assets_dir, sh->assets_id, opts.templates ? "on" : "off");
  return std::unique_ptr<Backend>(std::make_unique<MicrovmBackend>(std::move(sh)));
}

}  // namespace
}  // namespace microvm

Result<std::unique_ptr<Backend>> make_microvm_backend(const MicrovmOptions& opts) {
  return microvm::make_backend(opts);
}

}  // namespace tp::runtime
