// The SandboxStore contract, run against every implementation (SQLite in a
// temp dir, the in-memory one), plus the SQLite store's own promises
// (survives reopen, migrates a schema-0 database).
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <memory>

#include "control/memory_store.h"
#include "control/sqlite/image_record_store.h"
#include "control/sqlite/sandbox_store.h"

namespace tp::control {
namespace {

struct StoreMaker {
  std::string name;
  std::function<std::unique_ptr<SandboxStore>(const std::string& dir)> make;
};

std::ostream& operator<<(std::ostream& os, const StoreMaker& m) { return os << m.name; }

class SandboxStoreContract : public ::testing::TestWithParam<StoreMaker> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tp-store-XXXXXX";
    dir_ = mkdtemp(tmpl);
    st_ = GetParam().make(dir_);
    ASSERT_TRUE(st_);
  }
  void TearDown() override {
    st_.reset();
    std::filesystem::remove_all(dir_);
  }
  static SandboxRecord rec(const std::string& id, const std::string& state, int64_t created,
                           std::map<std::string, std::string> labels = {}) {
    SandboxRecord r;
    r.id = id;
    r.state = state;
    r.created_at_ms = created;
    r.labels = std::move(labels);
    r.memory_mb = 512;
    r.env = {{"A", "1"}};
    return r;
  }
  static SandboxQuery query(std::string state, std::map<std::string, std::string> labels,
                            bool live_only) {
    SandboxQuery q;
    q.state = std::move(state);
    q.labels = std::move(labels);
    q.live_only = live_only;
    return q;
  }
  std::string dir_;
  std::unique_ptr<SandboxStore> st_;
};

TEST_P(SandboxStoreContract, InsertThenGetAnswersVersionOne) {
  auto r = rec("n0-a", "creating", 1, {{"job", "x"}});
  const std::vector<std::string> layers = {"sha256:" + std::string(64, 'a'),
                                           "sha256:" + std::string(64, 'b')};
  r.layers = layers;
  auto v = st_->insert(r);
  ASSERT_TRUE(v) << v.error().message();
  EXPECT_EQ(*v, 1u);
  auto got = st_->get("n0-a");
  ASSERT_TRUE(got && *got);
  EXPECT_EQ((*got)->state, "creating");
  EXPECT_EQ((*got)->version, 1u);
  EXPECT_EQ((*got)->labels.at("job"), "x");
  EXPECT_EQ((*got)->env.at("A"), "1");
  EXPECT_EQ((*got)->memory_mb, 512u);
  EXPECT_EQ((*got)->layers, layers) << "top first";
  auto none = st_->get("n0-zz");
  ASSERT_TRUE(none);
  EXPECT_FALSE(*none);
}

TEST_P(SandboxStoreContract, InsertOfAnExistingIdFailsAndChangesNothing) {
  ASSERT_TRUE(st_->insert(rec("n0-a", "creating", 1)));
  auto again = st_->insert(rec("n0-a", "running", 2));
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code, Code::kConflict);
  EXPECT_EQ((*st_->get("n0-a"))->state, "creating");
}

TEST_P(SandboxStoreContract, UpdateIsACompareAndSetOnTheVersion) {
  ASSERT_TRUE(st_->insert(rec("n0-a", "creating", 1, {{"job", "x"}})));
  auto r = **st_->get("n0-a");
  r.state = "running";
  auto v2 = st_->update(r);
  ASSERT_TRUE(v2) << v2.error().message();
  EXPECT_EQ(*v2, 2u);
  // A writer holding the old version loses.
  r.state = "stopped";
  r.end_reason = "deleted";
  auto stale = st_->update(r);  // r.version is still 1
  ASSERT_FALSE(stale);
  EXPECT_EQ(stale.error().code, Code::kConflict);
  auto got = **st_->get("n0-a");
  EXPECT_EQ(got.state, "running");
  EXPECT_EQ(got.end_reason, "");
  EXPECT_EQ(got.version, 2u);
  // With the current version it goes through; labels stay as inserted.
  r.version = 2;
  r.labels = {{"other", "y"}};
  r.ended_at_ms = 9;
  ASSERT_TRUE(st_->update(r));
  got = **st_->get("n0-a");
  EXPECT_EQ(got.state, "stopped");
  EXPECT_EQ(got.end_reason, "deleted");
  EXPECT_EQ(got.ended_at_ms, 9);
  EXPECT_EQ(got.version, 3u);
  EXPECT_EQ(got.labels, (std::map<std::string, std::string>{{"job", "x"}}));
}

TEST_P(SandboxStoreContract, UpdateOfAnUnknownIdIsNotFound) {
  auto r = rec("n0-q", "running", 1);
  r.version = 1;
  auto v = st_->update(r);
  ASSERT_FALSE(v);
  EXPECT_EQ(v.error().code, Code::kNotFound);
  EXPECT_FALSE(*st_->get("n0-q"));
}

