// DocStore: durable documents (a JSON body under a text key) with a row
// version, behind an interface so that nothing above it depends on the
// database. Templates and jobs are stored as documents (control/template_store.h,
// control/job_store.h, which own the JSON shape); the embedded implementation
// is control::sqlite::SqliteDocStore (a table of state.db), the in-memory one
// control::MemoryDocStore.
//
// Contract (tests/unit/control/doc_store_contract_test.cpp runs it against
// every implementation):
//   - put() with version 0 stores a new key at version 1 and fails with
//     kConflict if the key exists; with version N it replaces the document
//     only if its stored version is N (compare-and-set) and answers N + 1; a
//     stale N fails with kConflict, an unknown key with kNotFound.
//   - remove() is the same compare-and-set on the version.
//   - list() is ordered by key; live_only skips documents stored with
//     live = false (indexed).
//   - prune_ended() deletes documents that are not live and ended before a time.
//   - writes survive a crash of the daemon once the call returns.
//
// Thread rules: every method may be called from any thread; implementations
// serialise internally.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"

namespace tp::control {

struct Doc {
  std::string key;
  std::string body;      // JSON text, owned by the typed store
  bool live = true;      // false: ended (kept for a while, then pruned)
  int64_t ended_ms = 0;  // when it ended (live = false)
  uint64_t version = 0;  // the store's row version (0 = never stored)
};

class DocStore {
 public:
  virtual ~DocStore() = default;
  virtual Result<uint64_t> put(const Doc& d) = 0;
  virtual Result<std::optional<Doc>> get(const std::string& key) = 0;
  virtual Result<std::vector<Doc>> list(bool live_only) = 0;
  virtual Result<void> remove(const std::string& key, uint64_t version) = 0;
  virtual Result<int> prune_ended(int64_t before_ms) = 0;
};

// In memory (unit tests). fail_writes() makes every later put/remove fail with
// kInternal (what callers do on a full disk).
class MemoryDocStore : public DocStore {
 public:
  Result<uint64_t> put(const Doc& d) override;
  Result<std::optional<Doc>> get(const std::string& key) override;
  Result<std::vector<Doc>> list(bool live_only) override;
  Result<void> remove(const std::string& key, uint64_t version) override;
  Result<int> prune_ended(int64_t before_ms) override;
  void fail_writes(bool on);

 private:
  std::mutex mu_;
  std::map<std::string, Doc> rows_;
  bool fail_writes_ = false;
};

}  // namespace tp::control
