#include "control/sqlite/schema.h"

#include <sqlite3.h>

#include <boost/json.hpp>

namespace tp::control::sqlite {
namespace {

Result<int> user_version(sqlite3* db) {
  Stmt uv;
  if (sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &uv.s, nullptr) != SQLITE_OK ||
      sqlite3_step(uv.s) != SQLITE_ROW)
    return std::unexpected(db_error(db, "user_version"));
  return sqlite3_column_int(uv.s, 0);
}

Result<bool> has_column(sqlite3* db, const char* table, const std::string& column) {
  Stmt cols;
  std::string sql = std::string("PRAGMA table_info(") + table + ")";
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &cols.s, nullptr) != SQLITE_OK)
    return std::unexpected(db_error(db, "table_info"));
  while (sqlite3_step(cols.s) == SQLITE_ROW) {
    const unsigned char* n = sqlite3_column_text(cols.s, 1);
    if (n && column == reinterpret_cast<const char*>(n)) return true;
  }
  return false;
}

// 0 -> 1. A table made by schema 0 keeps its layout and gains the column.
Result<void> to_v1(sqlite3* db) {
  // WITHOUT ROWID: the rows live in the id's b-tree, so an update rewrites one
  // leaf page.
  TP_TRY(
      exec_sql(db,
               "CREATE TABLE IF NOT EXISTS sandboxes ("
               " id TEXT PRIMARY KEY, state TEXT NOT NULL, tier TEXT, image TEXT, node TEXT,"
               " memory_mb INTEGER, cpus REAL, pids INTEGER, disk_mb INTEGER, ttl_seconds INTEGER,"
               " idle_timeout_seconds INTEGER, labels TEXT, env TEXT, created_at_ms INTEGER,"
               " expires_at_ms INTEGER, ended_at_ms INTEGER, end_reason TEXT,"
               " version INTEGER NOT NULL DEFAULT 1) WITHOUT ROWID"));
  auto has_version = has_column(db, "sandboxes", "version");
  if (!has_version) return std::unexpected(has_version.error());
  if (!*has_version)
    TP_TRY(exec_sql(db, "ALTER TABLE sandboxes ADD COLUMN version INTEGER NOT NULL DEFAULT 1"));
  TP_TRY(exec_sql(db,
                  "CREATE TABLE IF NOT EXISTS sandbox_labels ("
                  " sandbox_id TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,"
                  " PRIMARY KEY (sandbox_id, key)) WITHOUT ROWID"));
  TP_TRY(
      exec_sql(db, "CREATE INDEX IF NOT EXISTS sandbox_labels_kv ON sandbox_labels (key, value)"));
  TP_TRY(exec_sql(db, "CREATE INDEX IF NOT EXISTS sandboxes_state ON sandboxes (state)"));
  TP_TRY(exec_sql(db, "CREATE INDEX IF NOT EXISTS sandboxes_ended ON sandboxes (ended_at_ms)"));
  // Labels of schema-0 rows, from their JSON column.
  TP_TRY(exec_sql(
      db,
      "INSERT OR IGNORE INTO sandbox_labels (sandbox_id, key, value)"
      " SELECT s.id, j.key, j.value FROM sandboxes s, json_each(s.labels) j"
      " WHERE json_valid(s.labels) AND json_type(s.labels) = 'object' AND j.type = 'text'"));
  return {};
}

// 1 -> 2. Rows of older daemons get no layers: adoption then resolves their
// image by name, as those daemons did.
Result<void> to_v2(sqlite3* db) {
  auto has_layers = has_column(db, "sandboxes", "layers");
  if (!has_layers) return std::unexpected(has_layers.error());
  if (!*has_layers)
    TP_TRY(exec_sql(db, "ALTER TABLE sandboxes ADD COLUMN layers TEXT NOT NULL DEFAULT '[]'"));
  // parts, env and cmd are JSON arrays/objects read back whole; image_parts
  // indexes the parts for "who is made of this" queries (removal, gc).
  TP_TRY(exec_sql(db,
                  "CREATE TABLE IF NOT EXISTS images ("
                  " name TEXT NOT NULL, version TEXT NOT NULL, parts TEXT NOT NULL,"
                  " env TEXT NOT NULL, workdir TEXT NOT NULL, user TEXT NOT NULL,"
                  " cmd TEXT NOT NULL, source TEXT NOT NULL, created_ms INTEGER NOT NULL,"
                  " row_version INTEGER NOT NULL, PRIMARY KEY (name, version)) WITHOUT ROWID"));
  TP_TRY(exec_sql(db, "CREATE INDEX IF NOT EXISTS images_created ON images (name, created_ms)"));
  TP_TRY(exec_sql(db,
                  "CREATE TABLE IF NOT EXISTS image_parts ("
                  " name TEXT NOT NULL, version TEXT NOT NULL, pos INTEGER NOT NULL,"
                  " part TEXT NOT NULL, PRIMARY KEY (name, version, pos)) WITHOUT ROWID"));
  TP_TRY(exec_sql(db, "CREATE INDEX IF NOT EXISTS image_parts_part ON image_parts (part)"));
  return {};
}

