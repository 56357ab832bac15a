// JobStore: durable jobs (the sandboxes of one training run, their lease and
// quotas), stored as documents in a DocStore (control/doc_store.h: compare-
// and-set on a row version; ended jobs are not live, listed apart, pruned).
// The JSON body is this file's own. node/jobs.h decides what a job's lease
// and quotas mean.
//
// Thread rules: as the DocStore behind it (any thread).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"
#include "control/doc_store.h"

namespace tp::control {

// 0 = no limit.
struct JobQuota {
  uint64_t sandboxes = 0;
  uint64_t memory_mb = 0;
  double cpus = 0;
};

struct JobRecord {
  std::string id;
  std::string name;
  std::string state = "active";  // active, lapsed (lease not renewed: paused), ended
  uint64_t lease_seconds = 60;   // renewed by heartbeats
  uint64_t grace_seconds = 600;  // kept paused this long after the lease lapsed
  int64_t created_ms = 0;
  int64_t lease_expires_ms = 0;
  int64_t lapsed_at_ms = 0;  // when the lease lapsed (state lapsed), else 0
  int64_t ended_ms = 0;
  std::string end_reason;  // "deleted" (DELETE), "expired" (grace over)
  JobQuota quota;
  std::map<std::string, std::string> labels;
  uint64_t version = 0;  // the store's row version (0 = never stored)
};

class JobStore {
 public:
  explicit JobStore(DocStore& docs) : docs_(docs) {}
  // version 0 creates (kConflict if the id exists); N replaces if stored at N.
  Result<uint64_t> put(const JobRecord& j);
  Result<std::optional<JobRecord>> get(const std::string& id);
  Result<std::vector<JobRecord>> list(bool live_only);  // by id
  Result<int> prune_ended(int64_t before_ms) { return docs_.prune_ended(before_ms); }

  static std::string to_body(const JobRecord& j);
  static Result<JobRecord> from_doc(const Doc& d);

 private:
  DocStore& docs_;
};

}  // namespace tp::control
