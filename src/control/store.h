// Store: durable fleet state. This module is the embedded default (SQLite in
// the data directory); a PostgreSQL implementation will sit behind the same
// interface for fleets.
//
// It keeps one row per sandbox (live and ended) so that `get` answers for a
// sandbox after it ended and so that a restarted daemon knows what a previous
// run left behind. Writes survive a crash of the daemon once the call returns
// (WAL, synchronous=NORMAL); a power loss may lose the newest ones, which is
// harmless because it also ends every sandbox. Step results, which must never
// be lost, belong to the trajectory log, not here.
//
// Thread rules: a Store may be used from any thread; calls are serialised inside.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"

struct sqlite3;
struct sqlite3_stmt;

namespace tp::control {

struct SandboxRecord {
  std::string id;
  std::string state;        // creating, running, paused, stopped, lost
  std::string tier;
  std::string image;
  std::string node;
  uint64_t memory_mb = 0;
  double cpus = 0;
  uint64_t pids = 0;
  uint64_t disk_mb = 0;
  uint64_t ttl_seconds = 0;
  uint64_t idle_timeout_seconds = 0;
  std::map<std::string, std::string> labels;
  std::map<std::string, std::string> env;
  int64_t created_at_ms = 0;   // unix epoch milliseconds
  int64_t expires_at_ms = 0;
  int64_t ended_at_ms = 0;     // 0 while live
  std::string end_reason;      // deleted, ttl, idle, failed, daemon_restart
};

class Store {
 public:
  // Opens (creating if needed) the database file at `path`.
  static Result<std::unique_ptr<Store>> open(const std::string& path);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  Result<void> put(const SandboxRecord& r);  // insert or replace
  Result<std::optional<SandboxRecord>> get(const std::string& id);
  // All records; live_only skips ended ones.
  Result<std::vector<SandboxRecord>> list(bool live_only);
  // Deletes ended records that ended before `before_ms`; returns how many.
  Result<int> prune_ended(int64_t before_ms);

 private:
  explicit Store(sqlite3* db) : db_(db) {}
  Result<void> exec_sql(const char* sql);
  std::mutex mu_;
  sqlite3* db_;
  // put() runs twice per sandbox on the create and destroy paths: prepared once
  // (compiling the statement cost about as much as running it). Guarded by mu_.
  sqlite3_stmt* put_stmt_ = nullptr;
};

}  // namespace tp::control
