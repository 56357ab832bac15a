#include "image/image_user.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <optional>
#include <sstream>

#include "sys/fd.h"

namespace tp::image {
namespace {

std::optional<uint32_t> number(const std::string& s) {
  if (s.empty() || s.size() > 10 || s.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  unsigned long v = std::stoul(s);
  if (v > 65535) return std::nullopt;  // the sandbox's user namespace maps 65536 ids
  return static_cast<uint32_t>(v);
}

// Contents of `rel` in the top-most layer that has it ("" when none does).
std::string read_from_layers(const std::vector<std::string>& layers, const char* rel) {
  for (const auto& layer : layers) {
    sys::UniqueFd root(::open(layer.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!root) continue;
    open_how how{};
    how.flags = O_RDONLY | O_CLOEXEC;
    how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
    sys::UniqueFd fd(static_cast<int>(::syscall(SYS_openat2, root.get(), rel, &how, sizeof how)));
    if (!fd) continue;
    std::string out;
    char buf[8192];
    ssize_t n;
    while ((n = ::read(fd.get(), buf, sizeof buf)) > 0 && out.size() < (4u << 20))
      out.append(buf, n);
    return out;
  }
  return "";
}

// Field 2 (id) and, for passwd, field 3 (gid) of the line whose first field is `name`.
std::optional<std::pair<uint32_t, uint32_t>> lookup(const std::string& db,
                                                    const std::string& name) {
  std::istringstream in(db);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream ls(line);
    std::string x;
    while (std::getline(ls, x, ':')) f.push_back(x);
    if (f.size() < 3 || f[0] != name) continue;
    auto id = number(f[2]);
    auto gid = f.size() > 3 ? number(f[3]) : id;
    if (id && gid) return std::pair{*id, *gid};
  }
  return std::nullopt;
}

}  // namespace

Result<std::pair<uint32_t, uint32_t>> resolve_user(const std::string& user,
                                                   const std::vector<std::string>& layers) {
  if (user.empty()) return std::pair<uint32_t, uint32_t>{0, 0};
  auto colon = user.find(':');
  std::string u = user.substr(0, colon);
  std::string g = colon == std::string::npos ? "" : user.substr(colon + 1);
  uint32_t uid, gid;
  if (auto n = number(u)) {
    uid = gid = *n;
  } else {
    auto e = lookup(read_from_layers(layers, "etc/passwd"), u);
    if (!e)
      return fail(Code::kInvalidArgument,
                  "image user '" + u + "' is not in the image's /etc/passwd");
    uid = e->first;
    gid = e->second;
  }
  if (!g.empty()) {
    if (auto n = number(g)) {
      gid = *n;
    } else {
      auto e = lookup(read_from_layers(layers, "etc/group"), g);
      if (!e)
        return fail(Code::kInvalidArgument,
                    "image group '" + g + "' is not in the image's /etc/group");
      gid = e->first;
    }
  }
  return std::pair{uid, gid};
}

}  // namespace tp::image
