#include "sys/userns.h"

#include <fcntl.h>
#include <unistd.h>

#include "sys/fd.h"

namespace tp::sys {

std::string id_map_text(uint32_t base, uint32_t count) {
  return "0 " + std::to_string(base) + " " + std::to_string(count) + "\n";
}

Result<void> validate_id_base(uint32_t base, uint32_t count) {
  if (base == 0)
    return fail(Code::kInvalidArgument, "uid_base 0 would map sandbox root to host root");
  if (count == 0) return fail(Code::kInvalidArgument, "id map count 0");
  if (static_cast<uint64_t>(base) + count > 0xffffffffull)
    return fail(Code::kInvalidArgument,
                "uid_base " + std::to_string(base) + " + " + std::to_string(count) + " overflows");
  return {};
}

Result<void> write_id_maps(pid_t pid, uint32_t base, uint32_t count) {
  std::string text = id_map_text(base, count);
  for (const char* which : {"uid_map", "gid_map"}) {
    std::string path = "/proc/" + std::to_string(pid) + "/" + which;
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd) return sys_fail("open(" + path + ")");
    if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()))
      return sys_fail("write(" + path + ", \"0 " + std::to_string(base) + " " +
                      std::to_string(count) + "\")");
  }
  return {};
}

}  // namespace tp::sys
