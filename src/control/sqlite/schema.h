// The schema of state.db, shared by every SQLite store in it: one file, one
// PRAGMA user_version, one migration path, so whichever store opens the file
// first brings all of its tables up to date (each store has its own
// connection; WAL lets them read and write side by side).
//
// Versions:
//   0  the first `sandboxes` table (no version column, labels only as JSON)
//   1  sandboxes.version for compare-and-set updates; labels also in the
//      indexed table sandbox_labels; indexes on state and ended_at_ms
//   2  sandboxes.layers (the layer digests a sandbox was created with, so a
//      restarted daemon pins exactly those); image records in `images` and
//      `image_parts` (indexed by part), until then in images/images.json
//      (image::ImageStore imports that file once)
//   3  sandboxes.uid_base (the sandbox's own host uid range; 0 on rows from
//      before, whose sandboxes share the daemon's range)
//   4  sandboxes.job, step, template, priority, pooled (warm pools and jobs;
//      an index on job); the document tables `templates` and `jobs`
//      (control/sqlite/doc_store.h)
// A file newer than this daemon is refused (no downgrade).
//
// Thread rules: call from one thread per connection (the stores serialise).
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/result.h"

struct sqlite3;
struct sqlite3_stmt;

namespace tp::control::sqlite {

constexpr int kSchemaVersion = 4;

// Opens (creating if needed) the database at `path` with the pragmas every
// store relies on (WAL, synchronous=NORMAL, a busy timeout) and migrates it to
// kSchemaVersion in one transaction. The caller owns the handle.
Result<sqlite3*> open_database(const std::string& path);

// Runs one statement without results.
Result<void> exec_sql(sqlite3* db, const char* sql);

Error db_error(sqlite3* db, const std::string& what);

// A text column as a string ("" for NULL).
std::string column_text(sqlite3_stmt* s, int i);

// Owns a prepared statement.
struct Stmt {
  sqlite3_stmt* s = nullptr;
  ~Stmt();
};

// A connection's prepared statements by their SQL, each compiled once: compiling
// costs about as much as running the small statements of the create and destroy
// path. At most kMax are kept; past that a statement is compiled for its one use.
// Not thread-safe: the owning store's lock covers it. Its owner closes the connection
// with sqlite3_close_v2, which waits for these statements to be finalized.
class StmtCache {
 public:
  static constexpr size_t kMax = 64;
  explicit StmtCache(sqlite3* db) : db_(db) {}
  ~StmtCache();
  StmtCache(const StmtCache&) = delete;
  StmtCache& operator=(const StmtCache&) = delete;

  // One use of a statement: it is reset and its bindings cleared when the use ends.
  class Use {
   public:
    Use(Use&& o) noexcept : s_(std::exchange(o.s_, nullptr)), owned_(o.owned_) {}
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;
    ~Use();
    sqlite3_stmt* get() const { return s_; }

   private:
    friend class StmtCache;
    Use(sqlite3_stmt* s, bool owned) : s_(s), owned_(owned) {}
    sqlite3_stmt* s_;
    bool owned_;  // not cached: finalized when the use ends
  };

  // One use of a given SQL at a time (a second would reset the first's statement).
  // A string_view: the store's literals are looked up without a copy.
  Result<Use> prepare(std::string_view sql);
  // Runs a statement without results (BEGIN IMMEDIATE, COMMIT, ROLLBACK).
  Result<void> exec(std::string_view sql);
  size_t size() const { return stmts_.size(); }  // statements kept

 private:
  sqlite3* db_;
  std::map<std::string, sqlite3_stmt*, std::less<>> stmts_;
};

// List and map columns are stored as JSON text; unreadable text reads as empty.
std::string list_to_json(const std::vector<std::string>& l);
std::string map_to_json(const std::map<std::string, std::string>& m);
std::vector<std::string> list_from_json(const unsigned char* text);
std::map<std::string, std::string> map_from_json(const unsigned char* text);

}  // namespace tp::control::sqlite
