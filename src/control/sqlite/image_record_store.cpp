#include "control/sqlite/image_record_store.h"

#include <sqlite3.h>

#include <set>

#include "control/sqlite/schema.h"

namespace tp::control::sqlite {
namespace {

std::string ref(const std::string& name, const std::string& version) {
  return name + ":" + version;
}

constexpr const char* kImageColumns =
    "name, version, parts, env, workdir, user, cmd, source, created_ms, row_version";

ImageRecord image_from_row(sqlite3_stmt* s) {
  ImageRecord r;
  r.name = column_text(s, 0);
  r.version = column_text(s, 1);
  r.parts = list_from_json(sqlite3_column_text(s, 2));
  r.defaults.env = map_from_json(sqlite3_column_text(s, 3));
  r.defaults.workdir = column_text(s, 4);
  r.defaults.user = column_text(s, 5);
  r.defaults.cmd = list_from_json(sqlite3_column_text(s, 6));
  r.source = column_text(s, 7);
  r.created_ms = sqlite3_column_int64(s, 8);
  r.row_version = static_cast<uint64_t>(sqlite3_column_int64(s, 9));
  return r;
}

void bind_text(sqlite3_stmt* s, int i, const std::string& v) {
  sqlite3_bind_text(s, i, v.c_str(), -1, SQLITE_TRANSIENT);
}

// Binds the record's columns but row_version at 1..9.
void bind_record(sqlite3_stmt* s, const ImageRecord& r) {
  bind_text(s, 1, r.name);
  bind_text(s, 2, r.version);
  bind_text(s, 3, list_to_json(r.parts));
  bind_text(s, 4, map_to_json(r.defaults.env));
  bind_text(s, 5, r.defaults.workdir);
  bind_text(s, 6, r.defaults.user);
  bind_text(s, 7, list_to_json(r.defaults.cmd));
  bind_text(s, 8, r.source);
  sqlite3_bind_int64(s, 9, r.created_ms);
}

}  // namespace

Result<std::unique_ptr<SqliteImageRecordStore>> SqliteImageRecordStore::open(
    const std::string& path) {
  auto db = open_database(path);
  if (!db) return std::unexpected(db.error());
  return std::unique_ptr<SqliteImageRecordStore>(new SqliteImageRecordStore(*db));
}

// close_v2: the connection goes once stmts_ has finalized its statements.
SqliteImageRecordStore::~SqliteImageRecordStore() { sqlite3_close_v2(db_); }

template <class T>
Result<T> SqliteImageRecordStore::in_transaction(const std::function<Result<T>()>& fn) {
  TP_TRY(stmts_.exec("BEGIN IMMEDIATE"));
  auto r = fn();
  if (!r) {
    (void)stmts_.exec("ROLLBACK");
    return r;
  }
  TP_TRY(stmts_.exec("COMMIT"));
  return r;
}

Result<std::optional<uint64_t>> SqliteImageRecordStore::row_version_of(const std::string& name,
                                                                       const std::string& version) {
  Stmt st;
  if (sqlite3_prepare_v2(db_, "SELECT row_version FROM images WHERE name = ? AND version = ?", -1,
                         &st.s, nullptr) != SQLITE_OK)
    return std::unexpected(db_error(db_, "prepare row_version"));
  bind_text(st.s, 1, name);
  bind_text(st.s, 2, version);
  int rc = sqlite3_step(st.s);
  if (rc == SQLITE_DONE) return std::optional<uint64_t>{};
  if (rc != SQLITE_ROW) return std::unexpected(db_error(db_, "row_version " + ref(name, version)));
  return std::optional<uint64_t>{static_cast<uint64_t>(sqlite3_column_int64(st.s, 0))};
}

Result<void> SqliteImageRecordStore::write_parts(const ImageRecord& r) {
  Stmt del, ins;
  if (sqlite3_prepare_v2(db_, "DELETE FROM image_parts WHERE name = ? AND version = ?", -1, &del.s,
                         nullptr) != SQLITE_OK ||
      sqlite3_prepare_v2(db_, "INSERT INTO image_parts (name, version, pos, part) VALUES (?,?,?,?)",
                         -1, &ins.s, nullptr) != SQLITE_OK)
    return std::unexpected(db_error(db_, "prepare parts"));
  bind_text(del.s, 1, r.name);
  bind_text(del.s, 2, r.version);
  if (sqlite3_step(del.s) != SQLITE_DONE)
    return std::unexpected(db_error(db_, "delete parts of " + ref(r.name, r.version)));
  for (size_t i = 0; i < r.parts.size(); ++i) {
    sqlite3_reset(ins.s);
    bind_text(ins.s, 1, r.name);
    bind_text(ins.s, 2, r.version);
    sqlite3_bind_int64(ins.s, 3, static_cast<sqlite3_int64>(i));
    bind_text(ins.s, 4, r.parts[i]);
    if (sqlite3_step(ins.s) != SQLITE_DONE)
      return std::unexpected(db_error(db_, "insert parts of " + ref(r.name, r.version)));
  }
  return {};
}

Result<uint64_t> SqliteImageRecordStore::put(const ImageRecord& r) {
  std::lock_guard lk(mu_);
  return in_transaction<uint64_t>([&]() -> Result<uint64_t> {
    if (r.row_version == 0) {
      Stmt st;
      std::string sql = std::string("INSERT INTO images (") + kImageColumns +
                        ") VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,1)";
      if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st.s, nullptr) != SQLITE_OK)
        return std::unexpected(db_error(db_, "prepare insert image"));
      bind_record(st.s, r);
      int rc = sqlite3_step(st.s);
      if (rc == SQLITE_CONSTRAINT)
        return fail(Code::kConflict, "image " + ref(r.name, r.version) + " already exists");
      if (rc != SQLITE_DONE)
        return std::unexpected(db_error(db_, "insert image " + ref(r.name, r.version)));
      TP_TRY(write_parts(r));
      return uint64_t{1};
    }
    Stmt st;
    if (sqlite3_prepare_v2(db_,
                           "UPDATE images SET parts=?3, env=?4, workdir=?5, user=?6, cmd=?7,"
                           " source=?8, created_ms=?9, row_version=row_version+1"
                           " WHERE name=?1 AND version=?2 AND row_version=?10",
                           -1, &st.s, nullptr) != SQLITE_OK)
      return std::unexpected(db_error(db_, "prepare update image"));
    bind_record(st.s, r);
    sqlite3_bind_int64(st.s, 10, static_cast<sqlite3_int64>(r.row_version));
    if (sqlite3_step(st.s) != SQLITE_DONE)
      return std::unexpected(db_error(db_, "update image " + ref(r.name, r.version)));
    if (sqlite3_changes(db_) != 1) {
      auto now = row_version_of(r.name, r.version);
      if (!now) return std::unexpected(now.error());
      if (!*now) return fail(Code::kNotFound, "image " + ref(r.name, r.version) + " not stored");
      return fail(Code::kConflict, "image " + ref(r.name, r.version) + " changed (version " +
                                       std::to_string(**now) + ", expected " +
                                       std::to_string(r.row_version) + ")");
    }
    TP_TRY(write_parts(r));
    return r.row_version + 1;
  });
}

