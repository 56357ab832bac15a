#include "control/store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

namespace tp::control {
namespace {

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tp-store-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(StoreTest, PutGetListSurviveReopen) {
  {
    auto st = Store::open(dir_ + "/s.db");
    ASSERT_TRUE(st);
    SandboxRecord r;
    r.id = "n0-aaaaaaaaaaaa";
    r.state = "running";
    r.labels = {{"job", "a"}};
    r.created_at_ms = 5;
    ASSERT_TRUE((*st)->put(r));
    r.id = "n0-bbbbbbbbbbbb";
    r.state = "stopped";
    r.ended_at_ms = 10;
    ASSERT_TRUE((*st)->put(r));
  }
  auto st = Store::open(dir_ + "/s.db");
  ASSERT_TRUE(st);
  auto got = (*st)->get("n0-aaaaaaaaaaaa");
  ASSERT_TRUE(got && *got);
  EXPECT_EQ((*got)->labels.at("job"), "a");
  EXPECT_EQ((*(*st)->list(true)).size(), 1u);
  EXPECT_EQ((*(*st)->list(false)).size(), 2u);
  EXPECT_FALSE(*(*st)->get("n0-cccccccccccc"));
  EXPECT_EQ(*(*st)->prune_ended(11), 1);
  EXPECT_EQ((*(*st)->list(false)).size(), 1u);
}

TEST_F(StoreTest, RepeatedPutsReplaceAndNoFieldLeaksIntoTheNextRecord) {
  // put() reuses one prepared statement: each call must bind everything afresh.
  auto st = Store::open(dir_ + "/s.db");
  ASSERT_TRUE(st);
  SandboxRecord a;
  a.id = "n0-aaaaaaaaaaaa";
  a.state = "running";
  a.end_reason = "";
  a.labels = {{"job", "a"}};
  a.memory_mb = 512;
  ASSERT_TRUE((*st)->put(a));
  a.state = "stopped";
  a.end_reason = "ttl";
  a.ended_at_ms = 42;
  ASSERT_TRUE((*st)->put(a));  // the same id again: replaced
  SandboxRecord b;
  b.id = "n0-bbbbbbbbbbbb";
  b.state = "running";
  ASSERT_TRUE((*st)->put(b));
  auto got_a = (*st)->get(a.id);
  ASSERT_TRUE(got_a && *got_a);
  EXPECT_EQ((*got_a)->state, "stopped");
  EXPECT_EQ((*got_a)->end_reason, "ttl");
  EXPECT_EQ((*got_a)->ended_at_ms, 42);
  EXPECT_EQ((*got_a)->memory_mb, 512u);
  auto got_b = (*st)->get(b.id);
  ASSERT_TRUE(got_b && *got_b);
  EXPECT_TRUE((*got_b)->labels.empty());
  EXPECT_EQ((*got_b)->memory_mb, 0u);
  EXPECT_EQ((*got_b)->end_reason, "");
  EXPECT_EQ((*(*st)->list(false)).size(), 2u);
}

TEST_F(StoreTest, OpenFailsCleanlyOnBadPath) {
  auto st = Store::open(dir_ + "/no/such/dir/s.db");
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, Code::kInternal);
}

}  // namespace
}  // namespace tp::control
