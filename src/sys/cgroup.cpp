#include "sys/cgroup.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <set>

#include "common/log.h"
#include "sys/mountinfo.h"

namespace tp::sys {
namespace {

constexpr const char* kV1Required[] = {"memory", "cpu", "pids"};
constexpr const char* kV1Optional[] = {"cpuacct", "freezer"};

uint64_t to_u64(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.remove_suffix(1);
  uint64_t v = 0;
  std::from_chars(s.data(), s.data() + s.size(), v);
  return v;
}

bool has_word(std::string_view text, std::string_view w) {
  for (auto t : split_fields(text, ' ')) {
    while (!t.empty() && t.back() == '\n') t.remove_suffix(1);
    if (t == w) return true;
  }
  return false;
}

}  // namespace

uint64_t keyed_value(std::string_view text, std::string_view key) {
  for (auto line : split_fields(text, '\n')) {
    auto sp = line.find(' ');
    if (sp == std::string_view::npos) continue;
    if (line.substr(0, sp) == key) return to_u64(line.substr(sp + 1));
  }
  return 0;
}

Result<CgroupLayout> parse_layout(std::string_view mountinfo, SysApi& sys) {
  std::map<std::string, std::string> v1;
  std::vector<std::string> v2_mounts;
  for (const auto& m : parse_mountinfo(mountinfo)) {
    if (m.fs_type == "cgroup2") {
      v2_mounts.push_back(m.mount_point);
    } else if (m.fs_type == "cgroup") {
      for (auto opt : split_fields(m.super_options, ',')) {
        std::string o(opt);
        if (!v1.contains(o)) v1[o] = m.mount_point;
      }
    }
  }
  for (const auto& m : v2_mounts) {
    if (m == "/sys/fs/cgroup") return CgroupLayout{CgroupVersion::kV2, m, {}};
  }
  bool v1_ok = std::all_of(std::begin(kV1Required), std::end(kV1Required),
                           [&](const char* c) { return v1.contains(c); });
  if (v1_ok) {
    CgroupLayout l{CgroupVersion::kV1, "", {}};
    for (const char* c : kV1Required) l.v1_mounts[c] = v1[c];
    for (const char* c : kV1Optional)
      if (v1.contains(c)) l.v1_mounts[c] = v1[c];
    return l;
  }
  for (const auto& m : v2_mounts) {
    auto ctrls = sys.read_file(m + "/cgroup.controllers");
    if (ctrls && has_word(*ctrls, "memory") && has_word(*ctrls, "pids"))
      return CgroupLayout{CgroupVersion::kV2, m, {}};
  }
  return fail(
      Code::kUnavailable,
      "no usable cgroup hierarchy: need cgroup2 with memory+pids, or v1 memory, cpu and pids");
}

Result<CgroupLayout> detect_layout(SysApi& sys) {
  auto mi = sys.read_file("/proc/self/mountinfo");
  if (!mi) return std::unexpected(mi.error());
  return parse_layout(*mi, sys);
}

CgroupManager::CgroupManager(SysApi& sys, CgroupLayout layout, std::string parent)
    : sys_(sys), layout_(std::move(layout)), parent_(std::move(parent)) {}

std::vector<std::string> CgroupManager::hierarchy_roots() const {
  if (layout_.version == CgroupVersion::kV2) return {layout_.v2_root};
  std::vector<std::string> out;
  for (const auto& [c, m] : layout_.v1_mounts)
    if (std::find(out.begin(), out.end(), m) == out.end()) out.push_back(m);
  return out;
}

std::vector<std::string> CgroupManager::dirs(const std::string& id) const {
  std::vector<std::string> out;
  for (const auto& r : hierarchy_roots()) out.push_back(r + "/" + parent_ + "/" + id);
  return out;
}

std::string CgroupManager::controller_dir(const std::string& ctrl, const std::string& id) const {
  if (layout_.version == CgroupVersion::kV2) return layout_.v2_root + "/" + parent_ + "/" + id;
  auto it = layout_.v1_mounts.find(ctrl);
  if (it == layout_.v1_mounts.end()) return {};
  return it->second + "/" + parent_ + "/" + id;
}

Result<void> CgroupManager::init() {
  for (const auto& r : hierarchy_roots()) {
    std::string p = r + "/" + parent_;
    if (!sys_.exists(p)) {
      auto m = sys_.mkdir(p, 0755);
      if (!m && m.error().sys_errno != EEXIST) return m;
    }
  }
  if (layout_.version == CgroupVersion::kV2) {
    // Controllers must be enabled top-down for the sandboxes' cgroups to get them.
    for (const std::string& dir : {layout_.v2_root, layout_.v2_root + "/" + parent_}) {
      for (const char* c : {"memory", "pids", "cpu"}) {
        auto w = sys_.write_file(dir + "/cgroup.subtree_control", std::string("+") + c);
        if (!w && std::string(c) != "cpu") return w;  // cpu is optional
      }
    }
  }
  return {};
}

Result<void> CgroupManager::write_limits(const std::string& id, const CgroupLimits& lim) {
  if (layout_.version == CgroupVersion::kV2) {
    std::string d = controller_dir("", id);
    if (lim.memory_bytes) {
      TP_TRY(sys_.write_file(d + "/memory.max", std::to_string(lim.memory_bytes)));
      if (sys_.exists(d + "/memory.swap.max")) TP_TRY(sys_.write_file(d + "/memory.swap.max", "0"));
    }
    if (lim.cpus > 0 && sys_.exists(d + "/cpu.max")) {
      auto quota = static_cast<uint64_t>(lim.cpus * kCpuPeriodUs);
      TP_TRY(sys_.write_file(d + "/cpu.max", std::to_string(std::max<uint64_t>(quota, 1000)) + " " +
                                                 std::to_string(kCpuPeriodUs)));
    }
    if (lim.pids_max) TP_TRY(sys_.write_file(d + "/pids.max", std::to_string(lim.pids_max)));
    if (lim.lowest_cpu_weight && sys_.exists(d + "/cpu.weight"))
      TP_TRY(sys_.write_file(d + "/cpu.weight", "1"));
    // An idle group (5.15+) runs only when its siblings leave a CPU idle: a weight
    // alone still gets its share on a CPU where its siblings have nothing runnable.
    // After the weight, which an idle group refuses.
    if (lim.lowest_cpu_weight && sys_.exists(d + "/cpu.idle"))
      TP_TRY(sys_.write_file(d + "/cpu.idle", "1"));
    return {};
  }
  std::string mem = controller_dir("memory", id);
  if (lim.memory_bytes) {
    TP_TRY(sys_.write_file(mem + "/memory.limit_in_bytes", std::to_string(lim.memory_bytes)));
    // memsw is memory+swap: equal to the memory limit means no swap at all.
    if (sys_.exists(mem + "/memory.memsw.limit_in_bytes")) {
      TP_TRY(
          sys_.write_file(mem + "/memory.memsw.limit_in_bytes", std::to_string(lim.memory_bytes)));
    } else if (sys_.exists(mem + "/memory.swappiness")) {
      TP_TRY(sys_.write_file(mem + "/memory.swappiness", "0"));
    }
    // v1 accounts TCP buffers apart from memory (v2 charges them to memory.max), and
    // only once this limit is set: without it a sandbox's unread sockets draw on the
    // host-wide net.ipv4.tcp_mem alone.
    if (sys_.exists(mem + "/memory.kmem.tcp.limit_in_bytes"))
      TP_TRY(sys_.write_file(mem + "/memory.kmem.tcp.limit_in_bytes",
                             std::to_string(lim.memory_bytes)));
  }
  if (lim.lowest_cpu_weight) {
    const std::string cpu = controller_dir("cpu", id);
    TP_TRY(sys_.write_file(cpu + "/cpu.shares", "2"));
    if (sys_.exists(cpu + "/cpu.idle")) TP_TRY(sys_.write_file(cpu + "/cpu.idle", "1"));
  }
  if (lim.cpus > 0) {
    std::string cpu = controller_dir("cpu", id);
    auto quota = static_cast<uint64_t>(lim.cpus * kCpuPeriodUs);
    // A new cgroup has the default period already. Each write of the period or the
    // quota walks every cpu cgroup on the host (the kernel checks the whole tree's
    // bandwidth), about one per live sandbox: skip the one that changes nothing.
    const std::string period = std::to_string(kCpuPeriodUs);
    auto now = sys_.read_file(cpu + "/cpu.cfs_period_us");
    if (!now || (*now != period && *now != period + "\n"))
      TP_TRY(sys_.write_file(cpu + "/cpu.cfs_period_us", period));
    TP_TRY(sys_.write_file(cpu + "/cpu.cfs_quota_us",
                           std::to_string(std::max<uint64_t>(quota, 1000))));
  }
  if (lim.pids_max)
    TP_TRY(sys_.write_file(controller_dir("pids", id) + "/pids.max", std::to_string(lim.pids_max)));
  return {};
}

Result<void> CgroupManager::make_dirs(const std::string& id) {
  std::vector<std::string> made;
  for (const auto& d : dirs(id)) {
    auto r = sys_.mkdir(d, 0755);
    if (!r && r.error().sys_errno == ENOENT) {
      // The parent vanished (an administrator or another tool removed it): make it again.
      r = init();
      if (r) r = sys_.mkdir(d, 0755);
    }
    if (!r) {
      for (auto it = made.rbegin(); it != made.rend(); ++it) (void)sys_.rmdir(*it);
      return r;
    }
    made.push_back(d);
  }
  return {};
}

Result<void> CgroupManager::create(const std::string& id, const CgroupLimits& limits) {
  TP_TRY(make_dirs(id));
  auto w = write_limits(id, limits);
  if (!w) {
    (void)remove(id, 0);
    return w;
  }
  return {};
}

Result<uint64_t> CgroupManager::reclaim_memory(const std::string& id) {
  const bool v2 = layout_.version == CgroupVersion::kV2;
  const std::string d = controller_dir(v2 ? "" : "memory", id);
  const std::string usage_file = d + (v2 ? "/memory.current" : "/memory.usage_in_bytes");
  auto usage = [&]() -> Result<uint64_t> {
    auto t = sys_.read_file(usage_file);
    if (!t) return std::unexpected(t.error());
    return std::strtoull(t->c_str(), nullptr, 10);
  };
  auto before = usage();
  if (!before) return std::unexpected(before.error());
  if (v2) {
    if (sys_.exists(d + "/memory.reclaim"))
      (void)sys_.write_file(d + "/memory.reclaim", std::to_string(*before));  // EAGAIN: partial
  } else if (sys_.exists(d + "/memory.force_empty")) {
    (void)sys_.write_file(d + "/memory.force_empty", "0");  // EBUSY: what cannot go stays
  }
  return usage();
}

Result<void> CgroupManager::attach(const std::string& id, pid_t pid) {
  for (const auto& d : dirs(id)) TP_TRY(sys_.write_file(d + "/cgroup.procs", std::to_string(pid)));
  return {};
}

std::vector<std::string> CgroupManager::entry_files(const std::string& id) const {
  std::vector<std::string> out;
  const char* file = layout_.version == CgroupVersion::kV2 ? "/cgroup.procs" : "/tasks";
  for (const auto& d : dirs(id)) out.push_back(d + file);
  return out;
}

Result<std::vector<std::string>> CgroupManager::enter_thread(const std::string& id) {
  if (!can_enter_thread())
    return fail(Code::kInternal, "a v2 cgroup takes whole processes, not threads");
  // Lines "hierarchy-id:controller,list:/path" of the calling thread.
  auto own = sys_.read_file("/proc/thread-self/cgroup");
  if (!own) return std::unexpected(own.error());
  std::vector<std::string> previous;
  for (const auto& root : hierarchy_roots()) {
    std::string path;
    for (auto line : split_fields(*own, '\n')) {
      auto a = line.find(':');
      auto b = a == std::string_view::npos ? a : line.find(':', a + 1);
      if (b == std::string_view::npos) continue;
      bool mine = false;
      for (auto c : split_fields(line.substr(a + 1, b - a - 1), ',')) {
        auto it = layout_.v1_mounts.find(std::string(c));
        if (it != layout_.v1_mounts.end() && it->second == root) mine = true;
      }
      if (mine) {
        path = std::string(line.substr(b + 1));
        break;
      }
    }
    if (path.empty()) return fail(Code::kInternal, "no cgroup of this thread under " + root);
    previous.push_back(path == "/" ? root : root + path);
  }
  const auto targets = dirs(id);
  for (size_t i = 0; i < targets.size(); ++i) {
    auto w = sys_.write_file(targets[i] + "/tasks", "0");
    if (!w) {
      (void)leave_thread({previous.begin(), previous.begin() + static_cast<std::ptrdiff_t>(i)});
      return std::unexpected(w.error());
    }
  }
  return previous;
}

Result<void> CgroupManager::leave_thread(const std::vector<std::string>& previous) {
  const auto roots = hierarchy_roots();
  for (size_t i = 0; i < previous.size(); ++i) {
    auto w = sys_.write_file(previous[i] + "/tasks", "0");
    if (!w && i < roots.size()) {
      spdlog::warn("cgroup: cannot move a daemon thread back to {} ({}); it goes to {}",
                   previous[i], w.error().message(), roots[i]);
      w = sys_.write_file(roots[i] + "/tasks", "0");
    }
    if (!w) return std::unexpected(w.error());
  }
  return {};
}

Result<CgroupStats> CgroupManager::stats(const std::string& id) {
  CgroupStats s;
  auto num = [&](const std::string& path) -> uint64_t {
    auto r = sys_.read_file(path);
    return r ? to_u64(*r) : 0;
  };
  auto text = [&](const std::string& path) -> std::string {
    auto r = sys_.read_file(path);
    return r ? *r : std::string();
  };
  if (layout_.version == CgroupVersion::kV2) {
    std::string d = controller_dir("", id);
    if (!sys_.exists(d)) return fail(Code::kNotFound, "cgroup " + d + " does not exist");
    s.memory_bytes = num(d + "/memory.current");
    s.memory_peak_bytes = num(d + "/memory.peak");
    s.cpu_usage_us = keyed_value(text(d + "/cpu.stat"), "usage_usec");
    s.pids = num(d + "/pids.current");
    s.oom_kills = oom_kills(id).value_or(0);
    return s;
  }
  std::string mem = controller_dir("memory", id);
  if (!sys_.exists(mem)) return fail(Code::kNotFound, "cgroup " + mem + " does not exist");
  s.memory_bytes = num(mem + "/memory.usage_in_bytes");
  s.memory_peak_bytes = num(mem + "/memory.max_usage_in_bytes");
  s.oom_kills = oom_kills(id).value_or(0);
  s.pids = num(controller_dir("pids", id) + "/pids.current");
  std::string acct = controller_dir("cpuacct", id);
  if (!acct.empty()) s.cpu_usage_us = num(acct + "/cpuacct.usage") / 1000;
  return s;
}

Result<uint64_t> CgroupManager::oom_kills(const std::string& id) {
  const bool v2 = layout_.version == CgroupVersion::kV2;
  auto t = sys_.read_file(controller_dir(v2 ? "" : "memory", id) +
                          (v2 ? "/memory.events" : "/memory.oom_control"));
  if (!t) return std::unexpected(t.error());
  return keyed_value(*t, "oom_kill");
}

std::string CgroupManager::delegated_dir(const std::string& id) const {
  return controller_dir(layout_.version == CgroupVersion::kV2 ? "" : "freezer", id);
}

std::vector<std::string> CgroupManager::limit_dirs(const std::string& id) const {
  if (layout_.version == CgroupVersion::kV2) return {controller_dir("", id)};
  std::vector<std::string> out;
  for (const char* c : {"memory", "pids"}) {
    std::string d = controller_dir(c, id);
    if (!d.empty()) out.push_back(d);
  }
  return out;
}

std::vector<std::string> CgroupManager::delegated_files() const {
  if (layout_.version == CgroupVersion::kV2)
    return {"cgroup.procs", "cgroup.subtree_control", "cgroup.threads", "cgroup.kill"};
  return {"cgroup.procs", "tasks", "freezer.state"};
}

std::vector<std::string> CgroupManager::subtree(const std::string& dir) {
  std::vector<std::string> out{dir};
  for (size_t i = 0; i < out.size(); ++i) {
    auto subs = sys_.list_dirs(out[i]);
    if (!subs) continue;
    for (const auto& s : *subs) out.push_back(out[i] + "/" + s);
  }
  return out;
}

void CgroupManager::thaw_subtree(const std::string& id) {
  if (layout_.version == CgroupVersion::kV2) return;
  std::string fz = controller_dir("freezer", id);
  if (fz.empty()) return;
  auto all = subtree(fz);
  for (size_t i = 1; i < all.size(); ++i)
    (void)sys_.write_file(all[i] + "/freezer.state", "THAWED");
}

Result<std::vector<pid_t>> CgroupManager::procs(const std::string& id) {
  // v1: the pids hierarchy has no sub-cgroups (only the freezer's is delegated).
  std::string d =
      layout_.version == CgroupVersion::kV2 ? controller_dir("", id) : controller_dir("pids", id);
  std::vector<pid_t> out;
  const auto all = layout_.version == CgroupVersion::kV2 ? subtree(d) : std::vector<std::string>{d};
  for (size_t i = 0; i < all.size(); ++i) {
    auto txt = sys_.read_file(all[i] + "/cgroup.procs");
    if (!txt) {
      if (i > 0 && txt.error().sys_errno == ENOENT) continue;  // removed meanwhile
      return std::unexpected(txt.error());
    }
    for (auto l : split_fields(*txt, '\n')) {
      auto v = to_u64(l);
      if (v) out.push_back(static_cast<pid_t>(v));
    }
  }
  return out;
}

Result<bool> CgroupManager::empty(const std::string& id) {
  for (const auto& top : dirs(id)) {
    if (!sys_.exists(top)) continue;
    for (const auto& d : subtree(top)) {
      auto t = sys_.read_file(d + "/cgroup.procs");
      if (!t) {
        if (t.error().sys_errno == ENOENT) continue;
        return std::unexpected(t.error());
      }
      if (t->find_first_not_of(" \n") != std::string::npos) return false;
    }
  }
  return true;
}

Result<void> CgroupManager::kill_all(const std::string& id) {
  constexpr int kPolls = 5000;  // x 1 ms
  if (layout_.version == CgroupVersion::kV2) {
    std::string d = controller_dir("", id);
    if (!sys_.exists(d)) return {};
    if (sys_.exists(d + "/cgroup.kill")) {
      TP_TRY(sys_.write_file(d + "/cgroup.kill", "1"));
    } else {
      // Pre-5.14 kernels: freeze to defeat fork races, kill each, thaw.
      (void)sys_.write_file(d + "/cgroup.freeze", "1");
      if (auto p = procs(id))
        for (pid_t pid : *p) (void)sys_.kill(pid, 9);
      (void)sys_.write_file(d + "/cgroup.freeze", "0");
    }
  } else {
    std::string fz = controller_dir("freezer", id);
    bool asked = false;   // a freeze was asked for: thawed again at the end
    bool frozen = false;  // ... and it took (or at least began)
    if (!fz.empty() && sys_.exists(fz)) {
      // Frozen tasks cannot fork, so one pass of kill catches all; they die once thawed.
      // set_frozen asks again when the kernel leaves the freeze FREEZING (a task that
      // slept at the wrong moment); one that never settles still stopped most tasks,
      // and the wait below kills again what a fork let through.
      auto r = set_frozen(sys_, *this, id, true);
      asked = true;
      frozen = r || r.error().code == Code::kUnavailable;
    }
    for (int pass = 0; pass < 3; ++pass) {
      auto p = procs(id);
      if (!p) {
        if (p.error().sys_errno == ENOENT) break;
        if (asked) (void)sys_.write_file(fz + "/freezer.state", "THAWED");
        return std::unexpected(p.error());
      }
      if (p->empty()) break;
      for (pid_t pid : *p) (void)sys_.kill(pid, 9);
      if (frozen) break;
    }
    if (asked) (void)sys_.write_file(fz + "/freezer.state", "THAWED");
    thaw_subtree(id);
  }
  for (int i = 0; i < kPolls; ++i) {
    auto e = empty(id);
    if (!e) return std::unexpected(e.error());
    if (*e) return {};
    // Without a freezer a fork may race the kill pass: kill again.
    if (i % 50 == 49) {
      if (auto p = procs(id))
        for (pid_t pid : *p) (void)sys_.kill(pid, 9);
    }
    sys_.pause_us(1000);
  }
  return fail(Code::kUnavailable, "cgroup of " + id + " still has processes after SIGKILL");
}

Result<void> CgroupManager::remove(const std::string& id, int busy_polls) {
  for (const auto& top : dirs(id)) {
    // Only the delegated hierarchy has sub-cgroups (the agent's command cgroups):
    // elsewhere one rmdir does it, without listing the directory first.
    auto first = sys_.rmdir(top);
    if (first || first.error().sys_errno == ENOENT) continue;
    const int e = first.error().sys_errno;
    if (e != EBUSY && e != ENOTEMPTY) return first;
    // The command cgroups go first.
    auto all = subtree(top);
    for (auto d = all.rbegin(); d != all.rend(); ++d) {
      for (int i = 0;; ++i) {
        auto r = sys_.rmdir(*d);
        if (r || r.error().sys_errno == ENOENT) break;
        // EBUSY: tasks still exiting; the kernel drops them from cgroup.procs shortly.
        if (r.error().sys_errno != EBUSY || i >= busy_polls) return r;
        sys_.pause_us(500);
      }
    }
  }
  return {};
}

std::vector<std::string> CgroupManager::list() {
  std::set<std::string> ids;
  for (const auto& r : hierarchy_roots()) {
    auto l = sys_.list_dirs(r + "/" + parent_);
    if (l) ids.insert(l->begin(), l->end());
  }
  return {ids.begin(), ids.end()};
}

void CgroupManager::remove_parent_if_empty() {
  if (!list().empty()) return;
  for (const auto& r : hierarchy_roots()) (void)sys_.rmdir(r + "/" + parent_);
}

}  // namespace tp::sys