TEST_P(SandboxStoreContract, ListFiltersByStateLabelsAndLiveness) {
  ASSERT_TRUE(st_->insert(rec("n0-c", "running", 3, {{"job", "a"}, {"team", "t"}})));
  ASSERT_TRUE(st_->insert(rec("n0-a", "creating", 1, {{"job", "a"}})));
  auto ended = rec("n0-b", "stopped", 2, {{"job", "b"}});
  ended.ended_at_ms = 10;
  ended.end_reason = "ttl";
  ASSERT_TRUE(st_->insert(ended));
  auto ids = [&](SandboxQuery q) {
    std::vector<std::string> out;
    auto l = st_->list(q);
    EXPECT_TRUE(l);
    for (auto& r : *l) out.push_back(r.id);
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(ids({}), (V{"n0-a", "n0-b", "n0-c"}));  // by created_at_ms
  EXPECT_EQ(ids(query("", {}, true)), (V{"n0-a", "n0-c"}));
  EXPECT_EQ(ids(query("creating", {}, false)), (V{"n0-a"}));
  EXPECT_EQ(ids(query("", {{"job", "a"}}, false)), (V{"n0-a", "n0-c"}));
  EXPECT_EQ(ids(query("", {{"job", "a"}, {"team", "t"}}, false)), (V{"n0-c"}));
  EXPECT_EQ(ids(query("", {{"job", "b"}}, true)), (V{}));
  EXPECT_EQ(ids(query("stopped", {{"job", "b"}}, false)), (V{"n0-b"}));
  EXPECT_EQ(ids(query("", {{"job", "zz"}}, false)), (V{}));
}

TEST_P(SandboxStoreContract, PruneDeletesOnlyEndedBeforeTheCutoff) {
  auto a = rec("n0-a", "stopped", 1, {{"job", "a"}});
  a.ended_at_ms = 5;
  auto b = rec("n0-b", "stopped", 2);
  b.ended_at_ms = 50;
  ASSERT_TRUE(st_->insert(a));
  ASSERT_TRUE(st_->insert(b));
  ASSERT_TRUE(st_->insert(rec("n0-c", "running", 3)));
  auto n = st_->prune_ended(10);
  ASSERT_TRUE(n);
  EXPECT_EQ(*n, 1);
  EXPECT_FALSE(*st_->get("n0-a"));
  EXPECT_TRUE(*st_->get("n0-b"));
  EXPECT_TRUE(*st_->get("n0-c"));
  // Its labels went with it: a new record under the id starts clean.
  ASSERT_TRUE(st_->insert(rec("n0-a", "creating", 4)));
  EXPECT_EQ((*st_->list(query("", {{"job", "a"}}, false))).size(), 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Stores, SandboxStoreContract,
    ::testing::Values(StoreMaker{"sqlite",
                                 [](const std::string& dir) -> std::unique_ptr<SandboxStore> {
                                   auto s = sqlite::SqliteSandboxStore::open(dir + "/state.db");
                                   if (!s) return nullptr;
                                   return std::unique_ptr<SandboxStore>(std::move(*s));
                                 }},
                      StoreMaker{"memory",
                                 [](const std::string&) -> std::unique_ptr<SandboxStore> {
                                   return std::make_unique<MemorySandboxStore>();
                                 }}),
    [](const auto& info) { return info.param.name; });

class SqliteStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tp-store-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(SqliteStoreTest, RecordsSurviveReopen) {
  {
    auto st = sqlite::SqliteSandboxStore::open(dir_ + "/s.db");
    ASSERT_TRUE(st);
    SandboxRecord r;
    r.id = "n0-a";
    r.state = "running";
    r.labels = {{"job", "a"}};
    ASSERT_TRUE((*st)->insert(r));
  }
  auto st = sqlite::SqliteSandboxStore::open(dir_ + "/s.db");
  ASSERT_TRUE(st);
  SandboxQuery q;
  q.state = "running";
  q.labels = {{"job", "a"}};
  q.live_only = true;
  auto l = (*st)->list(q);
  ASSERT_TRUE(l);
  ASSERT_EQ(l->size(), 1u);
  EXPECT_EQ((*l)[0].version, 1u);
}

TEST_F(SqliteStoreTest, MigratesASchemaZeroDatabase) {
  // The table as the first daemon versions made it (no version column, labels only as JSON).
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir_ + "/s.db").c_str(), &db), SQLITE_OK);
    const char* sql =
        "CREATE TABLE sandboxes ("
        " id TEXT PRIMARY KEY, state TEXT NOT NULL, tier TEXT, image TEXT, node TEXT,"
        " memory_mb INTEGER, cpus REAL, pids INTEGER, disk_mb INTEGER, ttl_seconds INTEGER,"
        " idle_timeout_seconds INTEGER, labels TEXT, env TEXT, created_at_ms INTEGER,"
        " expires_at_ms INTEGER, ended_at_ms INTEGER, end_reason TEXT) WITHOUT ROWID;"
        "INSERT INTO sandboxes VALUES ('n0-old','running','container','host','n0',512,1.0,512,1024,"
        " 600,0,'{\"job\":\"j1\",\"k\":\"v\"}','{}',7,607,0,'');"
        "INSERT INTO sandboxes VALUES "
        "('n0-gone','stopped','container','host','n0',512,1.0,512,1024,"
        " 600,0,'not json','{}',5,605,9,'ttl');";
    ASSERT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  }
  for (int round = 0; round < 2; ++round) {  // the second open finds schema 1: no-op
    auto st = sqlite::SqliteSandboxStore::open(dir_ + "/s.db");
    ASSERT_TRUE(st) << st.error().message();
    auto old = (*st)->get("n0-old");
    ASSERT_TRUE(old && *old);
    EXPECT_EQ((*old)->ttl_seconds, 600u);
    SandboxQuery q;
    q.labels = {{"job", "j1"}, {"k", "v"}};
    auto l = (*st)->list(q);
    ASSERT_TRUE(l);
    ASSERT_EQ(l->size(), 1u);
    EXPECT_EQ((*l)[0].id, "n0-old");
    EXPECT_EQ((*(*st)->list({})).size(), 2u);
    if (round == 0) {
      EXPECT_EQ((*old)->version, 1u);
      auto r = **old;
      r.state = "stopped";
      r.ended_at_ms = 20;
      r.end_reason = "daemon_restart";
      ASSERT_TRUE((*st)->update(r));
    } else {
      EXPECT_EQ((*old)->state, "stopped");
      EXPECT_EQ((*old)->version, 2u);
    }
  }
}

