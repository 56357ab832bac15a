// The step log's touch ahead (node/step_log.h, "Timestamps"): hold() moves the mtime of
// a log not written for a while, so that the call's record finds its inode clean; the
// records stay as they were written.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "node/step_log.h"
#include "temp_dir.h"

namespace tp::node {
namespace {

constexpr const char* kTouched = "n0-00000000700c";

class StepLogTouchTest : public ::testing::Test {
 protected:
  std::unique_ptr<StepLog> open(bool touch_ahead,
                                std::chrono::milliseconds after = std::chrono::milliseconds(1)) {
    StepLog::Options o;
    o.data_dir = dir_.path();
    o.touch_ahead = touch_ahead;
    o.touch_after = after;
    auto l = StepLog::open(o);
    EXPECT_TRUE(l) << (l ? "" : l.error().message());
    return l ? std::move(*l) : nullptr;
  }
  static StepRecord rec(const std::string& key) {
    StepRecord r;
    r.key = key;
    r.request.method = "POST";
    r.request.target = std::string("/v1/sandboxes/") + kTouched + "/exec";
    r.request.body_sha256 = std::string(32, 'h');
    r.status = 200;
    r.content_type = "application/json";
    r.started_us = 1;
    r.finished_us = 2;
    return r;
  }
  std::string log_path(const std::string& sb = kTouched) const {
    return dir_.path() + "/sandboxes/" + sb + "/steps.log";
  }
  int64_t mtime_ns() const {
    struct stat st {};
    EXPECT_EQ(::stat(log_path().c_str(), &st), 0);
    return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  }
  // Past the coarse clock's next tick (at most 10 ms at HZ=100) and touch_after.
  static void pause() { std::this_thread::sleep_for(std::chrono::milliseconds(30)); }
  // How far a hold() made after a pause moves the log's mtime (released at once).
  int64_t moved_by_hold(StepLog& l) {
    const int64_t before = mtime_ns();
    pause();
    l.hold(kTouched);
    const int64_t moved = mtime_ns() - before;
    l.release(kTouched);
    return moved;
  }

  test::TempDir dir_{"tp-steptouch"};
};

TEST_F(StepLogTouchTest, HoldMovesTheMtimeOfALogNotWrittenForAWhile) {
  auto l = open(true);
  ASSERT_TRUE(l);
  ASSERT_TRUE(l->append_sync(kTouched, rec("a"), "one"));
  const int64_t written = mtime_ns();
  pause();
  l->hold(kTouched);
  const int64_t touched = mtime_ns();
  EXPECT_GT(touched, written);
  ASSERT_TRUE(l->append_sync(kTouched, rec("b"), "two"));
  l->release(kTouched);

  auto recs = l->list(kTouched, 0, 10, true);
  ASSERT_TRUE(recs);
  ASSERT_EQ(recs->size(), 2u);
  EXPECT_EQ((*recs)[0].key, "a");
  EXPECT_EQ((*recs)[1].key, "b");
  EXPECT_EQ((*recs)[1].answer, "two");
  EXPECT_GE(mtime_ns(), touched);
}

TEST_F(StepLogTouchTest, WithoutItHoldLeavesTheMtimeAlone) {
  auto l = open(false);
  ASSERT_TRUE(l);
  ASSERT_TRUE(l->append_sync(kTouched, rec("a"), "one"));
  EXPECT_EQ(moved_by_hold(*l), 0);
}

TEST_F(StepLogTouchTest, HoldLeavesALogWrittenMomentsAgoAlone) {
  auto l = open(true, std::chrono::hours(1));  // every call comes "moments" after the last
  ASSERT_TRUE(l);
  ASSERT_TRUE(l->append_sync(kTouched, rec("a"), "one"));
  EXPECT_EQ(moved_by_hold(*l), 0);
}

TEST_F(StepLogTouchTest, HoldMakesNoLogForASandboxThatHasNone) {
  auto l = open(true);
  ASSERT_TRUE(l);
  const std::string other = "n0-00000000700d";
  l->hold(other);
  EXPECT_FALSE(std::filesystem::exists(log_path(other)));
  l->release(other);
  ASSERT_TRUE(l->append_sync(other, rec("c"), "three"));  // its first record makes it
  auto recs = l->list(other, 0, 10, false);
  ASSERT_TRUE(recs);
  ASSERT_EQ(recs->size(), 1u);
  EXPECT_EQ((*recs)[0].key, "c");
}

TEST_F(StepLogTouchTest, AnEndedSandboxsLogIsNotTouched) {
  auto l = open(true);
  ASSERT_TRUE(l);
  ASSERT_TRUE(l->append_sync(kTouched, rec("a"), "one"));
  l->sandbox_ended(kTouched);
  ASSERT_TRUE(l->append_sync(kTouched, rec("late"), "refused"));  // after its end, as a 409 is
  EXPECT_EQ(moved_by_hold(*l), 0);
}

TEST_F(StepLogTouchTest, ATouchOpensNoDescriptorPastTheCap) {
  auto l = open(true);
  ASSERT_TRUE(l);
  ASSERT_TRUE(l->append_sync(kTouched, rec("a"), "one"));
  // 33 other sandboxes written after it: its descriptor is the least recent, closed.
  for (int i = 0; i < 33; ++i) {
    char id[32];
    std::snprintf(id, sizeof id, "n0-0000000071%02d", i);
    ASSERT_TRUE(l->append_sync(id, rec("o"), "other"));
  }
  EXPECT_EQ(moved_by_hold(*l), 0);
  ASSERT_TRUE(l->append_sync(kTouched, rec("b"), "two"));  // its record still opens it
  auto recs = l->list(kTouched, 0, 10, false);
  ASSERT_TRUE(recs);
  EXPECT_EQ(recs->size(), 2u);
}

}  // namespace
}  // namespace tp::node
