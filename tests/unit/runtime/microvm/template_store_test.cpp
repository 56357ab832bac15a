// TemplateStore (template_store.h): one build per key however many creates
// arrive, failures remembered for a while, drop() forgets, and random
// interleavings of get/drop from several threads keep those rules.
#include "runtime/microvm/template_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <random>
#include <thread>
#include <vector>

namespace tp::runtime::microvm {
namespace {

using namespace std::chrono_literals;

std::shared_ptr<const Template> make(uint64_t bytes) {
  auto t = std::make_shared<Template>();
  t->memory_bytes = bytes;
  return t;
}

TEST(TemplateStore, ConcurrentCallersOfOneKeyShareOneBuild) {
  TemplateStore store;
  std::atomic<int> builds{0};
  std::vector<std::thread> ts;
  std::vector<std::shared_ptr<const Template>> got(8);
  for (int i = 0; i < 8; ++i)
    ts.emplace_back([&, i] {
      auto r = store.get("k", [&]() -> Result<std::shared_ptr<const Template>> {
        builds++;
        std::this_thread::sleep_for(50ms);
        return make(7);
      });
      ASSERT_TRUE(r.has_value());
      got[i] = *r;
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(builds.load(), 1);
  for (auto& g : got) EXPECT_EQ(g, got[0]);
  EXPECT_EQ(store.size(), 1u);
}

TEST(TemplateStore, KeysAreIndependent) {
  TemplateStore store;
  int builds = 0;
  auto b = [&]() -> Result<std::shared_ptr<const Template>> { return make(++builds); };
  auto a1 = store.get("a", b), b1 = store.get("b", b), a2 = store.get("a", b);
  ASSERT_TRUE(a1 && b1 && a2);
  EXPECT_EQ(builds, 2);
  EXPECT_EQ(*a1, *a2);
  EXPECT_NE(*a1, *b1);
}

TEST(TemplateStore, AFailureIsRememberedUntilRetryAfter) {
  auto now = TemplateStore::Clock::now();
  TemplateStore store(60s, [&] { return now; });
  int builds = 0;
  auto failing = [&]() -> Result<std::shared_ptr<const Template>> {
    ++builds;
    return fail(Code::kInternal, "boot failed");
  };
  auto r = store.get("k", failing);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().context, "boot failed");
  // Within the window: the remembered error, no new boot.
  now += 30s;
  EXPECT_FALSE(store.get("k", failing).has_value());
  EXPECT_EQ(builds, 1);
  // After it: built again.
  now += 31s;
  auto ok = store.get("k", [&]() -> Result<std::shared_ptr<const Template>> {
    ++builds;
    return make(1);
  });
  EXPECT_TRUE(ok.has_value());
  EXPECT_EQ(builds, 2);
}

TEST(TemplateStore, NullOrThrowingBuildsAreFailures) {
  TemplateStore store(0ms);
  EXPECT_FALSE(store.get("n", []() -> Result<std::shared_ptr<const Template>> { return nullptr; }));
  EXPECT_FALSE(store.get(
      "t", []() -> Result<std::shared_ptr<const Template>> { throw std::runtime_error("x"); }));
  EXPECT_EQ(store.size(), 0u);
}

TEST(TemplateStore, DropMakesTheNextGetBuildAnew) {
  TemplateStore store;
  int builds = 0;
  auto b = [&]() -> Result<std::shared_ptr<const Template>> { return make(++builds); };
  auto first = store.get("k", b);
  store.drop("k");
  auto second = store.get("k", b);
  ASSERT_TRUE(first && second);
  EXPECT_EQ(builds, 2);
  EXPECT_NE(*first, *second);
  // Whoever held the old one keeps it (clones map its memory).
  EXPECT_EQ((*first)->memory_bytes, 1u);
}

TEST(TemplateStore, RandomInterleavingsBuildEachKeyOnceBetweenDrops) {
  const int seeds =
      std::getenv("TP_TEST_SEEDS") ? std::atoi(std::getenv("TP_TEST_SEEDS")) / 10 : 50;
  for (int seed = 0; seed < std::max(seeds, 5); ++seed) {
    TemplateStore store(0ms);
    std::mutex mu;
    std::map<std::string, int> building;  // builds running per key: never more than one
    std::atomic<bool> overlap{false};
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t)
      ts.emplace_back([&, t] {
        std::mt19937 rng(static_cast<unsigned>(seed * 31 + t));
        for (int i = 0; i < 40; ++i) {
          const std::string key = "k" + std::to_string(rng() % 3);
          if (rng() % 5 == 0) {
            store.drop(key);
            continue;
          }
          const bool fails = rng() % 4 == 0;
          auto r = store.get(key, [&]() -> Result<std::shared_ptr<const Template>> {
            {
              std::lock_guard lk(mu);
              if (++building[key] > 1) overlap = true;
            }
            std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
            {
              std::lock_guard lk(mu);
              --building[key];
            }
            if (fails) return fail(Code::kInternal, "flaky");
            return make(1);
          });
          if (r) {
            ASSERT_NE(*r, nullptr);
          }
        }
      });
    for (auto& t : ts) t.join();
    ASSERT_FALSE(overlap.load()) << "two builds of one key ran at once, seed " << seed;
  }
}

}  // namespace
}  // namespace tp::runtime::microvm
