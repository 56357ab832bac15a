#include "control/sqlite/doc_store.h"

#include <sqlite3.h>

#include "control/sqlite/schema.h"

namespace tp::control::sqlite {
namespace {

Doc doc_from_row(sqlite3_stmt* s) {
  Doc d;
  d.key = column_text(s, 0);
  d.body = column_text(s, 1);
  d.live = sqlite3_column_int64(s, 2) != 0;
  d.ended_ms = sqlite3_column_int64(s, 3);
  d.version = static_cast<uint64_t>(sqlite3_column_int64(s, 4));
  return d;
}

}  // namespace

Result<std::unique_ptr<SqliteDocStore>> SqliteDocStore::open(const std::string& path,
                                                             const std::string& table) {
  if (table != "templates" && table != "jobs")
    return fail(Code::kInvalidArgument, "no document table '" + table + "'");
  auto db = open_database(path);
  if (!db) return std::unexpected(db.error());
  return std::unique_ptr<SqliteDocStore>(new SqliteDocStore(*db, table));
}

SqliteDocStore::~SqliteDocStore() { sqlite3_close(db_); }

Error SqliteDocStore::version_mismatch(const std::string& key, uint64_t want) {
  Stmt st;
  std::string sql = "SELECT version FROM " + table_ + " WHERE key = ?";
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st.s, nullptr) != SQLITE_OK)
    return db_error(db_, "prepare version");
  sqlite3_bind_text(st.s, 1, key.c_str(), -1, SQLITE_TRANSIENT);
  if (sqlite3_step(st.s) != SQLITE_ROW) return Error{Code::kNotFound, 0, key + " not stored"};
  return Error{Code::kConflict, 0,
               key + " changed (version " + std::to_string(sqlite3_column_int64(st.s, 0)) +
                   ", expected " + std::to_string(want) + ")"};
}

Result<uint64_t> SqliteDocStore::put(const Doc& d) {
  std::lock_guard lk(mu_);
  Stmt st;
  std::string sql =
      d.version == 0
          ? "INSERT INTO " + table_ + " (key, body, live, ended_ms, version) VALUES (?1,?2,?3,?4,1)"
          : "UPDATE " + table_ +
                " SET body=?2, live=?3, ended_ms=?4, version=version+1 WHERE key=?1 AND version=?5";
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st.s, nullptr) != SQLITE_OK)
    return std::unexpected(db_error(db_, "prepare put"));
  sqlite3_bind_text(st.s, 1, d.key.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st.s, 2, d.body.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(st.s, 3, d.live ? 1 : 0);
  sqlite3_bind_int64(st.s, 4, d.ended_ms);
  if (d.version) sqlite3_bind_int64(st.s, 5, static_cast<sqlite3_int64>(d.version));
  int rc = sqlite3_step(st.s);
  if (d.version == 0) {
    if (rc == SQLITE_CONSTRAINT) return fail(Code::kConflict, d.key + " already stored");
    if (rc != SQLITE_DONE) return std::unexpected(db_error(db_, "insert " + d.key));
    return 1;
  }
  if (rc != SQLITE_DONE) return std::unexpected(db_error(db_, "update " + d.key));
  if (sqlite3_changes(db_) == 1) return d.version + 1;
  return std::unexpected(version_mismatch(d.key, d.version));
}

Result<std::optional<Doc>> SqliteDocStore::get(const std::string& key) {
  std::lock_guard lk(mu_);
  Stmt st;
  std::string sql = "SELECT key, body, live, ended_ms, version FROM " + table_ + " WHERE key = ?";
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st.s, nullptr) != SQLITE_OK)
    return std::unexpected(db_error(db_, "prepare get"));
  sqlite3_bind_text(st.s, 1, key.c_str(), -1, SQLITE_TRANSIENT);
  int rc = sqlite3_step(st.s);
  if (rc == SQLITE_DONE) return std::optional<Doc>{};
  if (rc != SQLITE_ROW) return std::unexpected(db_error(db_, "get " + key));
  return std::optional<Doc>{doc_from_row(st.s)};
}

Result<std::vector<Doc>> SqliteDocStore::list(bool live_only) {
  std::lock_guard lk(mu_);
  Stmt st;
  std::string sql = "SELECT key, body, live, ended_ms, version FROM " + table_ +
                    (live_only ? " WHERE live = 1" : "") + " ORDER BY key";
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st.s, nullptr) != SQLITE_OK)
    return std::unexpected(db_error(db_, "prepare list"));
  std::vector<Doc> out;
  int rc;
  while ((rc = sqlite3_step(st.s)) == SQLITE_ROW) out.push_back(doc_from_row(st.s));
  if (rc != SQLITE_DONE) return std::unexpected(db_error(db_, "list " + table_));
  return out;
}

Result<void> SqliteDocStore::remove(const std::string& key, uint64_t version) {
  std::lock_guard lk(mu_);
  Stmt st;
  std::string sql = "DELETE FROM " + table_ + " WHERE key = ?1 AND version = ?2";
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st.s, nullptr) != SQLITE_OK)
    return std::unexpected(db_error(db_, "prepare remove"));
  sqlite3_bind_text(st.s, 1, key.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(st.s, 2, static_cast<sqlite3_int64>(version));
  if (sqlite3_step(st.s) != SQLITE_DONE) return std::unexpected(db_error(db_, "remove " + key));
  if (sqlite3_changes(db_) == 1) return {};
  return std::unexpected(version_mismatch(key, version));
}

Result<int> SqliteDocStore::prune_ended(int64_t before_ms) {
  std::lock_guard lk(mu_);
  Stmt st;
  std::string sql = "DELETE FROM " + table_ + " WHERE live = 0 AND ended_ms < ?";
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st.s, nullptr) != SQLITE_OK)
    return std::unexpected(db_error(db_, "prepare prune"));
  sqlite3_bind_int64(st.s, 1, before_ms);
  if (sqlite3_step(st.s) != SQLITE_DONE) return std::unexpected(db_error(db_, "prune " + table_));
  return sqlite3_changes(db_);
}

}  // namespace tp::control::sqlite
