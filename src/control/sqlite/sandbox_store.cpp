#include "control/sqlite/sandbox_store.h"

#include <sqlite3.h>

#include "control/sqlite/schema.h"

namespace tp::control::sqlite {
namespace {

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

// close_v2: the connection goes once stmts_ (destroyed after this body) has finalized
// its statements.
SqliteSandboxStore::~SqliteSandboxStore() { sqlite3_close_v2(db_); }

// The transaction around fn: committed when fn succeeds, rolled back when it fails.
template <class T, class Fn>
static Result<T> in_transaction(StmtCache& stmts, Fn&& fn) {
  TP_TRY(stmts.exec("BEGIN IMMEDIATE"));
  Result<T> r = fn();
  if (!r) {
    (void)stmts.exec("ROLLBACK");
    return r;
  }
  TP_TRY(stmts.exec("COMMIT"));
  return r;
}

Result<uint64_t> SqliteSandboxStore::insert(const SandboxRecord& r) {
  std::lock_guard lk(mu_);
  static const std::string kInsert =
      std::string("INSERT INTO sandboxes (") + kSandboxColumns +
      ") VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,1,?18,?20,?21,?22,?23,"
      "?24,?25)";
  return in_transaction<uint64_t>(stmts_, [&]() -> Result<uint64_t> {
    {
      auto ins = stmts_.prepare(kInsert);
      if (!ins) return std::unexpected(ins.error());
      bind_record(ins->get(), r, map_to_json(r.labels), map_to_json(r.env));
      int rc = sqlite3_step(ins->get());
      if (rc == SQLITE_CONSTRAINT)
        return fail(Code::kConflict, "sandbox " + r.id + " already stored");
      if (rc != SQLITE_DONE) return std::unexpected(db_error(db_, "insert " + r.id));
    }
    TP_TRY(write_labels(r));
    return 1;
  });
}

Result<void> SqliteSandboxStore::write_labels(const SandboxRecord& r) {
  for (const auto& [k, v] : r.labels) {
    auto lab = stmts_.prepare("INSERT INTO sandbox_labels (sandbox_id, key, value) VALUES (?,?,?)");
    if (!lab) return std::unexpected(lab.error());
    sqlite3_bind_text(lab->get(), 1, r.id.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(lab->get(), 2, k.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(lab->get(), 3, v.c_str(), -1, SQLITE_TRANSIENT);
    if (sqlite3_step(lab->get()) != SQLITE_DONE)
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
  return in_transaction<uint64_t>(stmts_, [&]() -> Result<uint64_t> {
    auto v = update_locked(r);
    if (!v) return v;
    {
      auto del = stmts_.prepare("DELETE FROM sandbox_labels WHERE sandbox_id = ?");
      if (!del) return std::unexpected(del.error());
      auto col = stmts_.prepare("UPDATE sandboxes SET labels = ?2 WHERE id = ?1");
      if (!col) return std::unexpected(col.error());
      sqlite3_bind_text(del->get(), 1, r.id.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_bind_text(col->get(), 1, r.id.c_str(), -1, SQLITE_TRANSIENT);
      const std::string json = map_to_json(r.labels);
      sqlite3_bind_text(col->get(), 2, json.c_str(), -1, SQLITE_TRANSIENT);
      if (sqlite3_step(del->get()) != SQLITE_DONE || sqlite3_step(col->get()) != SQLITE_DONE)
        return std::unexpected(db_error(db_, "labels of " + r.id));
    }
    TP_TRY(write_labels(r));
    return v;
  });
}

Result<uint64_t> SqliteSandboxStore::update_locked(const SandboxRecord& r) {
  // Labels are not rewritten here (update_with_labels does).
  {
    auto up = stmts_.prepare(
        "UPDATE sandboxes SET state=?2, tier=?3, image=?4, node=?5, memory_mb=?6, cpus=?7,"
        " pids=?8, disk_mb=?9, ttl_seconds=?10, idle_timeout_seconds=?11, env=?13,"
        " created_at_ms=?14, expires_at_ms=?15, ended_at_ms=?16, end_reason=?17,"
        " layers=?18, uid_base=?20, job=?21, step=?22, template=?23, priority=?24,"
        " pooled=?25, version=version+1 WHERE id=?1 AND version=?19");
    if (!up) return std::unexpected(up.error());
    bind_record(up->get(), r, "", map_to_json(r.env));
    sqlite3_bind_int64(up->get(), 19, static_cast<sqlite3_int64>(r.version));
    if (sqlite3_step(up->get()) != SQLITE_DONE)
      return std::unexpected(db_error(db_, "update " + r.id));
  }
  if (sqlite3_changes(db_) == 1) return r.version + 1;
  auto st = stmts_.prepare("SELECT version FROM sandboxes WHERE id = ?");
  if (!st) return std::unexpected(st.error());
  sqlite3_bind_text(st->get(), 1, r.id.c_str(), -1, SQLITE_TRANSIENT);
  if (sqlite3_step(st->get()) != SQLITE_ROW)
    return fail(Code::kNotFound, "sandbox " + r.id + " not stored");
  return fail(Code::kConflict, "sandbox " + r.id + " changed (version " +
                                   std::to_string(sqlite3_column_int64(st->get(), 0)) +
                                   ", expected " + std::to_string(r.version) + ")");
}

Result<std::optional<SandboxRecord>> SqliteSandboxStore::get(const std::string& id) {
  std::lock_guard lk(mu_);
  static const std::string kGet =
      std::string("SELECT ") + kSandboxColumns + " FROM sandboxes WHERE id = ?";
  auto st = stmts_.prepare(kGet);
  if (!st) return std::unexpected(st.error());
  sqlite3_bind_text(st->get(), 1, id.c_str(), -1, SQLITE_TRANSIENT);
  int rc = sqlite3_step(st->get());
  if (rc == SQLITE_DONE) return std::optional<SandboxRecord>{};
  if (rc != SQLITE_ROW) return std::unexpected(db_error(db_, "get " + id));
  return std::optional<SandboxRecord>{sandbox_from_row(st->get())};
}

Result<std::vector<SandboxRecord>> SqliteSandboxStore::list(const SandboxQuery& q) {
  std::lock_guard lk(mu_);
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
  auto st = stmts_.prepare(sql);
  if (!st) return std::unexpected(st.error());
  sqlite3_stmt* s = st->get();
  int n = 1;
  if (!q.state.empty()) sqlite3_bind_text(s, n++, q.state.c_str(), -1, SQLITE_TRANSIENT);
  if (!q.job.empty()) sqlite3_bind_text(s, n++, q.job.c_str(), -1, SQLITE_TRANSIENT);
  if (!q.step.empty()) sqlite3_bind_text(s, n++, q.step.c_str(), -1, SQLITE_TRANSIENT);
  for (const auto& [k, v] : q.labels) {
    sqlite3_bind_text(s, n++, k.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, n++, v.c_str(), -1, SQLITE_TRANSIENT);
  }
  std::vector<SandboxRecord> out;
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) out.push_back(sandbox_from_row(s));
  if (rc != SQLITE_DONE) return std::unexpected(db_error(db_, "list"));
  return out;
}

Result<int> SqliteSandboxStore::prune_ended(int64_t before_ms) {
  std::lock_guard lk(mu_);
  return in_transaction<int>(stmts_, [&]() -> Result<int> {
    auto labels = stmts_.prepare(
        "DELETE FROM sandbox_labels WHERE sandbox_id IN (SELECT id FROM sandboxes"
        " WHERE ended_at_ms > 0 AND ended_at_ms < ?1)");
    if (!labels) return std::unexpected(labels.error());
    auto rows = stmts_.prepare("DELETE FROM sandboxes WHERE ended_at_ms > 0 AND ended_at_ms < ?1");
    if (!rows) return std::unexpected(rows.error());
    sqlite3_bind_int64(labels->get(), 1, before_ms);
    sqlite3_bind_int64(rows->get(), 1, before_ms);
    if (sqlite3_step(labels->get()) != SQLITE_DONE)
      return std::unexpected(db_error(db_, "prune labels"));
    if (sqlite3_step(rows->get()) != SQLITE_DONE) return std::unexpected(db_error(db_, "prune"));
    return sqlite3_changes(db_);
  });
}

}  // namespace tp::control::sqlite