namespace tp::sys {

std::string freezer_dir(const CgroupManager& m, const std::string& id) {
  auto ds = m.dirs(id);
  if (m.layout().version == CgroupVersion::kV2) return ds.empty() ? std::string() : ds.front();
  auto it = m.layout().v1_mounts.find("freezer");
  if (it == m.layout().v1_mounts.end()) return {};
  for (const auto& d : ds)
    if (d.starts_with(it->second + "/")) return d;
  return {};
}

namespace {
// What the freezer of `id` says: whether its tasks are frozen now (`asked` false), or
// whether a freeze was asked for and not undone, done or under way (`asked` true).
Result<bool> freezer_reads(SysApi& sys, const CgroupManager& m, const std::string& id, bool asked) {
  std::string d = freezer_dir(m, id);
  if (d.empty()) return fail(Code::kInvalidArgument, "no cgroup freezer on this host");
  const bool v2 = m.layout().version == CgroupVersion::kV2;
  auto f = sys.read_file(d + (!v2     ? "/freezer.state"
                              : asked ? "/cgroup.freeze"
                                      : "/cgroup.events"));
  if (!f) return std::unexpected(f.error());
  if (v2) return asked ? f->starts_with("1") : keyed_value(*f, "frozen") == 1;
  return asked ? !f->starts_with("THAWED") : f->starts_with("FROZEN");
}
}  // namespace

Result<bool> is_frozen(SysApi& sys, const CgroupManager& m, const std::string& id) {
  return freezer_reads(sys, m, id, false);
}

Result<bool> freeze_requested(SysApi& sys, const CgroupManager& m, const std::string& id) {
  return freezer_reads(sys, m, id, true);
}

Result<void> set_frozen(SysApi& sys, const CgroupManager& m, const std::string& id, bool frozen) {
  constexpr int kPolls = 5000;  // x 1 ms
  std::string d = freezer_dir(m, id);
  if (d.empty()) return fail(Code::kInvalidArgument, "no cgroup freezer on this host");
  if (!sys.exists(d)) return fail(Code::kNotFound, "cgroup of " + id + " does not exist");
  const bool v2 = m.layout().version == CgroupVersion::kV2;
  if (v2) {
    TP_TRY(sys.write_file(d + "/cgroup.freeze", frozen ? "1" : "0"));
  } else {
    TP_TRY(sys.write_file(d + "/freezer.state", frozen ? "FROZEN" : "THAWED"));
  }
  for (int i = 0; i < kPolls; ++i) {
    auto now = is_frozen(sys, m, id);
    if (!now) return std::unexpected(now.error());
    if (*now == frozen) return {};
    // v1 retries the transition: a task in an uninterruptible sleep can make
    // the kernel fall back to FREEZING; writing FROZEN again continues it.
    if (!v2 && frozen && i % 100 == 99) (void)sys.write_file(d + "/freezer.state", "FROZEN");
    sys.pause_us(1000);
  }
  return fail(Code::kUnavailable,
              std::string("cgroup of ") + id + (frozen ? " did not freeze" : " did not thaw"));
}

}  // namespace tp::sys