TEST_P(SandboxStoreContract, KeepsTheUidRangeThroughInsertUpdateAndList) {
  auto r = rec("n0-u", "creating", 1);
  r.uid_base = 2u << 20;
  ASSERT_TRUE(st_->insert(r));
  auto got = st_->get("n0-u");
  ASSERT_TRUE(got && *got);
  EXPECT_EQ((*got)->uid_base, 2u << 20);
  auto up = **got;
  up.state = "running";
  up.uid_base = 0x7fff0000u;  // the highest base below 2^31
  ASSERT_TRUE(st_->update(up));
  auto l = st_->list(query("running", {}, true));
  ASSERT_TRUE(l);
  ASSERT_EQ(l->size(), 1u);
  EXPECT_EQ((*l)[0].uid_base, 0x7fff0000u);
}

TEST_F(SqliteStoreTest, MigratesASchemaOneDatabaseWithoutUidRanges) {
  {
    auto st = sqlite::SqliteSandboxStore::open(dir_ + "/s.db");
    ASSERT_TRUE(st);
  }
  // Schema 1 as it was: the same table without the uid_base column.
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir_ + "/s.db").c_str(), &db), SQLITE_OK);
    const char* sql =
        "DROP TABLE sandboxes;"
        "CREATE TABLE sandboxes ("
        " id TEXT PRIMARY KEY, state TEXT NOT NULL, tier TEXT, image TEXT, node TEXT,"
        " memory_mb INTEGER, cpus REAL, pids INTEGER, disk_mb INTEGER, ttl_seconds INTEGER,"
        " idle_timeout_seconds INTEGER, labels TEXT, env TEXT, created_at_ms INTEGER,"
        " expires_at_ms INTEGER, ended_at_ms INTEGER, end_reason TEXT,"
        " version INTEGER NOT NULL DEFAULT 1) WITHOUT ROWID;"
        "INSERT INTO sandboxes VALUES ('n0-old','running','container','host','n0',512,1.0,512,"
        " 1024,600,0,'{}','{}',7,607,0,'',3);"
        "PRAGMA user_version = 1;";
    ASSERT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  }
  auto st = sqlite::SqliteSandboxStore::open(dir_ + "/s.db");
  ASSERT_TRUE(st) << st.error().message();
  auto old = (*st)->get("n0-old");
  ASSERT_TRUE(old && *old);
  EXPECT_EQ((*old)->uid_base, 0u);  // made before per-sandbox ranges
  EXPECT_EQ((*old)->version, 3u);
  auto r = **old;
  r.uid_base = 1u << 20;
  ASSERT_TRUE((*st)->update(r));
  EXPECT_EQ((*(*st)->get("n0-old"))->uid_base, 1u << 20);
}

