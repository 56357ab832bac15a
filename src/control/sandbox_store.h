// SandboxStore: durable records of sandboxes (live and ended), behind an
// interface so that nothing above it depends on the database. The embedded
// default is control::sqlite::SqliteSandboxStore (the data directory's
// state.db); control::MemorySandboxStore is the in-memory one for tests.
//
// Contract (tests/unit/control/sandbox_store_contract_test.cpp runs it against
// every implementation):
//   - insert() adds a new record and fails with kConflict if its id exists.
//   - update() is a compare-and-set on the record's version: it writes the
//     record only if the stored version equals r.version, and answers the new
//     version (r.version + 1). A stale version fails with kConflict, an unknown
//     id with kNotFound. There is no blind insert-or-replace.
//   - labels are written at insert and by update_with_labels(); update()
//     leaves them as they are (most updates are state changes).
//   - list() filters in the store (by state, by labels, live only), ordered by
//     created_at_ms then id.
//   - writes survive a crash of the daemon once the call returns.
//
// Thread rules: every method may be called from any thread; implementations
// serialise internally.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"

namespace tp::control {

struct SandboxRecord {
  std::string id;
  std::string state;  // creating, running, paused, stopped, lost
  std::string tier;
  std::string image;
  // The image's layer digests ("sha256:<hex>", top first) it was created
  // with; empty for the host image (and for records of older daemons).
  std::vector<std::string> layers;
  std::string node;
  uint64_t memory_mb = 0;
  double cpus = 0;
  uint64_t pids = 0;
  uint64_t disk_mb = 0;
  uint64_t ttl_seconds = 0;
  uint64_t idle_timeout_seconds = 0;
  std::map<std::string, std::string> labels;
  std::map<std::string, std::string> env;
  int64_t created_at_ms = 0;  // unix epoch milliseconds
  int64_t expires_at_ms = 0;
  int64_t ended_at_ms = 0;  // 0 while live
  std::string end_reason;   // see node::EndReason; "" while live
  // First host uid/gid of the sandbox's own 65536-id range (node/uid_ranges.h);
  // 0 = none recorded (a sandbox of a daemon from before per-sandbox ranges).
  uint32_t uid_base = 0;
  std::string job;                  // the job (training run) it belongs to; "" = none
  std::string step;                 // the job's step it is tagged with; "" = none
  std::string template_name;        // the template it was made from; "" = none
  std::string priority = "normal";  // "normal" or "best-effort" (lowest CPU weight)
  // Made by a warm pool and not handed out yet: hidden from clients, listed
  // only with SandboxQuery::include_pooled. Handing it out clears it.
  bool pooled = false;
  uint64_t version = 0;  // the store's row version (0 = never stored)
};

struct SandboxQuery {
  std::string state;                          // "" = any
  std::map<std::string, std::string> labels;  // all must match
  bool live_only = false;                     // skip ended records (ended_at_ms != 0)
  std::string job;                            // "" = any
  std::string step;                           // "" = any (with job: that job's step)
  bool include_pooled = false;                // also warm-pool sandboxes not handed out
};

class SandboxStore {
 public:
  virtual ~SandboxStore() = default;
  // Stores a new record at version 1 (r.version is ignored); answers 1.
  virtual Result<uint64_t> insert(const SandboxRecord& r) = 0;
  // Compare-and-set on r.version; answers the new version.
  virtual Result<uint64_t> update(const SandboxRecord& r) = 0;
  // The same, and the labels are replaced by r.labels (a pooled sandbox handed out).
  virtual Result<uint64_t> update_with_labels(const SandboxRecord& r) = 0;
  virtual Result<std::optional<SandboxRecord>> get(const std::string& id) = 0;
  virtual Result<std::vector<SandboxRecord>> list(const SandboxQuery& q) = 0;
  // Deletes ended records that ended before `before_ms`; answers how many.
  virtual Result<int> prune_ended(int64_t before_ms) = 0;
};

}  // namespace tp::control
