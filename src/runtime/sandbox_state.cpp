#include "runtime/sandbox_state.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <sstream>

#include "sys/fd.h"

namespace tp::runtime {

bool valid_sandbox_name(const std::string& id) {
  if (id.empty() || id.size() > 63) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || (c >= 'A' && c <= 'Z') ||
           c == '_';
  });
}

uint64_t proc_start_time(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  // comm (field 2) may hold spaces and parentheses: count from the last ')'.
  size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(text.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && (rest >> field); ++i) {
    if (i == 22) return std::strtoull(field.c_str(), nullptr, 10);
  }
  return 0;
}

Result<void> write_state(const std::string& dir, pid_t pid) {
  uint64_t start = proc_start_time(pid);
  if (!start)
    return fail(Code::kInternal, "no start time in /proc/" + std::to_string(pid) + "/stat");
  const std::string tmp = dir + "/state.tmp";
  std::string text = "pid " + std::to_string(pid) + "\nstarttime " + std::to_string(start) + "\n";
  sys::UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd) return sys_fail("open(" + tmp + ")");
  if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()))
    return sys_fail("write(" + tmp + ")");
  fd.reset();
  if (::rename(tmp.c_str(), (dir + "/state").c_str()) != 0) return sys_fail("rename(" + tmp + ")");
  return {};
}

Result<SavedState> read_state(const std::string& dir) {
  std::ifstream f(dir + "/state");
  if (!f) return fail(Code::kNotFound, "no state file in " + dir);
  SavedState st;
  std::string key;
  uint64_t v;
  while (f >> key >> v) {
    if (key == "pid") st.pid = static_cast<pid_t>(v);
    if (key == "starttime") st.start = v;
  }
  if (st.pid <= 0 || st.start == 0) return fail(Code::kNotFound, "malformed state file in " + dir);
  return st;
}

Result<sys::Pidfd> open_saved(const SavedState& st) {
  int pfd = static_cast<int>(::syscall(SYS_pidfd_open, st.pid, 0));
  if (pfd < 0) {
    if (errno == ESRCH) return fail(Code::kNotFound, "pid " + std::to_string(st.pid) + " is gone");
    return sys_fail("pidfd_open(" + std::to_string(st.pid) + ")");
  }
  sys::Pidfd proc(pfd, st.pid);
  // Checked after pidfd_open: the pidfd then names the process whose start time matched.
  if (proc_start_time(st.pid) != st.start || proc.exited())
    return fail(Code::kNotFound, "pid " + std::to_string(st.pid) + " is gone");
  return proc;
}

}  // namespace tp::runtime
