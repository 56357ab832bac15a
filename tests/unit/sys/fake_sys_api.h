// In-memory SysApi for unit tests: a tree of directories and files; mkdir
// populates new directories with `auto_files` (what the kernel creates in a
// new cgroup); every write is recorded in order; failures can be injected.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "sys/sys_api.h"

namespace tp::sys {

class FakeSysApi : public SysApi {
 public:
  std::set<std::string> dirs;
  std::map<std::string, std::string> files;
  std::vector<std::string> auto_files;  // names created in every mkdir'd dir
  std::vector<std::pair<std::string, std::string>> writes;
  std::vector<std::pair<pid_t, int>> kills;
  std::map<std::string, int> fail_write;  // path -> errno
  std::set<std::string> busy_dirs;        // rmdir -> EBUSY once, then succeeds
  int listings = 0;                       // list_dirs calls
  // Called on kill(); lets a test emulate processes leaving a cgroup.
  std::function<void(pid_t)> on_kill;
  // Called after a write is stored; lets a test emulate a kernel that answers with
  // another state than the one written (a freeze left FREEZING).
  std::function<void(const std::string& path, const std::string& data)> on_write;
  int pauses = 0;  // pause_us calls

  static std::string parent(const std::string& p) { return p.substr(0, p.find_last_of('/')); }

  Result<void> write_file(const std::string& path, const std::string& data) override {
    if (auto it = fail_write.find(path); it != fail_write.end())
      return sys_fail("write(" + path + ")", it->second);
    if (!files.contains(path) && !dirs.contains(parent(path)))
      return sys_fail("open(" + path + ")", ENOENT);
    writes.emplace_back(path, data);
    // cgroup.procs and cgroup.subtree_control keep what was written (good enough for assertions).
    files[path] = data;
    if (on_write) on_write(path, data);
    return {};
  }
  Result<std::string> read_file(const std::string& path) override {
    auto it = files.find(path);
    if (it == files.end()) return sys_fail("open(" + path + ")", ENOENT);
    return it->second;
  }
  Result<void> mkdir(const std::string& path, mode_t) override {
    if (dirs.contains(path)) return sys_fail("mkdir(" + path + ")", EEXIST);
    if (!dirs.contains(parent(path))) return sys_fail("mkdir(" + path + ")", ENOENT);
    dirs.insert(path);
    for (const auto& f : auto_files) files[path + "/" + f] = "";
    return {};
  }
  Result<void> rmdir(const std::string& path) override {
    if (!dirs.contains(path)) return sys_fail("rmdir(" + path + ")", ENOENT);
    if (busy_dirs.erase(path)) return sys_fail("rmdir(" + path + ")", EBUSY);
    auto procs = files.find(path + "/cgroup.procs");
    if (procs != files.end() && procs->second.find_first_not_of(" \n") != std::string::npos)
      return sys_fail("rmdir(" + path + ")", EBUSY);
    for (const auto& d : dirs)
      if (d.starts_with(path + "/")) return sys_fail("rmdir(" + path + ")", ENOTEMPTY);
    dirs.erase(path);
    std::erase_if(files, [&](const auto& kv) { return kv.first.starts_with(path + "/"); });
    return {};
  }
  bool exists(const std::string& path) override {
    return dirs.contains(path) || files.contains(path);
  }
  Result<std::vector<std::string>> list_dirs(const std::string& path) override {
    ++listings;
    if (!dirs.contains(path)) return sys_fail("opendir(" + path + ")", ENOENT);
    std::vector<std::string> out;
    for (const auto& d : dirs)
      if (parent(d) == path) out.push_back(d.substr(path.size() + 1));
    return out;
  }
  Result<void> kill(pid_t pid, int sig) override {
    kills.emplace_back(pid, sig);
    if (on_kill) on_kill(pid);
    return {};
  }
  void pause_us(unsigned) override { ++pauses; }

  std::string written(const std::string& path) const {
    for (auto it = writes.rbegin(); it != writes.rend(); ++it)
      if (it->first == path) return it->second;
    return "<unwritten>";
  }
};

}  // namespace tp::sys