Result<std::vector<ImageRecord>> SqliteImageRecordStore::query(
    const std::string& where_order, const std::vector<std::string>& args) {
  auto st =
      stmts_.prepare(std::string("SELECT ") + kImageColumns + " FROM images i " + where_order);
  if (!st) return std::unexpected(st.error());
  sqlite3_stmt* s = st->get();
  for (size_t i = 0; i < args.size(); ++i) bind_text(s, static_cast<int>(i + 1), args[i]);
  std::vector<ImageRecord> out;
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) out.push_back(image_from_row(s));
  if (rc != SQLITE_DONE) return std::unexpected(db_error(db_, "query images"));
  return out;
}

Result<std::optional<ImageRecord>> SqliteImageRecordStore::get(const std::string& name,
                                                               const std::string& version) {
  std::lock_guard lk(mu_);
  auto l = query("WHERE name = ? AND version = ?", {name, version});
  if (!l) return std::unexpected(l.error());
  if (l->empty()) return std::optional<ImageRecord>{};
  return std::optional<ImageRecord>{std::move(l->front())};
}

Result<std::optional<ImageRecord>> SqliteImageRecordStore::latest(const std::string& name) {
  std::lock_guard lk(mu_);
  auto l =
      query("WHERE name = ? ORDER BY created_ms DESC, version DESC LIMIT 1", std::vector{name});
  if (!l) return std::unexpected(l.error());
  if (l->empty()) return std::optional<ImageRecord>{};
  return std::optional<ImageRecord>{std::move(l->front())};
}

