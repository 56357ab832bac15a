// MemorySandboxStore: a SandboxStore in memory (unit tests, and a node that
// must not persist). Same contract as the SQLite store, nothing durable.
//
// Thread rules: any thread; one mutex inside. fail_writes() makes every later
// insert/update fail with kInternal (to test what callers do on a full disk).
// clear() forgets every record.
#pragma once

#include <map>
#include <mutex>

#include "control/sandbox_store.h"

namespace tp::control {

class MemorySandboxStore : public SandboxStore {
 public:
  Result<uint64_t> insert(const SandboxRecord& r) override;
  Result<uint64_t> update(const SandboxRecord& r) override;
  Result<uint64_t> update_with_labels(const SandboxRecord& r) override;
  Result<std::optional<SandboxRecord>> get(const std::string& id) override;
  Result<std::vector<SandboxRecord>> list(const SandboxQuery& q) override;
  Result<int> prune_ended(int64_t before_ms) override;

  void fail_writes(bool on);
  size_t size();
  // Forgets every record (a test that runs many rounds on one store starts each anew).
  void clear();

 private:
  Result<uint64_t> write(const SandboxRecord& r, bool labels);
  std::mutex mu_;
  std::map<std::string, SandboxRecord> rows_;
  bool fail_writes_ = false;
};

}  // namespace tp::control
