#include "control/memory_image_store.h"

#include <algorithm>
#include <set>

namespace tp::control {

namespace {
std::string ref(const std::string& name, const std::string& version) {
  return name + ":" + version;
}
}  // namespace

Result<uint64_t> MemoryImageRecordStore::put(const ImageRecord& r) {
  std::lock_guard lk(mu_);
  if (fail_writes_) return fail(Code::kInternal, "store: writes fail (test)");
  auto key = std::pair{r.name, r.version};
  auto it = rows_.find(key);
  if (r.row_version == 0) {
    if (it != rows_.end())
      return fail(Code::kConflict, "image " + ref(r.name, r.version) + " already exists");
    ImageRecord c = r;
    c.row_version = 1;
    rows_[key] = std::move(c);
    return 1;
  }
  if (it == rows_.end())
    return fail(Code::kNotFound, "image " + ref(r.name, r.version) + " not stored");
  if (it->second.row_version != r.row_version)
    return fail(Code::kConflict, "image " + ref(r.name, r.version) + " changed (version " +
                                     std::to_string(it->second.row_version) + ", expected " +
                                     std::to_string(r.row_version) + ")");
  ImageRecord c = r;
  c.row_version = r.row_version + 1;
  it->second = std::move(c);
  return r.row_version + 1;
}

Result<std::optional<ImageRecord>> MemoryImageRecordStore::get(const std::string& name,
                                                               const std::string& version) {
  std::lock_guard lk(mu_);
  auto it = rows_.find({name, version});
  if (it == rows_.end()) return std::optional<ImageRecord>{};
  return std::optional<ImageRecord>{it->second};
}

Result<std::optional<ImageRecord>> MemoryImageRecordStore::latest(const std::string& name) {
  std::lock_guard lk(mu_);
  const ImageRecord* best = nullptr;
  for (auto it = rows_.lower_bound({name, ""}); it != rows_.end() && it->first.first == name;
       ++it) {
    const ImageRecord& r = it->second;
    if (!best || r.created_ms > best->created_ms ||
        (r.created_ms == best->created_ms && r.version > best->version))
      best = &r;
  }
  if (!best) return std::optional<ImageRecord>{};
  return std::optional<ImageRecord>{*best};
}

Result<std::vector<ImageRecord>> MemoryImageRecordStore::list(const ImageQuery& q) {
  std::lock_guard lk(mu_);
  std::vector<ImageRecord> out;
  for (const auto& [k, r] : rows_) {
    if (!q.name.empty() && r.name != q.name) continue;
    if (!q.part.empty() && std::find(r.parts.begin(), r.parts.end(), q.part) == r.parts.end())
      continue;
    out.push_back(r);
  }
  return out;  // the map's (name, version) order
}

Result<void> MemoryImageRecordStore::remove(const std::string& name, const std::string& version,
                                            uint64_t row_version) {
  std::lock_guard lk(mu_);
  if (fail_writes_) return fail(Code::kInternal, "store: writes fail (test)");
  auto it = rows_.find({name, version});
  if (it == rows_.end())
    return fail(Code::kNotFound, "image " + ref(name, version) + " not stored");
  if (it->second.row_version != row_version)
    return fail(Code::kConflict, "image " + ref(name, version) + " changed (version " +
                                     std::to_string(it->second.row_version) + ", expected " +
                                     std::to_string(row_version) + ")");
  rows_.erase(it);
  return {};
}

Result<std::map<std::string, uint32_t>> MemoryImageRecordStore::part_counts() {
  std::lock_guard lk(mu_);
  std::map<std::string, uint32_t> out;
  for (const auto& [k, r] : rows_) {
    // A record counts once per part, even if it lists the part twice.
    std::set<std::string> seen(r.parts.begin(), r.parts.end());
    for (const auto& p : seen) ++out[p];
  }
  return out;
}

void MemoryImageRecordStore::fail_writes(bool on) {
  std::lock_guard lk(mu_);
  fail_writes_ = on;
}

}  // namespace tp::control
