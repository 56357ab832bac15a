// The ImageRecordStore contract, run against every implementation (SQLite in
// a temp dir, the in-memory one), plus the SQLite store's own promises
// (survives reopen, shares state.db with the sandbox records, migrates a
// schema-1 database, refuses a newer one).
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <memory>

#include "control/memory_image_store.h"
#include "control/sqlite/image_record_store.h"
#include "control/sqlite/sandbox_store.h"
#include "control/sqlite/schema.h"

namespace tp::control {
namespace {

struct ImageStoreMaker {
  std::string name;
  std::function<std::unique_ptr<ImageRecordStore>(const std::string& dir)> make;
};

std::ostream& operator<<(std::ostream& os, const ImageStoreMaker& m) { return os << m.name; }

ImageRecord rec(const std::string& name, const std::string& version, int64_t created,
                std::vector<std::string> parts) {
  ImageRecord r;
  r.name = name;
  r.version = version;
  r.created_ms = created;
  r.parts = std::move(parts);
  return r;
}

const std::string kA = "sha256:" + std::string(64, 'a');
const std::string kB = "sha256:" + std::string(64, 'b');

class ImageRecordStoreContract : public ::testing::TestWithParam<ImageStoreMaker> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tp-imgrec-XXXXXX";
    dir_ = mkdtemp(tmpl);
    st_ = GetParam().make(dir_);
    ASSERT_TRUE(st_);
  }
  void TearDown() override {
    st_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::vector<std::string> refs(const ImageQuery& q) {
    std::vector<std::string> out;
    auto l = st_->list(q);
    EXPECT_TRUE(l) << l.error().message();
    if (l)
      for (const auto& r : *l) out.push_back(r.name + ":" + r.version);
    return out;
  }
  std::string dir_;
  std::unique_ptr<ImageRecordStore> st_;
};

TEST_P(ImageRecordStoreContract, PutThenGetKeepsEveryField) {
  auto r = rec("py", "3.11", 7, {kA, "image:base:1"});
  r.defaults.env = {{"PATH", "/bin"}, {"A", "b=c"}};
  r.defaults.workdir = "/w";
  r.defaults.user = "1000:1000";
  r.defaults.cmd = {"python3", "-c", "print(1)"};
  r.source = "docker-archive";
  r.row_version = 0;
  auto v = st_->put(r);
  ASSERT_TRUE(v) << v.error().message();
  EXPECT_EQ(*v, 1u);
  auto got = st_->get("py", "3.11");
  ASSERT_TRUE(got && *got);
  EXPECT_EQ((*got)->parts, r.parts) << "order kept: top first";
  EXPECT_EQ((*got)->defaults.env, r.defaults.env);
  EXPECT_EQ((*got)->defaults.workdir, "/w");
  EXPECT_EQ((*got)->defaults.user, "1000:1000");
  EXPECT_EQ((*got)->defaults.cmd, r.defaults.cmd);
  EXPECT_EQ((*got)->source, "docker-archive");
  EXPECT_EQ((*got)->created_ms, 7);
  EXPECT_EQ((*got)->row_version, 1u);
  auto none = st_->get("py", "3.12");
  ASSERT_TRUE(none);
  EXPECT_FALSE(*none);
}

TEST_P(ImageRecordStoreContract, PuttingAnExistingRefWithoutItsVersionConflicts) {
  ASSERT_TRUE(st_->put(rec("app", "1", 1, {kA})));
  auto again = st_->put(rec("app", "1", 2, {kB}));
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code, Code::kConflict);
  EXPECT_NE(again.error().message().find("app:1"), std::string::npos);
  EXPECT_EQ((*st_->get("app", "1"))->parts, std::vector<std::string>{kA});
  EXPECT_EQ(refs({.name = "", .part = kB}), std::vector<std::string>{}) << "parts unchanged too";
}

TEST_P(ImageRecordStoreContract, ReplaceIsACompareAndSetOnTheRowVersion) {
  ASSERT_TRUE(st_->put(rec("app", "1", 1, {kA})));
  auto r = **st_->get("app", "1");
  r.parts = {kB};
  auto v2 = st_->put(r);
  ASSERT_TRUE(v2) << v2.error().message();
  EXPECT_EQ(*v2, 2u);
  // A writer holding the old row version loses.
  r.parts = {kA, kB};
  auto stale = st_->put(r);  // r.row_version is still 1
  ASSERT_FALSE(stale);
  EXPECT_EQ(stale.error().code, Code::kConflict);
  auto got = **st_->get("app", "1");
  EXPECT_EQ(got.parts, std::vector<std::string>{kB});
  EXPECT_EQ(got.row_version, 2u);
  EXPECT_EQ(refs({.name = "", .part = kA}), std::vector<std::string>{});
  EXPECT_EQ(refs({.name = "", .part = kB}), std::vector<std::string>{"app:1"});
  // A replace of a ref that is not stored is not an insert.
  auto ghost = rec("ghost", "1", 1, {kA});
  ghost.row_version = 3;
  auto g = st_->put(ghost);
  ASSERT_FALSE(g);
  EXPECT_EQ(g.error().code, Code::kNotFound);
  EXPECT_FALSE(*st_->get("ghost", "1"));
}

