// StmtCache: statements compiled once per SQL, reset between uses, bounded.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <string>

#include "control/sqlite/schema.h"

namespace tp::control::sqlite {
namespace {

class StmtCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(sqlite3_open(":memory:", &db_), SQLITE_OK);
    ASSERT_TRUE(exec_sql(db_, "CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER)"));
    cache_ = std::make_unique<StmtCache>(db_);
  }
  void TearDown() override {
    sqlite3_close_v2(db_);  // goes once the cache finalized its statements
    cache_.reset();
  }
  int64_t count() {
    auto st = cache_->prepare("SELECT count(*) FROM t");
    EXPECT_TRUE(st);
    EXPECT_EQ(sqlite3_step(st->get()), SQLITE_ROW);
    return sqlite3_column_int64(st->get(), 0);
  }
  sqlite3* db_ = nullptr;
  std::unique_ptr<StmtCache> cache_;
};

TEST_F(StmtCacheTest, TheSameSqlIsCompiledOnceAndResetBetweenUses) {
  size_t kept = cache_->size();
  sqlite3_stmt* first = nullptr;
  for (int i = 0; i < 3; ++i) {
    auto ins = cache_->prepare("INSERT INTO t (k, v) VALUES (?1, ?2)");
    ASSERT_TRUE(ins);
    if (!first) first = ins->get();
    EXPECT_EQ(ins->get(), first);
    sqlite3_bind_text(ins->get(), 1, ("k" + std::to_string(i)).c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(ins->get(), 2, i);
    EXPECT_EQ(sqlite3_step(ins->get()), SQLITE_DONE);
  }
  EXPECT_EQ(count(), 3);
  EXPECT_EQ(cache_->size(), kept + 2);  // the INSERT and the count, once each
  // Bindings are cleared after a use: an unbound ?2 is NULL, not the last value.
  {
    auto ins = cache_->prepare("INSERT INTO t (k, v) VALUES (?1, ?2)");
    ASSERT_TRUE(ins);
    sqlite3_bind_text(ins->get(), 1, "unbound", -1, SQLITE_TRANSIENT);
    EXPECT_EQ(sqlite3_step(ins->get()), SQLITE_DONE);
  }
  auto st = cache_->prepare("SELECT v IS NULL FROM t WHERE k = 'unbound'");
  ASSERT_TRUE(st);
  ASSERT_EQ(sqlite3_step(st->get()), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(st->get(), 0), 1);
}

TEST_F(StmtCacheTest, TransactionsRunThroughExec) {
  ASSERT_TRUE(cache_->exec("BEGIN IMMEDIATE"));
  ASSERT_TRUE(cache_->exec("INSERT INTO t (k, v) VALUES ('a', 1)"));
  ASSERT_TRUE(cache_->exec("ROLLBACK"));
  EXPECT_EQ(count(), 0);
  ASSERT_TRUE(cache_->exec("BEGIN IMMEDIATE"));
  ASSERT_TRUE(cache_->exec("INSERT INTO t (k, v) VALUES ('a', 1)"));
  ASSERT_TRUE(cache_->exec("COMMIT"));
  EXPECT_EQ(count(), 1);
  // A failing statement is an error that names it, and the cache stays usable.
  auto dup = cache_->exec("INSERT INTO t (k, v) VALUES ('a', 2)");
  ASSERT_FALSE(dup);
  EXPECT_NE(dup.error().message().find("INSERT INTO t"), std::string::npos)
      << dup.error().message();
  EXPECT_EQ(count(), 1);
}

TEST_F(StmtCacheTest, BadSqlIsAnErrorAndPastTheBoundStatementsAreNotKept) {
  auto bad = cache_->prepare("SELEC nothing");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("prepare SELEC nothing"), std::string::npos);
  // Fill the cache, then one more distinct statement still works (compiled for its use).
  for (size_t i = 0; i < StmtCache::kMax + 5; ++i) {
    auto st = cache_->prepare("SELECT " + std::to_string(i));
    ASSERT_TRUE(st) << i;
    ASSERT_EQ(sqlite3_step(st->get()), SQLITE_ROW);
    EXPECT_EQ(sqlite3_column_int64(st->get(), 0), static_cast<int64_t>(i));
  }
  EXPECT_EQ(cache_->size(), StmtCache::kMax);  // the ones past the bound were not kept
  // The cached ones are still served.
  auto again = cache_->prepare("SELECT 0");
  ASSERT_TRUE(again);
  ASSERT_EQ(sqlite3_step(again->get()), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int64(again->get(), 0), 0);
}

}  // namespace
}  // namespace tp::control::sqlite
