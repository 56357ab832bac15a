// SqliteImageRecordStore: the embedded ImageRecordStore, in the same database
// file as the sandbox records (the data directory's state.db; schema and
// migrations in control/sqlite/schema.h). A PostgreSQL implementation can sit
// behind the same interface for fleets.
//
// Tables: `images`, one row per name:version (parts, env and cmd as JSON),
// with an index on (name, created_ms) for latest(); `image_parts`, one row
// per part, indexed by part for list({.part}) and part_counts(). A put or
// remove changes both in one transaction. Writes survive a crash of the
// daemon once the call returns (WAL, synchronous=NORMAL).
//
// Thread rules: any thread; calls are serialised inside.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "control/image_record_store.h"
#include "control/sqlite/schema.h"

struct sqlite3;

namespace tp::control::sqlite {

class SqliteImageRecordStore : public ImageRecordStore {
 public:
  // Opens (creating or migrating if needed) the database file at `path`.
  static Result<std::unique_ptr<SqliteImageRecordStore>> open(const std::string& path);
  ~SqliteImageRecordStore() override;
  SqliteImageRecordStore(const SqliteImageRecordStore&) = delete;
  SqliteImageRecordStore& operator=(const SqliteImageRecordStore&) = delete;

  Result<uint64_t> put(const ImageRecord& r) override;
  Result<std::optional<ImageRecord>> get(const std::string& name,
                                         const std::string& version) override;
  Result<std::optional<ImageRecord>> latest(const std::string& name) override;
  Result<std::vector<ImageRecord>> list(const ImageQuery& q) override;
  Result<void> remove(const std::string& name, const std::string& version,
                      uint64_t row_version) override;
  Result<std::map<std::string, uint32_t>> part_counts() override;

 private:
  explicit SqliteImageRecordStore(sqlite3* db) : db_(db), stmts_(db) {}
  // Runs fn in BEGIN IMMEDIATE ... COMMIT, rolling back on its error.
  template <class T>
  Result<T> in_transaction(const std::function<Result<T>()>& fn);
  Result<std::vector<ImageRecord>> query(const std::string& where_order,
                                         const std::vector<std::string>& args);
  Result<std::optional<uint64_t>> row_version_of(const std::string& name,
                                                 const std::string& version);
  Result<void> write_parts(const ImageRecord& r);
  std::mutex mu_;
  sqlite3* db_;
  StmtCache stmts_;  // guarded by mu_; the queries of resolve (every create) compiled once
};

}  // namespace tp::control::sqlite
