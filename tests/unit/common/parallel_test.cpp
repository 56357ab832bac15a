#include "common/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace tp {
namespace {

TEST(ParallelFor, RunsEveryIndexExactlyOnceOnAtMostTheThreadsAsked) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{1000}}) {
    std::vector<std::atomic<int>> runs(n);
    std::mutex mu;
    std::set<std::thread::id> threads;
    size_t used = parallel_for(n, 4, [&](size_t i) {
      runs[i]++;
      std::lock_guard lk(mu);
      threads.insert(std::this_thread::get_id());
    });
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(runs[i].load(), 1) << "n " << n << " index " << i;
    EXPECT_LE(threads.size(), 4u);
    EXPECT_EQ(used, std::max<size_t>(1, std::min<size_t>(4, n))) << n;
  }
}

}  // namespace
}  // namespace tp
