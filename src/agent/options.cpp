#include "agent/options.h"

#include <cstdlib>
#include <string_view>

namespace tp::agent {

Result<Options> parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    std::string_view val;
    bool has_val = false;
    if (size_t eq = a.find('='); a.starts_with("--") && eq != std::string_view::npos) {
      val = a.substr(eq + 1);
      a = a.substr(0, eq);
      has_val = true;
    }
    auto need = [&]() -> Result<std::string_view> {
      if (has_val) return val;
      if (i + 1 >= argc) return fail(Code::kInvalidArgument, std::string(a) + " needs a value");
      return std::string_view(argv[++i]);
    };
    if (a == "--fd" || a == "--cgroup-fd" || a == "--oom-fd") {
      auto v = need();
      if (!v) return std::unexpected(v.error());
      std::string s(*v);
      char* end = nullptr;
      long fd = std::strtol(s.c_str(), &end, 10);
      if (s.empty() || *end != '\0' || fd < 0 || fd > 1 << 20)
        return fail(Code::kInvalidArgument, std::string(a) + ": not a file descriptor: " + s);
      (a == "--fd" ? o.fd : a == "--cgroup-fd" ? o.cgroup_fd : o.oom_fd) = static_cast<int>(fd);
    } else if (a == "--listen-fd" || a == "--orphan-timeout") {
      auto v = need();
      if (!v) return std::unexpected(v.error());
      std::string s(*v);
      char* end = nullptr;
      long n = std::strtol(s.c_str(), &end, 10);
      if (s.empty() || *end != '\0' || n < 0 || n > 1 << 20)
        return fail(Code::kInvalidArgument, std::string(a) + ": not a number in range: " + s);
      if (a == "--listen-fd")
        o.listen_fd = static_cast<int>(n);
      else
        o.orphan_timeout_s = static_cast<unsigned>(n);
    } else if (a == "--serial" && !has_val) {
      o.serial = true;
    } else if (a == "--root") {
      auto v = need();
      if (!v) return std::unexpected(v.error());
      if (v->empty()) return fail(Code::kInvalidArgument, "--root: empty");
      o.root = std::string(*v);
    } else if (a == "--resolve") {
      auto v = need();
      if (!v) return std::unexpected(v.error());
      if (*v == "auto")
        o.resolve = Resolver::Mode::kAuto;
      else if (*v == "openat2")
        o.resolve = Resolver::Mode::kOpenat2;
      else if (*v == "walk")
        o.resolve = Resolver::Mode::kWalk;
      else
        return fail(Code::kInvalidArgument, "--resolve: auto, openat2 or walk");
    } else {
      return fail(Code::kInvalidArgument, "unknown argument: " + std::string(argv[i]));
    }
  }
  if (o.serial && o.listen_fd >= 0)
    return fail(Code::kInvalidArgument, "--serial and --listen-fd exclude each other");
  return o;
}

}  // namespace tp::agent
