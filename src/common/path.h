// Splitting URL paths (the routes' matching, the trajectory log's replay). Pure.
#pragma once

#include <string_view>
#include <vector>

namespace tp {

// "/a//b/" -> {"a", "b"}: the segments of a path, empty ones dropped.
inline std::vector<std::string_view> path_segments(std::string_view p) {
  std::vector<std::string_view> out;
  while (!p.empty()) {
    if (p[0] == '/') {
      p.remove_prefix(1);
      continue;
    }
    auto s = p.find('/');
    out.push_back(p.substr(0, s));
    if (s == std::string_view::npos) break;
    p.remove_prefix(s);
  }
  return out;
}

}  // namespace tp
