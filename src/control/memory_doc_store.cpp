#include "control/doc_store.h"

namespace tp::control {

Result<uint64_t> MemoryDocStore::put(const Doc& d) {
  std::lock_guard lk(mu_);
  if (fail_writes_) return fail(Code::kInternal, "store: writes fail (test)");
  auto it = rows_.find(d.key);
  if (d.version == 0) {
    if (it != rows_.end()) return fail(Code::kConflict, d.key + " already stored");
    Doc c = d;
    c.version = 1;
    rows_[d.key] = std::move(c);
    return 1;
  }
  if (it == rows_.end()) return fail(Code::kNotFound, d.key + " not stored");
  if (it->second.version != d.version)
    return fail(Code::kConflict, d.key + " changed (version " + std::to_string(it->second.version) +
                                     ", expected " + std::to_string(d.version) + ")");
  Doc c = d;
  c.version = d.version + 1;
  it->second = std::move(c);
  return d.version + 1;
}

Result<std::optional<Doc>> MemoryDocStore::get(const std::string& key) {
  std::lock_guard lk(mu_);
  auto it = rows_.find(key);
  if (it == rows_.end()) return std::optional<Doc>{};
  return std::optional<Doc>{it->second};
}

Result<std::vector<Doc>> MemoryDocStore::list(bool live_only) {
  std::lock_guard lk(mu_);
  std::vector<Doc> out;
  for (const auto& [k, d] : rows_)
    if (!live_only || d.live) out.push_back(d);
  return out;
}

Result<void> MemoryDocStore::remove(const std::string& key, uint64_t version) {
  std::lock_guard lk(mu_);
  if (fail_writes_) return fail(Code::kInternal, "store: writes fail (test)");
  auto it = rows_.find(key);
  if (it == rows_.end()) return fail(Code::kNotFound, key + " not stored");
  if (it->second.version != version)
    return fail(Code::kConflict, key + " changed (version " + std::to_string(it->second.version) +
                                     ", expected " + std::to_string(version) + ")");
  rows_.erase(it);
  return {};
}

Result<int> MemoryDocStore::prune_ended(int64_t before_ms) {
  std::lock_guard lk(mu_);
  int n = 0;
  for (auto it = rows_.begin(); it != rows_.end();) {
    if (!it->second.live && it->second.ended_ms < before_ms) {
      it = rows_.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  return n;
}

void MemoryDocStore::fail_writes(bool on) {
  std::lock_guard lk(mu_);
  fail_writes_ = on;
}

}  // namespace tp::control
