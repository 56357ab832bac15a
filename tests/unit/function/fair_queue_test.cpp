#include "function/fair_queue.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <random>
#include <set>

namespace tp::function {
namespace {

TEST(FairQueue, RoundRobinOverClients) {
  FairQueue q({.per_client_in_flight = 0});
  for (FairQueue::Id i = 1; i <= 100; ++i) ASSERT_TRUE(q.push("batch", i));
  EXPECT_EQ(q.pop(), 1u);
  ASSERT_TRUE(q.push("one", 1000));
  // The single call of "one" runs next, not after the 99 left of "batch".
  EXPECT_EQ(q.pop(), 1000u);
  EXPECT_EQ(q.pop(), 2u);
  ASSERT_TRUE(q.push("one", 1001));
  ASSERT_TRUE(q.push("one", 1002));
  EXPECT_EQ(q.pop(), 1001u);
  EXPECT_EQ(q.pop(), 3u);  // then turns: "one" does not take two in a row
  EXPECT_EQ(q.pop(), 1002u);
}

TEST(FairQueue, PerClientLimitLeavesRoomForOthers) {
  FairQueue q({.per_client_in_flight = 2});
  for (FairQueue::Id i = 1; i <= 5; ++i) ASSERT_TRUE(q.push("a", i));
  EXPECT_EQ(q.pop(), 1u);
  EXPECT_EQ(q.pop(), 2u);
  EXPECT_FALSE(q.pop());  // "a" holds its two
  ASSERT_TRUE(q.push("b", 10));
  EXPECT_EQ(q.pop(), 10u);
  q.done("a");
  EXPECT_EQ(q.pop(), 3u);
  EXPECT_EQ(q.in_flight_of("a"), 2u);
  EXPECT_EQ(q.queued_of("a"), 2u);
}

TEST(FairQueue, CallsOfOneClientRunInOrder) {
  FairQueue q({});
  for (FairQueue::Id i = 1; i <= 10; ++i) ASSERT_TRUE(q.push("a", i));
  for (FairQueue::Id i = 1; i <= 10; ++i) EXPECT_EQ(q.pop(), i);
}

TEST(FairQueue, QueueLimits) {
  FairQueue q({.per_client_in_flight = 1, .per_client_queued = 2, .total_queued = 3});
  ASSERT_TRUE(q.push("a", 1));
  ASSERT_TRUE(q.push("a", 2));
  auto full = q.push("a", 3);
  ASSERT_FALSE(full);
  EXPECT_EQ(full.error().code, Code::kResourceExhausted);
  ASSERT_TRUE(q.push("b", 4));
  EXPECT_FALSE(q.push("c", 5));
  EXPECT_EQ(q.queued(), 3u);
}

TEST(FairQueue, RemoveTakesOnlyQueuedCalls) {
  FairQueue q({});
  ASSERT_TRUE(q.push("a", 1));
  ASSERT_TRUE(q.push("a", 2));
  EXPECT_EQ(q.pop(), 1u);
  EXPECT_FALSE(q.remove(1));  // running
  EXPECT_TRUE(q.remove(2));
  EXPECT_FALSE(q.remove(2));
  EXPECT_FALSE(q.pop());
  EXPECT_EQ(q.queued(), 0u);
  q.done("a");
  EXPECT_EQ(q.in_flight(), 0u);
  q.done("a");  // a stray done changes nothing
  EXPECT_EQ(q.in_flight(), 0u);
}

// Random pushes, pops, removes and completions against a model: every pop respects the
// per-client limit, takes the oldest call of its client, and serves clients in turn; the
// counts always agree.
TEST(FairQueue, RandomInterleavingsKeepTheRules) {
  const int seeds = std::getenv("TP_TEST_SEEDS") ? std::atoi(std::getenv("TP_TEST_SEEDS")) : 500;
  for (int seed = 0; seed < seeds; ++seed) {
    std::mt19937 rng(seed);
    const size_t limit = 1 + rng() % 3;
    FairQueue q({.per_client_in_flight = limit});
    std::map<std::string, std::deque<FairQueue::Id>> queued;
    std::map<std::string, size_t> running;
    std::map<FairQueue::Id, std::string> owner;
    std::vector<std::string> served;  // clients in the order they were served
    FairQueue::Id next = 1;
    for (int step = 0; step < 300; ++step) {
      int op = static_cast<int>(rng() % 10);
      std::string c = "c" + std::to_string(rng() % 4);
      if (op < 4) {
        ASSERT_TRUE(q.push(c, next));
        queued[c].push_back(next);
        owner[next] = c;
        ++next;
      } else if (op < 7) {
        auto id = q.pop();
        bool any = false;
        for (auto& [cl, ids] : queued) any = any || (!ids.empty() && running[cl] < limit);
        ASSERT_EQ(id.has_value(), any) << "seed " << seed;
        if (!id) continue;
        const std::string& cl = owner.at(*id);
        ASSERT_LT(running[cl], limit);
        ASSERT_EQ(queued[cl].front(), *id) << "seed " << seed << ": not the client's oldest call";
        queued[cl].pop_front();
        ++running[cl];
        served.push_back(cl);
      } else if (op < 8) {
        if (queued[c].empty()) continue;
        size_t i = rng() % queued[c].size();
        ASSERT_TRUE(q.remove(queued[c][i]));
        queued[c].erase(queued[c].begin() + static_cast<long>(i));
      } else {
        if (running[c] == 0) continue;
        q.done(c);
        --running[c];
      }
      size_t nq = 0, nr = 0;
      for (auto& [cl, ids] : queued) {
        nq += ids.size();
        ASSERT_EQ(q.queued_of(cl), ids.size());
      }
      for (auto& [cl, n] : running) {
        nr += n;
        ASSERT_EQ(q.in_flight_of(cl), n);
      }
      ASSERT_EQ(q.queued(), nq);
      ASSERT_EQ(q.in_flight(), nr);
    }
  }
}

// Two clients that always have calls queued are served alternately.
TEST(FairQueue, BusyClientsAlternate) {
  FairQueue q({.per_client_in_flight = 0});
  for (FairQueue::Id i = 0; i < 50; ++i) {
    ASSERT_TRUE(q.push("a", 2 * i + 1));
    ASSERT_TRUE(q.push("b", 2 * i + 2));
  }
  std::string last;
  for (int i = 0; i < 100; ++i) {
    auto id = q.pop();
    ASSERT_TRUE(id);
    std::string who = (*id % 2) ? "a" : "b";
    EXPECT_NE(who, last);
    last = who;
  }
}

}  // namespace
}  // namespace tp::function
