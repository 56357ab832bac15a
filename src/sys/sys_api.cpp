#include "sys/sys_api.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "sys/fd.h"

namespace tp::sys {
namespace {

std::string quote(const std::string& s) {
  std::string t = s;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  return "\"" + t + "\"";
}

class RealSysApi final : public SysApi {
 public:
  Result<void> write_file(const std::string& path, const std::string& data) override {
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd) return sys_fail("open(" + path + ", O_WRONLY)");
    ssize_t n = ::write(fd.get(), data.data(), data.size());
    if (n < 0) return sys_fail("write(" + path + ", " + quote(data) + ")");
    if (static_cast<size_t>(n) != data.size())
      return fail(Code::kInternal, "write(" + path + ", " + quote(data) + "): short write");
    return {};
  }

  Result<std::string> read_file(const std::string& path) override { return read_whole_file(path); }

  Result<void> mkdir(const std::string& path, mode_t mode) override {
    if (::mkdir(path.c_str(), mode) != 0) return sys_fail("mkdir(" + path + ")");
    return {};
  }

  Result<void> rmdir(const std::string& path) override {
    if (::rmdir(path.c_str()) != 0) return sys_fail("rmdir(" + path + ")");
    return {};
  }

  bool exists(const std::string& path) override { return ::access(path.c_str(), F_OK) == 0; }

  Result<std::vector<std::string>> list_dirs(const std::string& path) override {
    DIR* d = ::opendir(path.c_str());
    if (!d) return sys_fail("opendir(" + path + ")");
    std::vector<std::string> out;
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n == "." || n == "..") continue;
      if (e->d_type == DT_DIR) out.push_back(n);
    }
    ::closedir(d);
    return out;
  }

  Result<void> kill(pid_t pid, int sig) override {
    if (::kill(pid, sig) != 0)
      return sys_fail("kill(" + std::to_string(pid) + ", " + std::to_string(sig) + ")");
    return {};
  }

  void pause_us(unsigned us) override { ::usleep(us); }
};

}  // namespace

SysApi& real_sys() {
  static RealSysApi api;
  return api;
}

Result<std::string> read_whole_file(const std::string& path, int extra_flags) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | extra_flags));
  if (!fd) return sys_fail("open(" + path + ", O_RDONLY)");
  std::string out;
  char buf[8192];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return sys_fail("read(" + path + ")");
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

}  // namespace tp::sys
