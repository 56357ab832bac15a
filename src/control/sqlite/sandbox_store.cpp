#include "control/sqlite/sandbox_store.h"

#include <sqlite3.h>

#include "control/sqlite/schema.h"

namespace tp::control::sqlite {
namespace {

// Leaves a cached statement ready for its next use, whatever happens.
struct Reset {
  sqlite3_stmt* s;
  ~Reset() {
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
  }
};

SandboxRecord sandbox_from_row(sqlite3_stmt* s) {
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
  r.labels = map_from_json(sqlite3_column_text(s, 11));
  r.env = map_from_json(sqlite3_column_text(s, 12));
  r.created_at_ms = sqlite3_column_int64(s, 13);
  r.expires_at_ms = sqlite3_column_int64(s, 14);
  r.ended_at_ms = sqlite3_column_int64(s, 15);
  r.end_reason = text(16);
  r.version = sqlite3_column_int64(s, 17);
  r.layers = list_from_json(sqlite3_column_text(s, 18));
  r.uid_base = static_cast<uint32_t>(sqlite3_column_int64(s, 19));
  r.job = text(20);
  r.step = text(21);
  r.template_name = text(22);
  r.priority = text(23);
  r.pooled = sqlite3_column_int64(s, 24) != 0;
  return r;
}

constexpr const char* kSandboxColumns =
    "id, state, tier, image, node, memory_mb, cpus, pids, disk_mb, ttl_seconds, "
    "idle_timeout_seconds, labels, env, created_at_ms, expires_at_ms, ended_at_ms, end_reason, "
    "version, layers, uid_base, job, step, template, priority, pooled";

// Binds the 17 record columns before version at 1..17, layers at 18, uid_base at
// 20, job .. pooled at 21..25 (19 is the version a CAS update expects).
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
  sqlite3_bind_text(s, 18, list_to_json(r.layers).c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(s, 20, r.uid_base);
  sqlite3_bind_text(s, 21, r.job.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(s, 22, r.step.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(s, 23, r.template_name.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(s, 24, r.priority.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(s, 25, r.pooled ? 1 : 0);
}

}  // namespace

Result<std::unique_ptr<SqliteSandboxStore>> SqliteSandboxStore::open(const std::string& path) {
  auto db = open_database(path);
  if (!db) return std::unexpected(db.error());
  return std::unique_ptr<SqliteSandboxStore>(new SqliteSandboxStore(*db));
}

SqliteSandboxStore::~SqliteSandboxStore() {
  sqlite3_finalize(insert_stmt_);
  sqlite3_finalize(label_stmt_);
  sqlite3_finalize(update_stmt_);
  sqlite3_close(db_);
}

Result<void> SqliteSandboxStore::exec_sql(const char* sql) { return sqlite::exec_sql(db_, sql); }

Result<sqlite3_stmt*> SqliteSandboxStore::prepared(sqlite3_stmt** slot, const char* sql) {
  if (!*slot && sqlite3_prepare_v2(db_, sql, -1, slot, nullptr) != SQLITE_OK)
    return std::unexpected(db_error(db_, std::string("prepare ") + sql));
  return *slot;
}

Result<uint64_t> SqliteSandboxStore::insert(const SandboxRecord& r) {
  std::lock_guard lk(mu_);
  static const std::string kInsert =
      std::string("INSERT INTO sandboxes (") + kSandboxColumns +
      ") VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,1,?18,?20,?21,?22,?23,"
      "?24,?25)";
  auto ins = prepared(&insert_stmt_, kInsert.c_str());
  if (!ins) return std::unexpected(ins.error());
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
    return write_labels(r);
  };
  if (auto b = body(); !b) {
    (void)exec_sql("ROLLBACK");
    return std::unexpected(b.error());
  }
  TP_TRY(exec_sql("COMMIT"));
  return 1;
}

Result<void> SqliteSandboxStore::write_labels(const SandboxRecord& r) {
  auto lab =
      prepared(&label_stmt_, "INSERT INTO sandbox_labels (sandbox_id, key, value) VALUES (?,?,?)");
  if (!lab) return std::unexpected(lab.error());
  for (const auto& [k, v] : r.labels) {
    Reset reset{*lab};
    sqlite3_bind_text(*lab, 1, r.id.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(*lab, 2, k.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(*lab, 3, v.c_str(), -1, SQLITE_TRANSIENT);
    if (sqlite3_step(*lab) != SQLITE_DONE)
      return std::unexpected(db_error(db_, "insert labels " + r.id));
  }
  return {};
}

Result<uint64_t> SqliteSandboxStore::update(const SandboxRecord& r) {
  std::lock_guard lk(mu_);
  return update_locked(r);
}

Result<uint64_t> SqliteSandboxStore::update_with_labels(const SandboxRecord& r) {
  std::lock_guard lk(mu_);
  TP_TRY(exec_sql("BEGIN IMMEDIATE"));
  auto body = [&]() -> Result<uint64_t> {
    auto v = update_locked(r);
    if (!v) return v;
    Stmt del, col;
    if (sqlite3_prepare_v2(db_, "DELETE FROM sandbox_labels WHERE sandbox_id = ?", -1, &del.s,
                           nullptr) != SQLITE_OK ||
        sqlite3_prepare_v2(db_, "UPDATE sandboxes SET labels = ?2 WHERE id = ?1", -1, &col.s,
                           nullptr) != SQLITE_OK)
      return std::unexpected(db_error(db_, "prepare labels"));
    sqlite3_bind_text(del.s, 1, r.id.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(col.s, 1, r.id.c_str(), -1, SQLITE_TRANSIENT);
    const std::string json = map_to_json(r.labels);
    sqlite3_bind_text(col.s, 2, json.c_str(), -1, SQLITE_TRANSIENT);
    if (sqlite3_step(del.s) != SQLITE_DONE || sqlite3_step(col.s) != SQLITE_DONE)
      return std::unexpected(db_error(db_, "labels of " + r.id));
    TP_TRY(write_labels(r));
    return v;
  };
  auto v = body();
  if (!v) {
    (void)exec_sql("ROLLBACK");
    return v;
  }
  TP_TRY(exec_sql("COMMIT"));
  return v;
}

Result<uint64_t> SqliteSandboxStore::update_locked(const SandboxRecord& r) {
  // Labels are not rewritten here (update_with_labels does).
  auto up =
      prepared(&update_stmt_,
               "UPDATE sandboxes SET state=?2, tier=?3, image=?4, node=?5, memory_mb=?6, cpus=?7,"
               " pids=?8, disk_mb=?9, ttl_seconds=?10, idle_timeout_seconds=?11, env=?13,"
               " created_at_ms=?14, expires_at_ms=?15, ended_at_ms=?16, end_reason=?17,"
               " layers=?18, uid_base=?20, job=?21, step=?22, template=?23, priority=?24,"
               " pooled=?25, version=version+1 WHERE id=?1 AND version=?19");
  if (!up) return std::unexpected(up.error());
  {
    Reset reset{*up};
    bind_record(*up, r, "", map_to_json(r.env));
    sqlite3_bind_int64(*up, 19, static_cast<sqlite3_int64>(r.version));
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
  std::string sql = std::string("SELECT ") + kSandboxColumns + " FROM sandboxes WHERE id = ?";
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st.s, nullptr) != SQLITE_OK)
    return std::unexpected(db_error(db_, "prepare get"));
  sqlite3_bind_text(st.s, 1, id.c_str(), -1, SQLITE_TRANSIENT);
  int rc = sqlite3_step(st.s);
  if (rc == SQLITE_DONE) return std::optional<SandboxRecord>{};
  if (rc != SQLITE_ROW) return std::unexpected(db_error(db_, "get " + id));
  return std::optional<SandboxRecord>{sandbox_from_row(st.s)};
}

Result<std::vector<SandboxRecord>> SqliteSandboxStore::list(const SandboxQuery& q) {
  std::lock_guard lk(mu_);
  Stmt st;
  std::string sql = std::string("SELECT ") + kSandboxColumns + " FROM sandboxes s WHERE 1";
  if (!q.state.empty()) sql += " AND s.state = ?";
  if (q.live_only) sql += " AND s.ended_at_ms = 0";
  if (!q.include_pooled) sql += " AND s.pooled = 0";
  if (!q.job.empty()) sql += " AND s.job = ?";
  if (!q.step.empty()) sql += " AND s.step = ?";
  for (size_t i = 0; i < q.labels.size(); ++i)
    sql +=
        " AND EXISTS (SELECT 1 FROM sandbox_labels l WHERE l.sandbox_id = s.id"
        " AND l.key = ? AND l.value = ?)";
  sql += " ORDER BY s.created_at_ms, s.id";
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st.s, nullptr) != SQLITE_OK)
    return std::unexpected(db_error(db_, "prepare list"));
  int n = 1;
  if (!q.state.empty()) sqlite3_bind_text(st.s, n++, q.state.c_str(), -1, SQLITE_TRANSIENT);
  if (!q.job.empty()) sqlite3_bind_text(st.s, n++, q.job.c_str(), -1, SQLITE_TRANSIENT);
  if (!q.step.empty()) sqlite3_bind_text(st.s, n++, q.step.c_str(), -1, SQLITE_TRANSIENT);
  for (const auto& [k, v] : q.labels) {
    sqlite3_bind_text(st.s, n++, k.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st.s, n++, v.c_str(), -1, SQLITE_TRANSIENT);
  }
  std::vector<SandboxRecord> out;
  int rc;
  while ((rc = sqlite3_step(st.s)) == SQLITE_ROW) out.push_back(sandbox_from_row(st.s));
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
