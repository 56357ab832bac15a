#include "runtime/microvm/erofs_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <set>

#include "common/log.h"
#include "runtime/container/child_plan.h"
#include "runtime/microvm/qemu_jail.h"
#include "sys/fd.h"
#include "sys/pidfd.h"
#include "sys/userns.h"

namespace tp::runtime::microvm {
namespace {

using sys::UniqueFd;

bool valid_digest(const std::string& d) {
  if (!d.starts_with("sha256:") || d.size() != 7 + 64) return false;
  return std::all_of(d.begin() + 7, d.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::atomic<uint64_t> g_seq{0};

}  // namespace

Result<void> ErofsStore::init() {
  if (::mkdir(dir_.c_str(), 0755) != 0 && errno != EEXIST) return sys_fail("mkdir(" + dir_ + ")");
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir_, ec))
    if (e.path().filename().string().starts_with("tmp-")) std::filesystem::remove_all(e.path(), ec);
  return {};
}

Result<std::string> ErofsStore::image_for(const std::string& digest, const std::string& layer_dir) {
  if (!valid_digest(digest)) return fail(Code::kInvalidArgument, "bad layer digest " + digest);
  const std::string name = digest.substr(7) + ".erofs";
  std::shared_ptr<std::mutex> m;
  {
    std::lock_guard lk(mu_);
    auto& slot = per_layer_[name];
    if (!slot) slot = std::make_shared<std::mutex>();
    m = slot;
  }
  std::lock_guard build_lock(*m);
  struct stat st {};
  if (::stat((dir_ + "/" + name).c_str(), &st) == 0 && S_ISREG(st.st_mode)) return name;
  TP_TRY(build(layer_dir, name));
  return name;
}

Result<void> ErofsStore::build(const std::string& layer_dir, const std::string& name) {
  // A directory only the build's user namespace root (host storage_base_) can write.
  const std::string tmp =
      dir_ + "/tmp-" + std::to_string(::getpid()) + "-" + std::to_string(g_seq.fetch_add(1));
  if (::mkdir(tmp.c_str(), 0700) != 0) return sys_fail("mkdir(" + tmp + ")");
  struct TmpOwner {
    std::string path;
    ~TmpOwner() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  } tmp_owner{tmp};
  if (::chown(tmp.c_str(), storage_base_, storage_base_) != 0)
    return sys_fail("chown(" + tmp + ")");
  UniqueFd exe(::open(mkfs_.c_str(), O_PATH | O_CLOEXEC));
  if (!exe) return sys_fail("open(" + mkfs_ + ")");
  UniqueFd null_fd(::open("/dev/null", O_RDWR | O_CLOEXEC));
  if (!null_fd) return sys_fail("open(/dev/null)");

  container::ChildPlan plan;
  plan.simple(container::OpKind::kWaitSync, "read(sync pipe)");
  plan.simple(container::OpKind::kBecomeRoot, "setresuid(0) in the user namespace");
  plan.finish();
  const std::string out = tmp + "/" + name;
  for (const std::string& a : {std::string("mkfs.erofs"), std::string("--quiet"), out, layer_dir})
    plan.argv.push_back(plan.keep(a));
  plan.exe_fd = exe.get();
  plan.agent_child = null_fd.get();
  // Storage ids back to 0..65535, as the guest should see them.
  auto proc = run_plan(
      plan, CLONE_NEWUSER, [&](pid_t pid) { return sys::write_id_maps(pid, storage_base_); },
      "mkfs.erofs for " + layer_dir);
  if (!proc) return std::unexpected(proc.error());
  siginfo_t si{};
  while (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(proc->fd()), &si,
                  WEXITED | WNOWAIT) != 0 &&
         errno == EINTR) {
  }
  (void)proc->reap();
  if (si.si_code != CLD_EXITED || si.si_status != 0)
    return fail(Code::kInternal, "mkfs.erofs " + out + " " + layer_dir + " failed (" +
                                     (si.si_code == CLD_EXITED ? "status " : "signal ") +
                                     std::to_string(si.si_status) + ")");
  const std::string final_path = dir_ + "/" + name;
  if (::chown(out.c_str(), 0, 0) != 0 || ::chmod(out.c_str(), 0644) != 0)
    return sys_fail("chown/chmod(" + out + ")");
  if (::rename(out.c_str(), final_path.c_str()) != 0)
    return sys_fail("rename(" + out + ", " + final_path + ")");
  spdlog::info("microvm: built {} from {}", final_path, layer_dir);
  return {};
}

size_t ErofsStore::remove_except(const std::vector<std::string>& live) {
  std::set<std::string> keep;
  for (const auto& d : live)
    if (valid_digest(d)) keep.insert(d.substr(7) + ".erofs");
  size_t n = 0;
  std::error_code ec;
  std::lock_guard lk(mu_);
  for (const auto& e : std::filesystem::directory_iterator(dir_, ec)) {
    const std::string f = e.path().filename().string();
    if (!f.ends_with(".erofs") || keep.contains(f)) continue;
    if (std::filesystem::remove(e.path(), ec)) ++n;
    per_layer_.erase(f);
  }
  return n;
}

}  // namespace tp::runtime::microvm
