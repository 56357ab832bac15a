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

TEST_F(StoreTest, OpenFailsCleanlyOnBadPath) {
  auto st = Store::open(dir_ + "/no/such/dir/s.db");
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, Code::kInternal);
}

}  // namespace
}  // namespace tp::control
