// SqliteSandboxStore: the embedded SandboxStore (SQLite in the data
// directory). A PostgreSQL implementation can sit behind the same interface
// for fleets.
//
// It keeps one row per sandbox (live and ended) so that `get` answers for a
// sandbox after it ended and so that a restarted daemon knows what a previous
// run left behind. Writes survive a crash of the daemon once the call returns
// (WAL, synchronous=NORMAL); a power loss may lose the newest ones.
//
// Schema: control/sqlite/schema.h (shared with the image records of the same
// file); open() migrates an older database in one transaction. Labels also sit
// in their own indexed table `sandbox_labels`; layers are a JSON array.
//
// Thread rules: any thread; calls are serialised inside.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "control/sandbox_store.h"
#include "control/sqlite/schema.h"

struct sqlite3;
struct sqlite3_stmt;

namespace tp::control::sqlite {

class SqliteSandboxStore : public SandboxStore {
 public:
  // Opens (creating or migrating if needed) the database file at `path`.
  static Result<std::unique_ptr<SqliteSandboxStore>> open(const std::string& path);
  ~SqliteSandboxStore() override;
  SqliteSandboxStore(const SqliteSandboxStore&) = delete;
  SqliteSandboxStore& operator=(const SqliteSandboxStore&) = delete;

  Result<uint64_t> insert(const SandboxRecord& r) override;
  Result<uint64_t> update(const SandboxRecord& r) override;
  Result<uint64_t> update_with_labels(const SandboxRecord& r) override;
  Result<std::optional<SandboxRecord>> get(const std::string& id) override;
  Result<std::vector<SandboxRecord>> list(const SandboxQuery& q) override;
  Result<int> prune_ended(int64_t before_ms) override;

 private:
  explicit SqliteSandboxStore(sqlite3* db) : db_(db), stmts_(db) {}
  Result<uint64_t> update_locked(const SandboxRecord& r);  // under mu_
  Result<void> write_labels(const SandboxRecord& r);       // under mu_, in a transaction
  std::mutex mu_;
  sqlite3* db_;
  StmtCache stmts_;  // guarded by mu_; destroyed before db_ is closed
};

}  // namespace tp::control::sqlite