// A file whose version number meant another set of columns (a development
// build numbered uid_base 2, before the layers column): every step runs, so it
// still gains what it lacks.
TEST_F(SqliteStoreTest, MigratesAVersionTwoFileWithOtherColumns) {
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir_ + "/s.db").c_str(), &db), SQLITE_OK);
    const char* sql =
        "CREATE TABLE sandboxes ("
        " id TEXT PRIMARY KEY, state TEXT NOT NULL, tier TEXT, image TEXT, node TEXT,"
        " memory_mb INTEGER, cpus REAL, pids INTEGER, disk_mb INTEGER, ttl_seconds INTEGER,"
        " idle_timeout_seconds INTEGER, labels TEXT, env TEXT, created_at_ms INTEGER,"
        " expires_at_ms INTEGER, ended_at_ms INTEGER, end_reason TEXT,"
        " version INTEGER NOT NULL DEFAULT 1, uid_base INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;"
        "INSERT INTO sandboxes VALUES ('n0-dev','running','container','host','n0',512,1.0,512,"
        " 1024,600,0,'{}','{}',7,607,0,'',3,1048576);"
        "PRAGMA user_version = 2;";
    ASSERT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  }
  auto st = sqlite::SqliteSandboxStore::open(dir_ + "/s.db");
  ASSERT_TRUE(st) << st.error().message();
  SandboxQuery q;
  q.live_only = true;
  auto l = (*st)->list(q);
  ASSERT_TRUE(l) << l.error().message();
  ASSERT_EQ(l->size(), 1u);
  EXPECT_EQ((*l)[0].uid_base, 1048576u);
  EXPECT_TRUE((*l)[0].layers.empty());
  auto images = sqlite::SqliteImageRecordStore::open(dir_ + "/s.db");
  ASSERT_TRUE(images) << images.error().message();
  EXPECT_TRUE((*images)->list({}));
}

TEST_F(SqliteStoreTest, OpenFailsCleanlyOnBadPath) {
  auto st = sqlite::SqliteSandboxStore::open(dir_ + "/no/such/dir/s.db");
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, Code::kInternal);
}

}  // namespace
}  // namespace tp::control

namespace tp::control {
namespace {

// Schema 4: job, step, template, priority and the pooled flag go through insert,
// update and list; pooled records are hidden unless asked for; a hand-out
// replaces the labels (update_with_labels) while update() keeps them.
TEST_P(SandboxStoreContract, KeepsJobsStepsAndPoolsAndHandsOutWithNewLabels) {
  auto r = rec("n0-p", "running", 1, {{"pool", "yes"}});
  r.template_name = "tpl";
  r.priority = "best-effort";
  r.pooled = true;
  ASSERT_TRUE(st_->insert(r));
  ASSERT_TRUE(st_->insert(rec("n0-q", "running", 2)));
  auto visible = st_->list(query("running", {}, true));
  ASSERT_TRUE(visible);
  ASSERT_EQ(visible->size(), 1u);
  EXPECT_EQ((*visible)[0].id, "n0-q");
  SandboxQuery all = query("", {}, true);
  all.include_pooled = true;
  EXPECT_EQ(st_->list(all)->size(), 2u);

  auto got = **st_->get("n0-p");
  EXPECT_TRUE(got.pooled);
  EXPECT_EQ(got.template_name, "tpl");
  EXPECT_EQ(got.priority, "best-effort");
  got.pooled = false;
  got.job = "job-1";
  got.step = "3";
  got.labels = {{"user", "u1"}};
  auto v = st_->update_with_labels(got);
  ASSERT_TRUE(v) << v.error().message();
  SandboxQuery by_job;
  by_job.job = "job-1";
  auto mine = st_->list(by_job);
  ASSERT_TRUE(mine);
  ASSERT_EQ(mine->size(), 1u);
  EXPECT_EQ((*mine)[0].labels, (std::map<std::string, std::string>{{"user", "u1"}}));
  EXPECT_EQ((*mine)[0].step, "3");
  EXPECT_TRUE(st_->list(query("", {{"pool", "yes"}}, false))->empty());
  EXPECT_EQ(st_->list(query("", {{"user", "u1"}}, false))->size(), 1u);
  by_job.step = "4";
  EXPECT_TRUE(st_->list(by_job)->empty());
  // A plain update keeps the labels; a stale version is refused by both.
  auto again = (*mine)[0];
  again.labels = {{"ignored", "x"}};
  ASSERT_TRUE(st_->update(again));
  EXPECT_EQ((**st_->get("n0-p")).labels, (std::map<std::string, std::string>{{"user", "u1"}}));
  auto stale = st_->update_with_labels(again);
  ASSERT_FALSE(stale);
  EXPECT_EQ(stale.error().code, Code::kConflict);
}

}  // namespace
}  // namespace tp::control
