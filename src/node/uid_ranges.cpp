#include "node/uid_ranges.h"

#include <dirent.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>

namespace tp::node {

namespace {
constexpr uint64_t kIdLimit = 1ull << 31;
}

uint32_t UidRanges::max_count(uint32_t first) {
  return first >= kIdLimit ? 0 : static_cast<uint32_t>((kIdLimit - first) / kSize);
}

Result<void> UidRanges::validate(uint32_t first, uint32_t count,
                                 const std::vector<Span>& reserved) {
  if (first == 0) return fail(Code::kInvalidArgument, "--uid-base 0 would include host root");
  if (count == 0) return fail(Code::kInvalidArgument, "--uid-ranges must be at least 1");
  if (count > max_count(first))
    return fail(Code::kInvalidArgument, "--uid-base " + std::to_string(first) +
                                            " with --uid-ranges " + std::to_string(count) +
                                            " reaches past 2^31; at most " +
                                            std::to_string(max_count(first)) + " ranges fit");
  const uint64_t end = first + uint64_t{count} * kSize;
  for (const auto& r : reserved) {
    const uint64_t rend = uint64_t{r.first} + r.count;
    if (first < rend && r.first < end)
      return fail(Code::kInvalidArgument,
                  "sandbox uid ranges [" + std::to_string(first) + ", " + std::to_string(end) +
                      ") overlap host ids [" + std::to_string(r.first) + ", " +
                      std::to_string(rend) + ") used for image files or builds");
  }
  return {};
}

bool UidRanges::overlaps_held(uint32_t base) const {
  // Held ranges are kSize long: only the last one starting below base + kSize can overlap.
  auto it = held_.lower_bound(base + uint64_t{kSize} > UINT32_MAX ? UINT32_MAX : base + kSize);
  if (it == held_.begin()) return false;
  --it;
  return uint64_t{it->first} + kSize > base;
}

Result<uint32_t> UidRanges::allocate(const std::string& owner) {
  std::lock_guard lk(mu_);
  for (uint32_t k = low_; k < count_; ++k) {
    const uint32_t base = first_ + k * kSize;
    if (overlaps_held(base)) continue;
    held_.emplace(base, owner);
    low_ = k + 1;
    return base;
  }
  low_ = count_;
  return fail(Code::kUnavailable, "no free uid range: all " + std::to_string(count_) +
                                      " sandbox uid ranges are in use (--uid-ranges)");
}

Result<void> UidRanges::hold(uint32_t base, const std::string& owner) {
  if (base == 0 || uint64_t{base} + kSize > kIdLimit)
    return fail(Code::kInvalidArgument, "uid range " + std::to_string(base) + " is not usable");
  std::lock_guard lk(mu_);
  if (auto it = held_.find(base); it != held_.end()) {
    if (it->second != owner)
      return fail(Code::kConflict,
                  "uid range " + std::to_string(base) + " is held by " + it->second);
    if (owner == kInUseOnHost) in_use_[base] = ++in_use_holds_;  // seen in use again now
    return {};
  }
  if (overlaps_held(base))
    return fail(Code::kConflict,
                "uid range " + std::to_string(base) + " overlaps one that is already held");
  held_.emplace(base, owner);
  if (owner == kInUseOnHost) in_use_[base] = ++in_use_holds_;
  return {};
}

void UidRanges::release(uint32_t base, const std::string& owner) {
  std::lock_guard lk(mu_);
  auto it = held_.find(base);
  if (it == held_.end() || it->second != owner) return;
  held_.erase(it);
  in_use_.erase(base);
  // The lowest grid range this one overlapped may be free now (an off-grid base
  // overlaps the range it starts in and the next).
  low_ = std::min(low_, base <= first_ ? 0u : (base - first_) / kSize);
}

std::vector<UidRanges::InUse> UidRanges::hold_in_use(const Scan& scan) {
  std::vector<InUse> out;
  const uint64_t end = first_ + uint64_t{count_} * kSize;
  for (uint32_t id : scan(first_, end)) {
    if (id < first_ || id >= end) continue;  // (a scan answers only what was asked)
    const uint32_t base = first_ + (id - first_) / kSize * kSize;
    std::lock_guard lk(mu_);
    if (auto it = held_.find(base); it != held_.end()) {
      if (it->second == kInUseOnHost) in_use_[base] = ++in_use_holds_;  // seen in use again now
      continue;
    }
    if (overlaps_held(base)) continue;  // an off-grid hold keeps it from being handed out
    held_.emplace(base, kInUseOnHost);
    in_use_[base] = ++in_use_holds_;
    out.push_back({base, id});
  }
  return out;
}

std::vector<uint32_t> UidRanges::recheck_in_use(const Scan& scan) {
  uint64_t before;
  {
    std::lock_guard lk(mu_);
    if (in_use_.empty()) return {};
    before = in_use_holds_;  // holds counted up to here were taken before the scan
  }
  const uint64_t end = first_ + uint64_t{count_} * kSize;
  const std::set<uint32_t> ids = scan(first_, end);
  std::vector<uint32_t> freed;
  std::lock_guard lk(mu_);
  for (auto it = in_use_.begin(); it != in_use_.end();) {
    const uint32_t base = it->first;
    auto id = ids.lower_bound(base);
    if (it->second > before || base < first_ || uint64_t{base} + kSize > end ||
        (id != ids.end() && uint64_t{*id} < uint64_t{base} + kSize)) {
      ++it;  // held after the scan began, beyond what it saw, or still in use
      continue;
    }
    it = in_use_.erase(it);
    held_.erase(base);
    low_ = std::min(low_, base <= first_ ? 0u : (base - first_) / kSize);
    freed.push_back(base);
  }
  return freed;
}

size_t UidRanges::held_in_use() {
  std::lock_guard lk(mu_);
  return in_use_.size();
}

std::optional<std::string> UidRanges::holder(uint32_t base) {
  std::lock_guard lk(mu_);
  auto it = held_.find(base);
  if (it == held_.end()) return std::nullopt;
  return it->second;
}

size_t UidRanges::held() {
  std::lock_guard lk(mu_);
  return held_.size();
}

std::set<uint32_t> host_uids_in_use(uint32_t lo, uint64_t hi) {
  std::set<uint32_t> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream f(std::string("/proc/") + e->d_name + "/status");
    std::string line;
    while (std::getline(f, line)) {
      if (!line.starts_with("Uid:") && !line.starts_with("Gid:")) continue;
      const char* p = line.c_str() + 4;
      for (int i = 0; i < 4; ++i) {
        char* next = nullptr;
        unsigned long v = std::strtoul(p, &next, 10);
        if (next == p) break;
        if (v >= lo && v < hi) out.insert(static_cast<uint32_t>(v));
        p = next;
      }
    }
  }
  ::closedir(d);
  return out;
}

}  // namespace tp::node