Result<std::vector<ImageRecord>> SqliteImageRecordStore::list(const ImageQuery& q) {
  std::lock_guard lk(mu_);
  std::string where = "WHERE 1";
  std::vector<std::string> args;
  if (!q.name.empty()) {
    where += " AND i.name = ?";
    args.push_back(q.name);
  }
  if (!q.part.empty()) {
    where +=
        " AND EXISTS (SELECT 1 FROM image_parts p WHERE p.part = ? AND p.name = i.name"
        " AND p.version = i.version)";
    args.push_back(q.part);
  }
  return query(where + " ORDER BY i.name, i.version", args);
}

Result<void> SqliteImageRecordStore::remove(const std::string& name, const std::string& version,
                                            uint64_t row_version) {
  std::lock_guard lk(mu_);
  return in_transaction<void>([&]() -> Result<void> {
    Stmt st;
    if (sqlite3_prepare_v2(db_,
                           "DELETE FROM images WHERE name = ? AND version = ? AND row_version = ?",
                           -1, &st.s, nullptr) != SQLITE_OK)
      return std::unexpected(db_error(db_, "prepare remove image"));
    bind_text(st.s, 1, name);
    bind_text(st.s, 2, version);
    sqlite3_bind_int64(st.s, 3, static_cast<sqlite3_int64>(row_version));
    if (sqlite3_step(st.s) != SQLITE_DONE)
      return std::unexpected(db_error(db_, "remove image " + ref(name, version)));
    if (sqlite3_changes(db_) != 1) {
      auto now = row_version_of(name, version);
      if (!now) return std::unexpected(now.error());
      if (!*now) return fail(Code::kNotFound, "image " + ref(name, version) + " not stored");
      return fail(Code::kConflict, "image " + ref(name, version) + " changed (version " +
                                       std::to_string(**now) + ", expected " +
                                       std::to_string(row_version) + ")");
    }
    ImageRecord gone;
    gone.name = name;
    gone.version = version;
    return write_parts(gone);  // no parts: deletes them
  });
}

Result<std::map<std::string, uint32_t>> SqliteImageRecordStore::part_counts() {
  std::lock_guard lk(mu_);
  Stmt st;
  // DISTINCT: a record that lists a part twice counts once.
  if (sqlite3_prepare_v2(db_,
                         "SELECT part, COUNT(*) FROM"
                         " (SELECT DISTINCT name, version, part FROM image_parts) GROUP BY part",
                         -1, &st.s, nullptr) != SQLITE_OK)
    return std::unexpected(db_error(db_, "prepare part_counts"));
  std::map<std::string, uint32_t> out;
  int rc;
  while ((rc = sqlite3_step(st.s)) == SQLITE_ROW)
    out[column_text(st.s, 0)] = static_cast<uint32_t>(sqlite3_column_int64(st.s, 1));
  if (rc != SQLITE_DONE) return std::unexpected(db_error(db_, "part_counts"));
  return out;
}

}  // namespace tp::control::sqlite
