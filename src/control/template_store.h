// TemplateStore: durable sandbox templates (a named sandbox shape: image,
// limits, environment, labels, priority, warm-pool bounds), stored as
// documents in a DocStore (control/doc_store.h: compare-and-set on a row
// version, no blind replace). The JSON body is this file's own.
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

struct TemplateRecord {
  std::string name;
  std::string image = "host";
  std::string tier = "container";
  uint64_t memory_mb = 512;
  double cpus = 1.0;
  uint64_t pids = 512;
  uint64_t disk_mb = 1024;
  uint64_t ttl_seconds = 3600;
  uint64_t idle_timeout_seconds = 0;
  std::map<std::string, std::string> env;
  std::map<std::string, std::string> labels;
  std::string priority = "normal";  // "normal" or "best-effort"
  // Warm pool: fresh sandboxes kept ready, between pool_min and pool_max (the
  // target follows demand: node/pool.h). pool_max 0 = no pool.
  uint32_t pool_min = 0;
  uint32_t pool_max = 0;
  int64_t created_ms = 0;
  int64_t updated_ms = 0;
  uint64_t version = 0;  // the store's row version (0 = never stored)
};

class TemplateStore {
 public:
  explicit TemplateStore(DocStore& docs) : docs_(docs) {}
  // version 0 creates (kConflict if the name exists); N replaces if stored at N.
  Result<uint64_t> put(const TemplateRecord& t);
  Result<std::optional<TemplateRecord>> get(const std::string& name);
  Result<std::vector<TemplateRecord>> list();  // by name
  Result<void> remove(const std::string& name, uint64_t version);

  static std::string to_body(const TemplateRecord& t);
  static Result<TemplateRecord> from_doc(const Doc& d);

 private:
  DocStore& docs_;
};

}  // namespace tp::control
