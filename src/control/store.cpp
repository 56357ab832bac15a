#include "control/store.h"

#include <sqlite3.h>

#include <boost/json.hpp>

namespace tp::control {
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
  return r;
}

constexpr const char* kColumns =
    "id, state, tier, image, node, memory_mb, cpus, pids, disk_mb, ttl_seconds, "
    "idle_timeout_seconds, labels, env, created_at_ms, expires_at_ms, ended_at_ms, end_reason";

}  // namespace

Result<std::unique_ptr<Store>> Store::open(const std::string& path) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                           nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return fail(Code::kInternal, "sqlite open(" + path + "): " + msg);
  }
  std::unique_ptr<Store> st(new Store(db));
  sqlite3_busy_timeout(db, 5000);
  TP_TRY(st->exec_sql("PRAGMA journal_mode=WAL"));
  // NORMAL in WAL mode survives a daemon crash (what restart recovery needs);
  // a power loss may lose the last records, but it also ends every sandbox.
  TP_TRY(st->exec_sql("PRAGMA synchronous=NORMAL"));
  // WITHOUT ROWID: the rows live in the id's b-tree, so a put rewrites one leaf
  // page, not a table page and an index page (two puts per sandbox). A store made
  // before keeps its rowid table, which reads and writes the same.
  TP_TRY(st->exec_sql(
      "CREATE TABLE IF NOT EXISTS sandboxes ("
      " id TEXT PRIMARY KEY, state TEXT NOT NULL, tier TEXT, image TEXT, node TEXT,"
      " memory_mb INTEGER, cpus REAL, pids INTEGER, disk_mb INTEGER, ttl_seconds INTEGER,"
      " idle_timeout_seconds INTEGER, labels TEXT, env TEXT, created_at_ms INTEGER,"
      " expires_at_ms INTEGER, ended_at_ms INTEGER, end_reason TEXT) WITHOUT ROWID"));
  return st;
}

Store::~Store() {
  sqlite3_finalize(put_stmt_);
  sqlite3_close(db_);
}

Result<void> Store::exec_sql(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "?";
    sqlite3_free(err);
    return fail(Code::kInternal, std::string("sqlite exec(") + sql + "): " + msg);
  }
  return {};
}

Result<void> Store::put(const SandboxRecord& r) {
  std::lock_guard lk(mu_);
  if (!put_stmt_) {
    std::string sql = std::string("INSERT OR REPLACE INTO sandboxes (") + kColumns +
                      ") VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)";
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &put_stmt_, nullptr) != SQLITE_OK)
      return std::unexpected(db_error(db_, "prepare put"));
  }
  struct Reset {  // leaves the statement ready for the next put, whatever happens here
    sqlite3_stmt* s;
    ~Reset() {
      sqlite3_reset(s);
      sqlite3_clear_bindings(s);
    }
  } reset{put_stmt_};
  sqlite3_stmt* s = put_stmt_;
  std::string labels = map_to_json(r.labels), env = map_to_json(r.env);
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
  if (sqlite3_step(s) != SQLITE_DONE) return std::unexpected(db_error(db_, "put " + r.id));
  return {};
}

Result<std::optional<SandboxRecord>> Store::get(const std::string& id) {
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

Result<std::vector<SandboxRecord>> Store::list(bool live_only) {
  std::lock_guard lk(mu_);
  Stmt st;
  std::string sql = std::string("SELECT ") + kColumns + " FROM sandboxes" +
                    (live_only ? " WHERE ended_at_ms = 0" : "") + " ORDER BY created_at_ms";
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st.s, nullptr) != SQLITE_OK)
    return std::unexpected(db_error(db_, "prepare list"));
  std::vector<SandboxRecord> out;
  int rc;
  while ((rc = sqlite3_step(st.s)) == SQLITE_ROW) out.push_back(row_to_record(st.s));
  if (rc != SQLITE_DONE) return std::unexpected(db_error(db_, "list"));
  return out;
}

Result<int> Store::prune_ended(int64_t before_ms) {
  std::lock_guard lk(mu_);
  Stmt st;
  if (sqlite3_prepare_v2(db_, "DELETE FROM sandboxes WHERE ended_at_ms > 0 AND ended_at_ms < ?",
                         -1, &st.s, nullptr) != SQLITE_OK)
    return std::unexpected(db_error(db_, "prepare prune"));
  sqlite3_bind_int64(st.s, 1, before_ms);
  if (sqlite3_step(st.s) != SQLITE_DONE) return std::unexpected(db_error(db_, "prune"));
  return sqlite3_changes(db_);
}

}  // namespace tp::control
