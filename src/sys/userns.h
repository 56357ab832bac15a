// User-namespace id maps. Root inside a sandbox is `base` on the host, never
// host root; `count` ids are mapped (65536 by default).
// Thread rules: pure functions.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "common/result.h"

namespace tp::sys {

inline constexpr uint32_t kIdMapCount = 65536;

// Text for /proc/<pid>/uid_map or gid_map: "0 <base> <count>\n".
std::string id_map_text(uint32_t base, uint32_t count = kIdMapCount);
// Checks that a base is usable: not 0 (host root) and base+count fits in 32 bits.
Result<void> validate_id_base(uint32_t base, uint32_t count = kIdMapCount);
// Writes uid_map and gid_map of `pid` (the caller needs CAP_SETUID/CAP_SETGID outside).
Result<void> write_id_maps(pid_t pid, uint32_t base, uint32_t count = kIdMapCount);

}  // namespace tp::sys
