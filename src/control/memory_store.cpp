#include "control/memory_store.h"

#include <algorithm>

namespace tp::control {

Result<uint64_t> MemorySandboxStore::insert(const SandboxRecord& r) {
  std::lock_guard lk(mu_);
  if (fail_writes_) return fail(Code::kInternal, "store: writes fail (test)");
  if (rows_.count(r.id)) return fail(Code::kConflict, "sandbox " + r.id + " already stored");
  SandboxRecord c = r;
  c.version = 1;
  rows_[r.id] = std::move(c);
  return 1;
}

Result<uint64_t> MemorySandboxStore::update(const SandboxRecord& r) { return write(r, false); }

Result<uint64_t> MemorySandboxStore::update_with_labels(const SandboxRecord& r) {
  return write(r, true);
}

Result<uint64_t> MemorySandboxStore::write(const SandboxRecord& r, bool labels) {
  std::lock_guard lk(mu_);
  if (fail_writes_) return fail(Code::kInternal, "store: writes fail (test)");
  auto it = rows_.find(r.id);
  if (it == rows_.end()) return fail(Code::kNotFound, "sandbox " + r.id + " not stored");
  if (it->second.version != r.version)
    return fail(Code::kConflict, "sandbox " + r.id + " changed (version " +
                                     std::to_string(it->second.version) + ", expected " +
                                     std::to_string(r.version) + ")");
  SandboxRecord c = r;
  if (!labels) c.labels = it->second.labels;
  c.version = r.version + 1;
  it->second = std::move(c);
  return r.version + 1;
}

Result<std::optional<SandboxRecord>> MemorySandboxStore::get(const std::string& id) {
  std::lock_guard lk(mu_);
  auto it = rows_.find(id);
  if (it == rows_.end()) return std::optional<SandboxRecord>{};
  return std::optional<SandboxRecord>{it->second};
}

Result<std::vector<SandboxRecord>> MemorySandboxStore::list(const SandboxQuery& q) {
  std::lock_guard lk(mu_);
  std::vector<SandboxRecord> out;
  for (const auto& [id, r] : rows_) {
    if (!q.state.empty() && r.state != q.state) continue;
    if (q.live_only && r.ended_at_ms != 0) continue;
    if (!q.include_pooled && r.pooled) continue;
    if (!q.job.empty() && r.job != q.job) continue;
    if (!q.step.empty() && r.step != q.step) continue;
    bool match = true;
    for (const auto& [k, v] : q.labels) {
      auto it = r.labels.find(k);
      match = match && it != r.labels.end() && it->second == v;
    }
    if (match) out.push_back(r);
  }
  std::stable_sort(out.begin(), out.end(), [](const SandboxRecord& a, const SandboxRecord& b) {
    return a.created_at_ms != b.created_at_ms ? a.created_at_ms < b.created_at_ms : a.id < b.id;
  });
  return out;
}

Result<int> MemorySandboxStore::prune_ended(int64_t before_ms) {
  std::lock_guard lk(mu_);
  int n = 0;
  for (auto it = rows_.begin(); it != rows_.end();) {
    if (it->second.ended_at_ms > 0 && it->second.ended_at_ms < before_ms) {
      it = rows_.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  return n;
}

void MemorySandboxStore::fail_writes(bool on) {
  std::lock_guard lk(mu_);
  fail_writes_ = on;
}

size_t MemorySandboxStore::size() {
  std::lock_guard lk(mu_);
  return rows_.size();
}

void MemorySandboxStore::clear() {
  std::lock_guard lk(mu_);
  rows_.clear();
}

}  // namespace tp::control
