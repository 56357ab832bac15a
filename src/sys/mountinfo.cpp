#include "sys/mountinfo.h"

namespace tp::sys {
namespace {

// "\040" and the other octal escapes the kernel writes for space, tab, newline and '\'.
std::string unescape(std::string_view s) {
  auto oct = [](char c) { return c >= '0' && c <= '7'; };
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && oct(s[i + 1]) && oct(s[i + 2]) && oct(s[i + 3])) {
      out.push_back(
          static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0')));
      i += 3;
      continue;
    }
    out.push_back(s[i]);
  }
  return out;
}

}  // namespace

std::vector<std::string_view> split_fields(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t p = s.find(sep, start);
    if (p == std::string_view::npos) p = s.size();
    if (p > start) out.push_back(s.substr(start, p - start));
    start = p + 1;
  }
  return out;
}

std::vector<MountEntry> parse_mountinfo(std::string_view text) {
  std::vector<MountEntry> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    size_t dash = line.find(" - ");
    if (dash == std::string_view::npos) continue;
    auto left = split_fields(line.substr(0, dash), ' ');
    auto right = split_fields(line.substr(dash + 3), ' ');
    if (left.size() < 5 || right.size() < 3) continue;
    out.push_back(MountEntry{unescape(left[4]), std::string(right[0]), std::string(right[1]),
                             std::string(right[2])});
  }
  return out;
}

std::optional<MountEntry> mount_of(const std::vector<MountEntry>& mounts, std::string_view path) {
  const MountEntry* best = nullptr;
  for (const auto& m : mounts) {
    std::string_view p = m.mount_point;
    bool under = p == "/" || path == p ||
                 (path.starts_with(p) && path.size() > p.size() && path[p.size()] == '/');
    if (under && (!best || p.size() >= best->mount_point.size())) best = &m;
  }
  if (!best) return std::nullopt;
  return *best;
}

}  // namespace tp::sys
