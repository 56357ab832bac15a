#include "control/sqlite/sandbox_store.h"

#include <sqlite3.h>

#include <boost/json.hpp>

namespace tp::control::sqlite {
namespace json = boost::json;
namespace {

std::string map_to_json(const std::map<std::string, std::string>& m) {
  json::object o;
  for (const auto& [k, v] : m) o[k] = v;
  return json::serialize(o);
}

std::map<std::string, std::string> map_from_json(const char* text) {
  std::map<std::string, std::string> m;
  if (!text) return m;
  boost::system::error_code ec;
  json::value v = json::parse(text, ec);
  if (ec || !v.is_object()) return m;
  for (const auto& [k, val] : v.as_object())
    if (val.is_string()) m[std::string(k)] = std::string(val.as_string());
  return m;
}

Error db_error(sqlite3* db, const std::string& what) {
  return Error{Code::kInternal, 0, "sqlite " + what + ": " + sqlite3_errmsg(db)};
}

// Owns a prepared statement.
struct Stmt {
  sqlite3_stmt* s = nullptr;
  ~Stmt() { sqlite3_finalize(s); }
};

// Leaves a cached statement ready for its next use, whatever happens.
struct Reset {
  sqlite3_stmt* s;
  ~Reset() {
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
  }
};

SandboxRecord row_to_record(sqlite3_stmt* s) {
  auto text = [&](int i) {
    const unsigned char* t = sqlite3_column_text(s, i);
    return t ? std::string(reinterpret_cast<const char*>(t)) : std::string();
  };
  SandboxRecord r;
  r.id = text(0);
  r.state = text(1);
  r.tier = text(2);
  r.image = text(3);
  r.node = text(4);
  r.memory_mb = sqlite3_column_int64(s, 5);
  r.cpus = sqlite3_column_double(s, 6);
  r.pids = sqlite3_column_int64(s, 7);
  r.disk_mb = sqlite3_column_int64(s, 8);
  r.ttl_seconds = sqlite3_column_int64(s, 9);
  r.idle_timeout_seconds = sqlite3_column_int64(s, 10);
  r.labels = map_from_json(reinterpret_cast<const char*>(sqlite3_column_text(s, 11)));
  r.env = map_from_json(reinterpret_cast<const char*>(sqlite3_column_text(s, 12)));
  r.created_at_ms = sqlite3_column_int64(s, 13);
  r.expires_at_ms = sqlite3_column_int64(s, 14);
  r.ended_at_ms = sqlite3_column_int64(s, 15);
  r.end_reason = text(16);
  r.version = sqlite3_column_int64(s, 17);
  r.uid_base = static_cast<uint32_t>(sqlite3_column_int64(s, 18));
  return r;
}

constexpr const char* kColumns =
    "id, state, tier, image, node, memory_mb, cpus, pids, disk_mb, ttl_seconds, "
    "idle_timeout_seconds, labels, env, created_at_ms, expires_at_ms, ended_at_ms, end_reason, "
    "version, uid_base";

// Binds the 17 record columns before version at 1..17 and uid_base at 19.
void bind_record(sqlite3_stmt* s, const SandboxRecord& r, const std::string& labels,
                 const std::string& env) {
  sqlite3_bind_text(s, 1, r.id.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(s, 2, r.state.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(s, 3, r.tier.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(s, 4, r.image.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(s, 5, r.node.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(s, 6, static_cast<sqlite3_int64>(r.memory_mb));
  sqlite3_bind_double(s, 7, r.cpus);
  sqlite3_bind_int64(s, 8, static_cast<sqlite3_int64>(r.pids));
  sqlite3_bind_int64(s, 9, static_cast<sqlite3_int64>(r.disk_mb));
  sqlite3_bind_int64(s, 10, static_cast<sqlite3_int64>(r.ttl_seconds));
  sqlite3_bind_int64(s, 11, static_cast<sqlite3_int64>(r.idle_timeout_seconds));
  sqlite3_bind_text(s, 12, labels.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(s, 13, env.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(s, 14, r.created_at_ms);
  sqlite3_bind_int64(s, 15, r.expires_at_ms);
  sqlite3_bind_int64(s, 16, r.ended_at_ms);
  sqlite3_bind_text(s, 17, r.end_reason.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(s, 19, r.uid_base);
}

}  // namespace

Result<std::unique_ptr<SqliteSandboxStore>> SqliteSandboxStore::open(const std::string& path) {
  sqlite3* db = nullptr;
  int rc =
      sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return fail(Code::kInternal, "sqlite open(" + path + "): " + msg);
  }
  std::unique_ptr<SqliteSandboxStore> st(new SqliteSandboxStore(db));
  sqlite3_busy_timeout(db, 5000);
  TP_TRY(st->exec_sql("PRAGMA journal_mode=WAL"));
  // NORMAL in WAL mode survives a daemon crash (what restart recovery needs);
  // a power loss may lose the last records, but it also ends every sandbox.
  TP_TRY(st->exec_sql("PRAGMA synchronous=NORMAL"));
  TP_TRY(st->migrate());
  return st;
}

Result<void> SqliteSandboxStore::migrate() {
  Stmt uv;
  if (sqlite3_prepare_v2(db_, "PRAGMA user_version", -1, &uv.s, nullptr) != SQLITE_OK ||
      sqlite3_step(uv.s) != SQLITE_ROW)
    return std::unexpected(db_error(db_, "user_version"));
  int version = sqlite3_column_int(uv.s, 0);
  if (version == kSchemaVersion) return {};
  if (version > kSchemaVersion)
    return fail(Code::kInternal, "state.db has schema " + std::to_string(version) +
                                     ", newer than this daemon's " +
                                     std::to_string(kSchemaVersion));
  TP_TRY(exec_sql("BEGIN IMMEDIATE"));
  auto body = [&]() -> Result<void> {
    // WITHOUT ROWID: the rows live in the id's b-tree, so an update rewrites one
    // leaf page. A table made by schema 0 keeps its layout and gains the column.
    TP_TRY(exec_sql(
        "CREATE TABLE IF NOT EXISTS sandboxes ("
        " id TEXT PRIMARY KEY, state TEXT NOT NULL, tier TEXT, image TEXT, node TEXT,"
        " memory_mb INTEGER, cpus REAL, pids INTEGER, disk_mb INTEGER, ttl_seconds INTEGER,"
        " idle_timeout_seconds INTEGER, labels TEXT, env TEXT, created_at_ms INTEGER,"
        " expires_at_ms INTEGER, ended_at_ms INTEGER, end_reason TEXT,"
        " version INTEGER NOT NULL DEFAULT 1, uid_base INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID"));
    bool has_version = false, has_uid_base = false;
    {
      Stmt cols;
      if (sqlite3_prepare_v2(db_, "PRAGMA table_info(sandboxes)", -1, &cols.s, nullptr) !=
          SQLITE_OK)
        return std::unexpected(db_error(db_, "table_info"));
      while (sqlite3_step(cols.s) == SQLITE_ROW) {
        const unsigned char* n = sqlite3_column_text(cols.s, 1);
        std::string name = n ? reinterpret_cast<const char*>(n) : "";
        has_version = has_version || name == "version";
        has_uid_base = has_uid_base || name == "uid_base";
      }
    }
    if (!has_version)
      TP_TRY(exec_sql("ALTER TABLE sandboxes ADD COLUMN version INTEGER NOT NULL DEFAULT 1"));
    // Schema 2. Rows from before it hold no range of their own (0): their
    // sandboxes run in the shared range of the daemon that made them.
    if (!has_uid_base)
      TP_TRY(exec_sql("ALTER TABLE sandboxes ADD COLUMN uid_base INTEGER NOT NULL DEFAULT 0"));
    TP_TRY(
        exec_sql("CREATE TABLE IF NOT EXISTS sandbox_labels ("
                 " sandbox_id TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,"
                 " PRIMARY KEY (sandbox_id, key)) WITHOUT ROWID"));
    TP_TRY(exec_sql("CREATE INDEX IF NOT EXISTS sandbox_labels_kv ON sandbox_labels (key, value)"));
    TP_TRY(exec_sql("CREATE INDEX IF NOT EXISTS sandboxes_state ON sandboxes (state)"));
    TP_TRY(exec_sql("CREATE INDEX IF NOT EXISTS sandboxes_ended ON sandboxes (ended_at_ms)"));
    // Labels of schema-0 rows, from their JSON column.
    TP_TRY(exec_sql(
        "INSERT OR IGNORE INTO sandbox_labels (sandbox_id, key, value)"
        " SELECT s.id, j.key, j.value FROM sandboxes s, json_each(s.labels) j"
        " WHERE json_valid(s.labels) AND json_type(s.labels) = 'object' AND j.type = 'text'"));
    TP_TRY(exec_sql("PRAGMA user_version = 2"));
    return {};
  };
  if (auto r = body(); !r) {
    (void)exec_sql("ROLLBACK");
    return r;
  }
  return exec_sql("COMMIT");
}

SqliteSandboxStore::~SqliteSandboxStore() {
  sqlite3_finalize(insert_stmt_);
  sqlite3_finalize(label_stmt_);
  sqlite3_finalize(update_stmt_);
  sqlite3_close(db_);
}

Result<void> SqliteSandboxStore::exec_sql(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "?";
    sqlite3_free(err);
    return fail(Code::kInternal, std::string("sqlite exec(") + sql + "): " + msg);
  }
  return {};
}

Result<sqlite3_stmt*> SqliteSandboxStore::prepared(sqlite3_stmt** slot, const char* sql) {
  if (!*slot && sqlite3_prepare_v2(db_, sql, -1, slot, nullptr) != SQLITE_OK)
    return std::unexpected(db_error(db_, std::string("prepare ") + sql));
  return *slot;
}

Result<uint64_t> SqliteSandboxStore::insert(const SandboxRecord& r) {
  std::lock_guard lk(mu_);
  static const std::string kInsert =
      std::string("INSERT INTO sandboxes (") + kColumns +
      ") VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,1,?19)";
  auto ins = prepared(&insert_stmt_, kInsert.c_str());
  if (!ins) return std::unexpected(ins.error());
  auto lab =
      prepared(&label_stmt_, "INSERT INTO sandbox_labels (sandbox_id, key, value) VALUES (?,?,?)");
  if (!lab) return std::unexpected(lab.error());
  TP_TRY(exec_sql("BEGIN IMMEDIATE"));
  auto body = [&]() -> Result<void> {
    {
      Reset reset{*ins};
      bind_record(*ins, r, map_to_json(r.labels), map_to_json(r.env));
      int rc = sqlite3_step(*ins);
      if (rc == SQLITE_CONSTRAINT)
        return fail(Code::kConflict, "sandbox " + r.id + " already stored");
      if (rc != SQLITE_DONE) return std::unexpected(db_error(db_, "insert " + r.id));
    }
    for (const auto& [k, v] : r.labels) {
      Reset reset{*lab};
      sqlite3_bind_text(*lab, 1, r.id.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_text(*lab, 2, k.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_text(*lab, 3, v.c_str(), -1, SQLITE_TRANSIENT);
      if (sqlite3_step(*lab) != SQLITE_DONE)
        return std::unexpected(db_error(db_, "insert labels " + r.id));
    }
    return {};
  };
  if (auto b = body(); !b) {
    (void)exec_sql("ROLLBACK");
    return std::unexpected(b.error());
  }
  TP_TRY(exec_sql("COMMIT"));
  return 1;
}

Result<uint64_t> SqliteSandboxStore::update(const SandboxRecord& r) {
  std::lock_guard lk(mu_);
  // Labels are fixed at insert: not rewritten here.
  auto up = prepared(
      &update_stmt_,
      "UPDATE sandboxes SET state=?2, tier=?3, image=?4, node=?5, memory_mb=?6, cpus=?7,"
      " pids=?8, disk_mb=?9, ttl_seconds=?10, idle_timeout_seconds=?11, env=?13,"
      " created_at_ms=?14, expires_at_ms=?15, ended_at_ms=?16, end_reason=?17, uid_base=?19,"
      " version=version+1 WHERE id=?1 AND version=?18");
  if (!up) return std::unexpected(up.error());
  {
    Reset reset{*up};
    bind_record(*up, r, "", map_to_json(r.env));
    sqlite3_bind_int64(*up, 18, static_cast<sqlite3_int64>(r.version));
    if (sqlite3_step(*up) != SQLITE_DONE) return std::unexpected(db_error(db_, "update " + r.id));
  }
  if (sqlite3_changes(db_) == 1) return r.version + 1;
  Stmt st;
  if (sqlite3_prepare_v2(db_, "SELECT version FROM sandboxes WHERE id = ?", -1, &st.s, nullptr) !=
      SQLITE_OK)
    return std::unexpected(db_error(db_, "prepare version"));
  sqlite3_bind_text(st.s, 1, r.id.c_str(), -1, SQLITE_TRANSIENT);
  if (sqlite3_step(st.s) != SQLITE_ROW)
    return fail(Code::kNotFound, "sandbox " + r.id + " not stored");
  return fail(Code::kConflict, "sandbox " + r.id + " changed (version " +
                                   std::to_string(sqlite3_column_int64(st.s, 0)) + ", expected " +
                                   std::to_string(r.version) + ")");
}

Result<std::optional<SandboxRecord>> SqliteSandboxStore::get(const std::string& id) {
  std::lock_guard lk(mu_);
  Stmt st;
  std::string sql = std::string("SELECT ") + kColumns + " FROM sandboxes WHERE id = ?";
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st.s, nullptr) != SQLITE_OK)
    return std::unexpected(db_error(db_, "prepare get"));
  sqlite3_bind_text(st.s, 1, id.c_str(), -1, SQLITE_TRANSIENT);
  int rc = sqlite3_step(st.s);
  if (rc == SQLITE_DONE) return std::optional<SandboxRecord>{};
  if (rc != SQLITE_ROW) return std::unexpected(db_error(db_, "get " + id));
  return std::optional<SandboxRecord>{row_to_record(st.s)};
}

Result<std::vector<SandboxRecord>> SqliteSandboxStore::list(const SandboxQuery& q) {
  std::lock_guard lk(mu_);
  Stmt st;
  std::string sql = std::string("SELECT ") + kColumns + " FROM sandboxes s WHERE 1";
  if (!q.state.empty()) sql += " AND s.state = ?";
  if (q.live_only) sql += " AND s.ended_at_ms = 0";
  for (size_t i = 0; i < q.labels.size(); ++i)
    sql +=
        " AND EXISTS (SELECT 1 FROM sandbox_labels l WHERE l.sandbox_id = s.id"
        " AND l.key = ? AND l.value = ?)";
  sql += " ORDER BY s.created_at_ms, s.id";
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st.s, nullptr) != SQLITE_OK)
    return std::unexpected(db_error(db_, "prepare list"));
  int n = 1;
  if (!q.state.empty()) sqlite3_bind_text(st.s, n++, q.state.c_str(), -1, SQLITE_TRANSIENT);
  for (const auto& [k, v] : q.labels) {
    sqlite3_bind_text(st.s, n++, k.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st.s, n++, v.c_str(), -1, SQLITE_TRANSIENT);
  }
  std::vector<SandboxRecord> out;
  int rc;
  while ((rc = sqlite3_step(st.s)) == SQLITE_ROW) out.push_back(row_to_record(st.s));
  if (rc != SQLITE_DONE) return std::unexpected(db_error(db_, "list"));
  return out;
}

Result<int> SqliteSandboxStore::prune_ended(int64_t before_ms) {
  std::lock_guard lk(mu_);
  TP_TRY(exec_sql("BEGIN IMMEDIATE"));
  auto body = [&]() -> Result<int> {
    Stmt labels, rows;
    if (sqlite3_prepare_v2(
            db_,
            "DELETE FROM sandbox_labels WHERE sandbox_id IN (SELECT id FROM sandboxes"
            " WHERE ended_at_ms > 0 AND ended_at_ms < ?1)",
            -1, &labels.s, nullptr) != SQLITE_OK ||
        sqlite3_prepare_v2(db_, "DELETE FROM sandboxes WHERE ended_at_ms > 0 AND ended_at_ms < ?1",
                           -1, &rows.s, nullptr) != SQLITE_OK)
      return std::unexpected(db_error(db_, "prepare prune"));
    sqlite3_bind_int64(labels.s, 1, before_ms);
    sqlite3_bind_int64(rows.s, 1, before_ms);
    if (sqlite3_step(labels.s) != SQLITE_DONE)
      return std::unexpected(db_error(db_, "prune labels"));
    if (sqlite3_step(rows.s) != SQLITE_DONE) return std::unexpected(db_error(db_, "prune"));
    return sqlite3_changes(db_);
  };
  auto n = body();
  if (!n) {
    (void)exec_sql("ROLLBACK");
    return n;
  }
  TP_TRY(exec_sql("COMMIT"));
  return n;
}

}  // namespace tp::control::sqlite
