#include "common/parallel.h"

#include <algorithm>
#include <atomic>
#include <system_error>
#include <thread>
#include <vector>

namespace tp {

size_t parallel_for(size_t n, size_t threads, const std::function<void(size_t)>& fn) {
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next++) < n;) fn(i);
  };
  std::vector<std::thread> helpers;
  try {
    for (size_t i = 1; i < std::min(threads, n); ++i) helpers.emplace_back(work);
  } catch (const std::system_error&) {  // fewer threads: the others do the rest
  }
  work();
  for (auto& t : helpers) t.join();
  return helpers.size() + 1;
}

}  // namespace tp
