// /proc/<pid>/mountinfo, parsed: one entry per mount, in the file's order.
//
// A line is "id parent maj:min root mount_point options [optional fields...] - fstype
// source super_options" (proc(5)); lines without the " - " separator or with too few
// fields are skipped. Octal escapes (\040 for a space) are decoded in the mount point.
//
// Thread rules: pure functions, safe from any thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tp::sys {

struct MountEntry {
  std::string mount_point;
  std::string fs_type;
  std::string source;
  std::string super_options;  // comma-separated, e.g. "rw,memory" for a v1 cgroup mount
};

std::vector<MountEntry> parse_mountinfo(std::string_view text);

// The non-empty pieces of s between seps (the fields of /proc and /sys files).
std::vector<std::string_view> split_fields(std::string_view s, char sep);

// The mount that holds `path` (an absolute path without symlinks): the last entry of
// the longest mount point that is `path` or one of its parent directories, as the
// kernel resolves it (a later mount on the same point hides an earlier one).
std::optional<MountEntry> mount_of(const std::vector<MountEntry>& mounts, std::string_view path);

}  // namespace tp::sys