// 2 -> 3. Rows from before it hold no uid range of their own (0): their
// sandboxes run in the shared range of the daemon that made them.
Result<void> to_v3(sqlite3* db) {
  auto has_uid_base = has_column(db, "sandboxes", "uid_base");
  if (!has_uid_base) return std::unexpected(has_uid_base.error());
  if (!*has_uid_base)
    TP_TRY(exec_sql(db, "ALTER TABLE sandboxes ADD COLUMN uid_base INTEGER NOT NULL DEFAULT 0"));
  return {};
}

// 3 -> 4. Rows from before belong to no job or template, and ran at normal priority.
Result<void> to_v4(sqlite3* db) {
  static const std::pair<const char*, const char*> kColumns[] = {
      {"job", "TEXT NOT NULL DEFAULT ''"},      {"step", "TEXT NOT NULL DEFAULT ''"},
      {"template", "TEXT NOT NULL DEFAULT ''"}, {"priority", "TEXT NOT NULL DEFAULT 'normal'"},
      {"pooled", "INTEGER NOT NULL DEFAULT 0"},
  };
  for (const auto& [col, decl] : kColumns) {
    auto has = has_column(db, "sandboxes", col);
    if (!has) return std::unexpected(has.error());
    if (!*has)
      TP_TRY(exec_sql(
          db, (std::string("ALTER TABLE sandboxes ADD COLUMN ") + col + " " + decl).c_str()));
  }
  TP_TRY(exec_sql(db, "CREATE INDEX IF NOT EXISTS sandboxes_job ON sandboxes (job, step)"));
  for (const char* t : {"templates", "jobs"}) {
    TP_TRY(exec_sql(db, (std::string("CREATE TABLE IF NOT EXISTS ") + t +
                         " (key TEXT PRIMARY KEY, body TEXT NOT NULL, live INTEGER NOT NULL,"
                         " ended_ms INTEGER NOT NULL, version INTEGER NOT NULL) WITHOUT ROWID")
                            .c_str()));
    TP_TRY(exec_sql(
        db, (std::string("CREATE INDEX IF NOT EXISTS ") + t + "_live ON " + t + " (live, ended_ms)")
                .c_str()));
  }
  return {};
}

Result<void> migrate(sqlite3* db) {
  auto v = user_version(db);
  if (!v) return std::unexpected(v.error());
  if (*v == kSchemaVersion) return {};
  TP_TRY(exec_sql(db, "BEGIN IMMEDIATE"));
  auto body = [&]() -> Result<void> {
    // Read again under the write lock: another connection may have migrated meanwhile.
    auto cur = user_version(db);
    if (!cur) return std::unexpected(cur.error());
    if (*cur > kSchemaVersion)
      return fail(Code::kInternal, "state.db has schema " + std::to_string(*cur) +
                                       ", newer than this daemon's " +
                                       std::to_string(kSchemaVersion));
    // Every step checks what it adds (IF NOT EXISTS, has_column), so all of them
    // run: a file whose number meant another set of columns (a development build's)
    // still ends up with every table and column.
    TP_TRY(to_v1(db));
    TP_TRY(to_v2(db));
    TP_TRY(to_v3(db));
    TP_TRY(to_v4(db));
    return exec_sql(db, ("PRAGMA user_version = " + std::to_string(kSchemaVersion)).c_str());
  };
  if (auto r = body(); !r) {
    (void)exec_sql(db, "ROLLBACK");
    return r;
  }
  return exec_sql(db, "COMMIT");
}

}  // namespace

