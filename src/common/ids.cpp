#include "common/ids.h"

#include <sys/random.h>

#include <cstdint>

#include "common/sha256.h"

namespace tp::ids {

std::string random_hex(size_t n_bytes) {
  std::string buf(n_bytes, '\0');
  size_t got = 0;
  while (got < n_bytes) {
    ssize_t r = getrandom(buf.data() + got, n_bytes - got, 0);
    if (r > 0) got += static_cast<size_t>(r);
  }
  return hex_encode(buf);
}

std::string new_sandbox_id(std::string_view node) {
  return std::string(node) + "-" + random_hex(6);
}

std::string_view node_of(std::string_view id) {
  auto dash = id.rfind('-');
  if (dash == std::string_view::npos || dash == 0) return {};
  return id.substr(0, dash);
}

bool valid_sandbox_id(std::string_view id) {
  if (id.empty() || id.size() > 63) return false;
  for (char c : id) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
    if (!ok) return false;
  }
  return !node_of(id).empty() && id.back() != '-';
}

}  // namespace tp::ids
