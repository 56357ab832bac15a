// The per-sandbox uid range allocator (node/uid_ranges.h).
#include "node/uid_ranges.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <random>
#include <set>

namespace tp::node {
namespace {

constexpr uint32_t S = UidRanges::kSize;

TEST(UidRanges, AllocatesLowestFreeRangeOnTheGrid) {
  UidRanges r(1 << 20, 4);
  EXPECT_EQ(*r.allocate("a"), (1u << 20));
  EXPECT_EQ(*r.allocate("b"), (1u << 20) + S);
  EXPECT_EQ(*r.allocate("c"), (1u << 20) + 2 * S);
  EXPECT_EQ(r.holder((1u << 20) + S), "b");
  EXPECT_EQ(r.held(), 3u);
}

TEST(UidRanges, ExhaustionIsUnavailableNamingTheCause) {
  UidRanges r(1 << 20, 2);
  ASSERT_TRUE(r.allocate("a"));
  ASSERT_TRUE(r.allocate("b"));
  auto c = r.allocate("c");
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code, Code::kUnavailable);
  EXPECT_NE(c.error().message().find("no free uid range"), std::string::npos);
}

TEST(UidRanges, ReleaseMakesTheRangeFreeAgainOnlyForItsHolder) {
  UidRanges r(1 << 20, 2);
  uint32_t a = *r.allocate("a");
  uint32_t b = *r.allocate("b");
  r.release(a, "not-a");  // a stale release changes nothing
  EXPECT_FALSE(r.allocate("c"));
  r.release(a, "a");
  EXPECT_EQ(*r.allocate("c"), a);
  EXPECT_EQ(r.holder(a), "c");
  EXPECT_EQ(r.holder(b), "b");
  r.release(a, "a");  // "a" no longer holds it
  EXPECT_EQ(r.holder(a), "c");
}

TEST(UidRanges, HoldRestoresRecordedRangesAndAllocationSkipsThem) {
  UidRanges r(1 << 20, 4);
  ASSERT_TRUE(r.hold((1u << 20) + S, "old1"));
  ASSERT_TRUE(r.hold((1u << 20) + 3 * S, "old3"));
  EXPECT_TRUE(r.hold((1u << 20) + S, "old1"));  // idempotent
  auto clash = r.hold((1u << 20) + S, "other");
  ASSERT_FALSE(clash);
  EXPECT_EQ(clash.error().code, Code::kConflict);
  EXPECT_EQ(*r.allocate("n0"), (1u << 20));
  EXPECT_EQ(*r.allocate("n2"), (1u << 20) + 2 * S);
  EXPECT_FALSE(r.allocate("n4"));
}

TEST(UidRanges, OffGridHoldBlocksEveryRangeItOverlaps) {
  // A record made under another --uid-base: it keeps its ids, and the ranges of
  // this configuration that overlap them are not handed out.
  UidRanges r(1 << 20, 3);
  ASSERT_TRUE(r.hold((1u << 20) + S / 2, "old"));
  EXPECT_FALSE(r.hold(1u << 20, "x"));
  EXPECT_FALSE(r.hold((1u << 20) + S, "x"));
  EXPECT_EQ(*r.allocate("n"), (1u << 20) + 2 * S);
  EXPECT_FALSE(r.allocate("m"));
  r.release((1u << 20) + S / 2, "old");
  EXPECT_EQ(*r.allocate("m"), (1u << 20));
}

TEST(UidRanges, HoldOutsideTheSpanIsKeptApart) {
  UidRanges r(1 << 20, 1);
  ASSERT_TRUE(r.hold(100000, "legacy"));  // a range the flags no longer name
  EXPECT_EQ(*r.allocate("n"), (1u << 20));
  EXPECT_FALSE(r.hold(0, "root"));
  EXPECT_FALSE(r.hold(0x7fffffffu, "top"));
}

TEST(UidRanges, ValidateKeepsClearOfReservedIdsAndOfTwoToThe31) {
  const std::vector<UidRanges::Span> reserved = {{100000, S}, {200000, S}};
  EXPECT_TRUE(UidRanges::validate(UidRanges::kDefaultFirst, UidRanges::kDefaultCount, reserved));
  EXPECT_FALSE(UidRanges::validate(0, 1, reserved));
  EXPECT_FALSE(UidRanges::validate(1 << 20, 0, reserved));
  EXPECT_FALSE(UidRanges::validate(100000 - S + 1, 1, reserved));  // touches the store's ids
  EXPECT_FALSE(UidRanges::validate(65536, 4, reserved));           // covers the builds' ids
  EXPECT_TRUE(UidRanges::validate(200000 + S, 1, reserved));       // just above the builds'
  EXPECT_EQ(UidRanges::max_count(1 << 20), 32752u);
  EXPECT_TRUE(UidRanges::validate(1 << 20, 32752, reserved));
  EXPECT_FALSE(UidRanges::validate(1 << 20, 32753, reserved));
  EXPECT_EQ(UidRanges::max_count(0x80000000u), 0u);
}

TEST(UidRanges, InSpan) {
  UidRanges r(1 << 20, 2);
  EXPECT_FALSE(r.in_span((1u << 20) - 1));
  EXPECT_TRUE(r.in_span(1u << 20));
  EXPECT_TRUE(r.in_span((1u << 20) + 2 * S - 1));
  EXPECT_FALSE(r.in_span((1u << 20) + 2 * S));
}

// Random allocations and releases against a model: a range is never handed to
// two holders at once, the lowest free one is always the one handed out, and
// exhaustion happens exactly when the model is full.
TEST(UidRanges, RandomInterleavingsMatchAModel) {
  for (unsigned seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    const uint32_t count = 1 + rng() % 12;
    UidRanges r(1 << 20, count);
    std::map<uint32_t, std::string> model;  // index -> owner
    int next = 0;
    for (int step = 0; step < 400; ++step) {
      if (rng() % 2 == 0) {
        std::string owner = "s" + std::to_string(next++);
        auto got = r.allocate(owner);
        uint32_t want = 0;
        while (want < count && model.count(want)) ++want;
        if (want == count) {
          ASSERT_FALSE(got) << "seed " << seed << " step " << step;
          EXPECT_EQ(got.error().code, Code::kUnavailable);
        } else {
          ASSERT_TRUE(got) << "seed " << seed << " step " << step;
          EXPECT_EQ(*got, (1u << 20) + want * S) << "seed " << seed << " step " << step;
          model[want] = owner;
        }
      } else if (!model.empty()) {
        auto it = model.begin();
        std::advance(it, rng() % model.size());
        if (rng() % 5 == 0) r.release((1u << 20) + it->first * S, "stale");  // ignored
        r.release((1u << 20) + it->first * S, it->second);
        model.erase(it);
      }
      ASSERT_EQ(r.held(), model.size());
      for (const auto& [k, owner] : model) ASSERT_EQ(r.holder((1u << 20) + k * S), owner);
    }
  }
}

// Ranges held because a host process ran in them (kInUseOnHost): held only while
// a scan finds such a process; ranges held for sandboxes are never touched.
TEST(UidRanges, RangeSeenInUseIsFreedOnceNoProcessUsesItAndKeptWhileOneDoes) {
  constexpr uint32_t F = 1u << 20;
  UidRanges r(F, 3);
  ASSERT_TRUE(r.hold(F, "sb"));
  std::set<uint32_t> ids = {F + 1, F + S + 7, F + S + 9, F - 1, F + 3 * S};  // two off the span
  int scans = 0;
  auto scan = [&](uint32_t lo, uint64_t hi) {
    EXPECT_EQ(lo, F);
    EXPECT_EQ(hi, uint64_t{F} + 3 * S);
    ++scans;
    return ids;
  };
  auto got = r.hold_in_use(scan);
  ASSERT_EQ(got.size(), 1u);  // F's range is the sandbox's already
  EXPECT_EQ(got[0].base, F + S);
  EXPECT_EQ(got[0].id, F + S + 7);
  EXPECT_EQ(r.holder(F + S), UidRanges::kInUseOnHost);
  EXPECT_EQ(r.holder(F), "sb");
  EXPECT_EQ(r.held_in_use(), 1u);
  EXPECT_EQ(*r.allocate("n"), F + 2 * S);
  EXPECT_FALSE(r.allocate("m"));

  // Still in use (by one id of the two): still held.
  ids.erase(F + S + 7);
  EXPECT_TRUE(r.recheck_in_use(scan).empty());
  EXPECT_EQ(r.holder(F + S), UidRanges::kInUseOnHost);
  EXPECT_FALSE(r.allocate("m"));
  // Gone: freed, and handed out again; the sandbox's range stays its own even though
  // no process runs in it.
  ids = {};
  EXPECT_EQ(r.recheck_in_use(scan), std::vector<uint32_t>{F + S});
  EXPECT_EQ(r.held_in_use(), 0u);
  EXPECT_EQ(r.holder(F), "sb");
  EXPECT_EQ(*r.allocate("m"), F + S);
  // Nothing held for the host: no scan at all.
  const int before = scans;
  EXPECT_TRUE(r.recheck_in_use(scan).empty());
  EXPECT_EQ(scans, before);
}

// A hold taken (or renewed) while a scan runs may be for a process that scan
// missed: only the next scan may free it.
TEST(UidRanges, RecheckFreesOnlyHoldsTakenBeforeItsScanBegan) {
  constexpr uint32_t F = 1u << 20;
  UidRanges r(F, 4);
  ASSERT_TRUE(r.hold(F, UidRanges::kInUseOnHost));
  ASSERT_TRUE(r.hold(F + S, UidRanges::kInUseOnHost));
  EXPECT_EQ(r.held_in_use(), 2u);
  auto racing = [&](uint32_t, uint64_t) {
    EXPECT_TRUE(r.hold(F + S, UidRanges::kInUseOnHost));      // seen in use again
    EXPECT_TRUE(r.hold(F + 2 * S, UidRanges::kInUseOnHost));  // new
    return std::set<uint32_t>{};
  };
  EXPECT_EQ(r.recheck_in_use(racing), std::vector<uint32_t>{F});
  EXPECT_EQ(r.holder(F + S), UidRanges::kInUseOnHost);
  EXPECT_EQ(r.holder(F + 2 * S), UidRanges::kInUseOnHost);
  auto none = [](uint32_t, uint64_t) { return std::set<uint32_t>{}; };
  EXPECT_EQ(r.recheck_in_use(none), (std::vector<uint32_t>{F + S, F + 2 * S}));
  EXPECT_EQ(r.held(), 0u);
  // A hold for the host released by its owner name is no longer re-checked.
  ASSERT_TRUE(r.hold(F + 3 * S, UidRanges::kInUseOnHost));
  r.release(F + 3 * S, UidRanges::kInUseOnHost);
  EXPECT_EQ(r.held_in_use(), 0u);
  EXPECT_EQ(*r.allocate("a"), F);
}

TEST(UidRanges, HostUidsInUseSeesThisProcess) {
  const uint32_t me = ::getuid();
  auto in_use = host_uids_in_use(me, uint64_t{me} + 1);
  EXPECT_TRUE(in_use.count(me));
  EXPECT_TRUE(host_uids_in_use(0x7ffe0000u, 0x7fff0000u).empty());
}

}  // namespace
}  // namespace tp::node