Error db_error(sqlite3* db, const std::string& what) {
  return Error{Code::kInternal, 0, "sqlite " + what + ": " + sqlite3_errmsg(db)};
}

std::string column_text(sqlite3_stmt* s, int i) {
  const unsigned char* t = sqlite3_column_text(s, i);
  return t ? std::string(reinterpret_cast<const char*>(t)) : std::string();
}

Result<void> exec_sql(sqlite3* db, const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "?";
    sqlite3_free(err);
    return fail(Code::kInternal, std::string("sqlite exec(") + sql + "): " + msg);
  }
  return {};
}

Result<sqlite3*> open_database(const std::string& path) {
  sqlite3* db = nullptr;
  int rc =
      sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return fail(Code::kInternal, "sqlite open(" + path + "): " + msg);
  }
  auto setup = [&]() -> Result<void> {
    // Two stores (two connections) write this file: wait for the other's lock.
    sqlite3_busy_timeout(db, 5000);
    TP_TRY(exec_sql(db, "PRAGMA journal_mode=WAL"));
    // NORMAL in WAL mode survives a daemon crash (what restart recovery needs);
    // a power loss may lose the last records, but it also ends every sandbox.
    TP_TRY(exec_sql(db, "PRAGMA synchronous=NORMAL"));
    return migrate(db);
  };
  if (auto r = setup(); !r) {
    sqlite3_close(db);
    return std::unexpected(r.error());
  }
  return db;
}

Stmt::~Stmt() { sqlite3_finalize(s); }

StmtCache::~StmtCache() {
  for (auto& [sql, s] : stmts_) sqlite3_finalize(s);
}

StmtCache::Use::~Use() {
  if (!s_) return;
  if (owned_) {
    sqlite3_finalize(s_);
    return;
  }
  sqlite3_reset(s_);
  sqlite3_clear_bindings(s_);
}

Result<StmtCache::Use> StmtCache::prepare(std::string_view sql) {
  if (auto it = stmts_.find(sql); it != stmts_.end()) return Use(it->second, false);
  sqlite3_stmt* s = nullptr;
  if (sqlite3_prepare_v2(db_, sql.data(), static_cast<int>(sql.size()), &s, nullptr) != SQLITE_OK) {
    sqlite3_finalize(s);
    return std::unexpected(db_error(db_, "prepare " + std::string(sql)));
  }
  if (stmts_.size() >= kMax) return Use(s, true);
  stmts_.emplace(std::string(sql), s);
  return Use(s, false);
}

Result<void> StmtCache::exec(std::string_view sql) {
  auto st = prepare(sql);
  if (!st) return std::unexpected(st.error());
  if (int rc = sqlite3_step(st->get()); rc != SQLITE_DONE && rc != SQLITE_ROW)
    return std::unexpected(db_error(db_, std::string(sql)));
  return {};
}

std::string list_to_json(const std::vector<std::string>& l) {
  boost::json::array a;
  for (const auto& x : l) a.emplace_back(x);
  return boost::json::serialize(a);
}

std::string map_to_json(const std::map<std::string, std::string>& m) {
  boost::json::object o;
  for (const auto& [k, v] : m) o[k] = v;
  return boost::json::serialize(o);
}

std::vector<std::string> list_from_json(const unsigned char* text) {
  std::vector<std::string> l;
  if (!text) return l;
  boost::system::error_code ec;
  boost::json::value v = boost::json::parse(reinterpret_cast<const char*>(text), ec);
  if (ec || !v.is_array()) return l;
  for (const auto& x : v.as_array())
    if (x.is_string()) l.emplace_back(x.as_string());
  return l;
}

std::map<std::string, std::string> map_from_json(const unsigned char* text) {
  std::map<std::string, std::string> m;
  if (!text) return m;
  boost::system::error_code ec;
  boost::json::value v = boost::json::parse(reinterpret_cast<const char*>(text), ec);
  if (ec || !v.is_object()) return m;
  for (const auto& [k, val] : v.as_object())
    if (val.is_string()) m[std::string(k)] = std::string(val.as_string());
  return m;
}

}  // namespace tp::control::sqlite
