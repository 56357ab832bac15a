// The DocStore contract, run against every implementation (SQLite in a temp
// dir, the in-memory one), and the typed stores over it (templates, jobs).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <memory>

#include "control/doc_store.h"
#include "control/job_store.h"
#include "control/sqlite/doc_store.h"
#include "control/template_store.h"

namespace tp::control {
namespace {

struct DocStoreMaker {
  std::string name;
  std::function<std::unique_ptr<DocStore>(const std::string& dir)> make;
};

std::ostream& operator<<(std::ostream& os, const DocStoreMaker& m) { return os << m.name; }

class DocStoreContract : public ::testing::TestWithParam<DocStoreMaker> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tp-docs-XXXXXX";
    dir_ = mkdtemp(tmpl);
    st_ = GetParam().make(dir_);
    ASSERT_TRUE(st_);
  }
  void TearDown() override {
    st_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::string dir_;
  std::unique_ptr<DocStore> st_;
};

TEST_P(DocStoreContract, PutIsCreateOrCompareAndSet) {
  ASSERT_EQ(*st_->put(Doc{"a", "{\"x\":1}", true, 0, 0}), 1u);
  auto dup = st_->put(Doc{"a", "{}", true, 0, 0});
  ASSERT_FALSE(dup);
  EXPECT_EQ(dup.error().code, Code::kConflict);
  ASSERT_EQ(*st_->put(Doc{"a", "{\"x\":2}", true, 0, 1}), 2u);
  auto stale = st_->put(Doc{"a", "{\"x\":3}", true, 0, 1});
  ASSERT_FALSE(stale);
  EXPECT_EQ(stale.error().code, Code::kConflict);
  auto unknown = st_->put(Doc{"b", "{}", true, 0, 4});
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().code, Code::kNotFound);
  auto got = st_->get("a");
  ASSERT_TRUE(got && *got);
  EXPECT_EQ((*got)->body, "{\"x\":2}");
  EXPECT_EQ((*got)->version, 2u);
  EXPECT_FALSE(*st_->get("b"));
}

TEST_P(DocStoreContract, ListsByKeyLiveOnlyAndPrunesEnded) {
  ASSERT_TRUE(st_->put(Doc{"c", "{}", true, 0, 0}));
  ASSERT_TRUE(st_->put(Doc{"a", "{}", false, 100, 0}));
  ASSERT_TRUE(st_->put(Doc{"b", "{}", false, 300, 0}));
  auto all = st_->list(false);
  ASSERT_TRUE(all);
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].key, "a");
  EXPECT_EQ((*all)[2].key, "c");
  auto live = st_->list(true);
  ASSERT_EQ(live->size(), 1u);
  EXPECT_EQ((*live)[0].key, "c");
  EXPECT_EQ(*st_->prune_ended(200), 1);  // "a" only
  EXPECT_FALSE(*st_->get("a"));
  EXPECT_TRUE(*st_->get("b"));
  EXPECT_TRUE(*st_->get("c"));
}

TEST_P(DocStoreContract, RemoveIsACompareAndSet) {
  ASSERT_TRUE(st_->put(Doc{"a", "{}", true, 0, 0}));
  auto stale = st_->remove("a", 7);
  ASSERT_FALSE(stale);
  EXPECT_EQ(stale.error().code, Code::kConflict);
  ASSERT_TRUE(st_->remove("a", 1));
  auto gone = st_->remove("a", 1);
  ASSERT_FALSE(gone);
  EXPECT_EQ(gone.error().code, Code::kNotFound);
}

TEST_P(DocStoreContract, TemplatesAndJobsRoundTrip) {
  TemplateStore templates(*st_);
  TemplateRecord t;
  t.name = "swe";
  t.image = "py:3";
  t.memory_mb = 1024;
  t.cpus = 0.5;
  t.env = {{"K", "V"}};
  t.labels = {{"team", "rl"}};
  t.priority = "best-effort";
  t.pool_min = 2;
  t.pool_max = 50;
  ASSERT_EQ(*templates.put(t), 1u);
  auto back = templates.get("swe");
  ASSERT_TRUE(back && *back);
  EXPECT_EQ((*back)->image, "py:3");
  EXPECT_EQ((*back)->cpus, 0.5);
  EXPECT_EQ((*back)->env, t.env);
  EXPECT_EQ((*back)->pool_max, 50u);
  EXPECT_EQ((*back)->version, 1u);
  JobStore jobs(*st_);
  JobRecord j;
  j.id = "job-x";
  j.name = "run 7";
  j.lease_seconds = 30;
  j.quota.sandboxes = 10;
  j.quota.cpus = 4;
  ASSERT_TRUE(jobs.put(j));
  auto jb = jobs.get("job-x");
  ASSERT_TRUE(jb && *jb);
  EXPECT_EQ((*jb)->quota.sandboxes, 10u);
  EXPECT_EQ((*jb)->quota.cpus, 4.0);
  auto ended = **jb;
  ended.state = "ended";
  ended.ended_ms = 5;
  ASSERT_TRUE(jobs.put(ended));
  EXPECT_TRUE(jobs.list(true)->empty() || jobs.list(true)->front().id != "job-x");
  EXPECT_EQ(*jobs.prune_ended(6), 1);
}

INSTANTIATE_TEST_SUITE_P(
    Stores, DocStoreContract,
    ::testing::Values(DocStoreMaker{"memory",
                                    [](const std::string&) -> std::unique_ptr<DocStore> {
                                      return std::make_unique<MemoryDocStore>();
                                    }},
                      DocStoreMaker{"sqlite",
                                    [](const std::string& dir) -> std::unique_ptr<DocStore> {
                                      auto s =
                                          sqlite::SqliteDocStore::open(dir + "/state.db", "jobs");
                                      return s ? std::move(*s) : nullptr;
                                    }}),
    [](const auto& info) { return info.param.name; });

TEST(SqliteDocStore, SurvivesReopenAndRefusesAnUnknownTable) {
  char tmpl[] = "/tmp/tp-docs-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  {
    auto s = sqlite::SqliteDocStore::open(dir + "/state.db", "templates");
    ASSERT_TRUE(s);
    ASSERT_TRUE((*s)->put(Doc{"t", "{\"image\":\"host\"}", true, 0, 0}));
  }
  auto s = sqlite::SqliteDocStore::open(dir + "/state.db", "templates");
  ASSERT_TRUE(s);
  auto got = (*s)->get("t");
  ASSERT_TRUE(got && *got);
  EXPECT_EQ((*got)->version, 1u);
  EXPECT_FALSE(sqlite::SqliteDocStore::open(dir + "/state.db", "sandboxes; DROP TABLE x"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tp::control