TEST_P(ImageRecordStoreContract, LatestIsTheNewestThenTheGreatestVersion) {
  EXPECT_FALSE(*st_->latest("app"));
  ASSERT_TRUE(st_->put(rec("app", "2", 10, {kA})));
  ASSERT_TRUE(st_->put(rec("app", "10", 5, {kA})));
  ASSERT_TRUE(st_->put(rec("other", "9", 99, {kA})));
  EXPECT_EQ((*st_->latest("app"))->version, "2");
  ASSERT_TRUE(st_->put(rec("app", "3", 10, {kA})));  // same time: "3" > "2"
  EXPECT_EQ((*st_->latest("app"))->version, "3");
}

TEST_P(ImageRecordStoreContract, ListFiltersByNameAndPartInRefOrder) {
  ASSERT_TRUE(st_->put(rec("b", "1", 1, {kA})));
  ASSERT_TRUE(st_->put(rec("a", "2", 2, {kB, "image:b:1"})));
  ASSERT_TRUE(st_->put(rec("a", "1", 3, {kA, kB})));
  using V = std::vector<std::string>;
  EXPECT_EQ(refs({}), (V{"a:1", "a:2", "b:1"}));
  EXPECT_EQ(refs({.name = "a", .part = ""}), (V{"a:1", "a:2"}));
  EXPECT_EQ(refs({.name = "", .part = kA}), (V{"a:1", "b:1"}));
  EXPECT_EQ(refs({.name = "a", .part = kA}), (V{"a:1"}));
  EXPECT_EQ(refs({.name = "", .part = "image:b:1"}), (V{"a:2"}));
  EXPECT_EQ(refs({.name = "", .part = "image:b"}), (V{})) << "parts match exactly";
  EXPECT_EQ(refs({.name = "zz", .part = ""}), (V{}));
}

TEST_P(ImageRecordStoreContract, RemoveIsACompareAndSetAndTakesItsParts) {
  ASSERT_TRUE(st_->put(rec("a", "1", 1, {kA})));
  ASSERT_TRUE(st_->put(rec("b", "1", 1, {kA, kB})));
  auto stale = st_->remove("a", "1", 2);
  ASSERT_FALSE(stale);
  EXPECT_EQ(stale.error().code, Code::kConflict);
  ASSERT_TRUE(st_->remove("a", "1", 1));
  EXPECT_FALSE(*st_->get("a", "1"));
  EXPECT_EQ(st_->remove("a", "1", 1).error().code, Code::kNotFound);
  auto counts = st_->part_counts();
  ASSERT_TRUE(counts);
  EXPECT_EQ(*counts, (std::map<std::string, uint32_t>{{kA, 1}, {kB, 1}}));
  // A new record under the removed ref starts at row version 1.
  auto v = st_->put(rec("a", "1", 2, {kB}));
  ASSERT_TRUE(v);
  EXPECT_EQ(*v, 1u);
}

TEST_P(ImageRecordStoreContract, PartCountsCountRecordsNotMentions) {
  ASSERT_TRUE(st_->put(rec("a", "1", 1, {kA, kA})));
  ASSERT_TRUE(st_->put(rec("a", "2", 1, {kA, "image:a:1"})));
  auto counts = st_->part_counts();
  ASSERT_TRUE(counts);
  EXPECT_EQ(*counts, (std::map<std::string, uint32_t>{{kA, 2}, {"image:a:1", 1}}));
}

INSTANTIATE_TEST_SUITE_P(
    Stores, ImageRecordStoreContract,
    ::testing::Values(
        ImageStoreMaker{"sqlite",
                        [](const std::string& dir) -> std::unique_ptr<ImageRecordStore> {
                          auto s = sqlite::SqliteImageRecordStore::open(dir + "/state.db");
                          if (!s) return nullptr;
                          return std::unique_ptr<ImageRecordStore>(std::move(*s));
                        }},
        ImageStoreMaker{"memory",
                        [](const std::string&) -> std::unique_ptr<ImageRecordStore> {
                          return std::make_unique<MemoryImageRecordStore>();
                        }}),
    [](const auto& info) { return info.param.name; });

class SqliteImageRecordsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tp-imgrec-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  int user_version() {
    sqlite3* db = nullptr;
    EXPECT_EQ(sqlite3_open((dir_ + "/state.db").c_str(), &db), SQLITE_OK);
    sqlite3_stmt* s = nullptr;
    sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &s, nullptr);
    int v = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int(s, 0) : -1;
    sqlite3_finalize(s);
    sqlite3_close(db);
    return v;
  }
  std::string dir_;
};

TEST_F(SqliteImageRecordsTest, RecordsSurviveReopenNextToTheSandboxRecords) {
  const std::string path = dir_ + "/state.db";
  {
    auto sandboxes = sqlite::SqliteSandboxStore::open(path);
    ASSERT_TRUE(sandboxes) << sandboxes.error().message();
    auto images = sqlite::SqliteImageRecordStore::open(path);  // a second connection
    ASSERT_TRUE(images) << images.error().message();
    SandboxRecord s;
    s.id = "n0-a";
    s.state = "running";
    s.image = "app:1";
    s.layers = {kA};
    ASSERT_TRUE((*sandboxes)->insert(s));
    ASSERT_TRUE((*images)->put(rec("app", "1", 1, {kA})));
  }
  EXPECT_EQ(user_version(), sqlite::kSchemaVersion);
  auto images = sqlite::SqliteImageRecordStore::open(path);
  ASSERT_TRUE(images);
  auto got = (*images)->get("app", "1");
  ASSERT_TRUE(got && *got);
  EXPECT_EQ((*got)->parts, std::vector<std::string>{kA});
  auto sandboxes = sqlite::SqliteSandboxStore::open(path);
  ASSERT_TRUE(sandboxes);
  EXPECT_EQ((**(*sandboxes)->get("n0-a")).layers, std::vector<std::string>{kA});
}

TEST_F(SqliteImageRecordsTest, MigratesASchemaOneDatabase) {
  // state.db as the daemon before image records wrote it.
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir_ + "/state.db").c_str(), &db), SQLITE_OK);
    const char* sql =
        "CREATE TABLE sandboxes ("
        " id TEXT PRIMARY KEY, state TEXT NOT NULL, tier TEXT, image TEXT, node TEXT,"
        " memory_mb INTEGER, cpus REAL, pids INTEGER, disk_mb INTEGER, ttl_seconds INTEGER,"
        " idle_timeout_seconds INTEGER, labels TEXT, env TEXT, created_at_ms INTEGER,"
        " expires_at_ms INTEGER, ended_at_ms INTEGER, end_reason TEXT,"
        " version INTEGER NOT NULL DEFAULT 1) WITHOUT ROWID;"
        "CREATE TABLE sandbox_labels (sandbox_id TEXT NOT NULL, key TEXT NOT NULL,"
        " value TEXT NOT NULL, PRIMARY KEY (sandbox_id, key)) WITHOUT ROWID;"
        "INSERT INTO sandboxes VALUES ('n0-old','running','container','bb:1','n0',512,1.0,512,"
        " 1024,600,0,'{}','{}',7,607,0,'',3);"
        "PRAGMA user_version = 1;";
    ASSERT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  }
  for (int round = 0; round < 2; ++round) {  // the second open finds the current schema
    auto images = sqlite::SqliteImageRecordStore::open(dir_ + "/state.db");
    ASSERT_TRUE(images) << images.error().message();
    EXPECT_EQ(user_version(), sqlite::kSchemaVersion);
    auto sandboxes = sqlite::SqliteSandboxStore::open(dir_ + "/state.db");
    ASSERT_TRUE(sandboxes) << sandboxes.error().message();
    auto old = (*sandboxes)->get("n0-old");
    ASSERT_TRUE(old && *old);
    EXPECT_EQ((*old)->image, "bb:1");
    EXPECT_EQ((*old)->version, round == 0 ? 3u : 4u);
    if (round == 0) {
      EXPECT_TRUE((*old)->layers.empty()) << "resolved by reference on adoption";
      auto r = **old;
      r.layers = {kB};
      ASSERT_TRUE((*sandboxes)->update(r));
      ASSERT_TRUE((*images)->put(rec("bb", "1", 1, {kB})));
    } else {
      EXPECT_EQ((*old)->layers, std::vector<std::string>{kB});
      EXPECT_TRUE(*(*images)->get("bb", "1"));
    }
  }
}

TEST_F(SqliteImageRecordsTest, ANewerSchemaIsRefused) {
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir_ + "/state.db").c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version = 99", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  }
  auto images = sqlite::SqliteImageRecordStore::open(dir_ + "/state.db");
  ASSERT_FALSE(images);
  EXPECT_NE(images.error().message().find("newer"), std::string::npos);
  EXPECT_FALSE(sqlite::SqliteSandboxStore::open(dir_ + "/state.db"));
  EXPECT_EQ(user_version(), 99);
}

}  // namespace
}  // namespace tp::control
