// SqliteDocStore: the embedded DocStore, one table of the data directory's
// state.db per kind of document (`templates`, `jobs`; schema 4 in
// control/sqlite/schema.h): key, JSON body, live flag and end time (indexed),
// row version. Writes survive a crash of the daemon once the call returns.
//
// Thread rules: any thread; calls are serialised inside.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "control/doc_store.h"

struct sqlite3;

namespace tp::control::sqlite {

class SqliteDocStore : public DocStore {
 public:
  // Opens (creating or migrating if needed) the database file at `path`;
  // `table` is one of the document tables of the schema.
  static Result<std::unique_ptr<SqliteDocStore>> open(const std::string& path,
                                                      const std::string& table);
  ~SqliteDocStore() override;
  SqliteDocStore(const SqliteDocStore&) = delete;
  SqliteDocStore& operator=(const SqliteDocStore&) = delete;

  Result<uint64_t> put(const Doc& d) override;
  Result<std::optional<Doc>> get(const std::string& key) override;
  Result<std::vector<Doc>> list(bool live_only) override;
  Result<void> remove(const std::string& key, uint64_t version) override;
  Result<int> prune_ended(int64_t before_ms) override;

 private:
  SqliteDocStore(sqlite3* db, std::string table) : db_(db), table_(std::move(table)) {}
  // The stored version of `key`: kNotFound if none, kConflict naming it if != want.
  Error version_mismatch(const std::string& key, uint64_t want);
  std::mutex mu_;
  sqlite3* db_;
  const std::string table_;
};

}  // namespace tp::control::sqlite
