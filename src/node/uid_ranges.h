// UidRanges: one host uid/gid range per sandbox.
//
// Why: the kernel keeps many limits per host uid (pipe buffer pages, fanotify
// groups, inotify instances, keys, mqueue bytes, epoll watches, processes),
// and a user namespace's counters are charged to its owner. With one range
// for every sandbox, one sandbox could use up those limits for all the
// others (e.g. 1,500 pipes shrank every other sandbox's new pipes to 8 KiB).
// With a range of its own, what a sandbox uses up is its own.
//
// Range k is host ids [first + k * 65536, first + (k + 1) * 65536), for k in
// [0, count). The holder of a range is recorded with the sandbox (its
// SandboxRecord's uid_base) so that a restarted daemon holds the same ranges
// for the sandboxes it adopts (hold()). A range is released only after
// everything of its sandbox is gone; allocate() answers the lowest free one
// and kUnavailable "no free uid range" when every range is held.
//
// Ranges some host process runs in without a sandbox of this daemon holding
// them (leftovers of an earlier run, not yet reaped; another daemon's sandboxes
// on the same ids) are held for kInUseOnHost (hold_in_use()). Such a hold lasts
// only as long as a process uses the range's ids: recheck_in_use() scans again
// and frees it once a scan that began after it was taken finds none. Either way
// a range is never handed out while a scan sees a process with ids in it (a
// zombie, dead but not yet reaped, counts: it is still charged to its ids).
//
// Thread rules: every method may be called from any thread (one mutex inside).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/result.h"

namespace tp::node {

class UidRanges {
 public:
  static constexpr uint32_t kSize = 65536;
  // Sandbox ranges start above the image store's ids (100000..) and the image
  // builds' (200000..), at a multiple of 65536.
  static constexpr uint32_t kDefaultFirst = 16 * kSize;  // 1048576
  static constexpr uint32_t kDefaultCount = 16384;       // up to 1074790399
  // The holder of a range held because a host process ran with its ids.
  static constexpr const char* kInUseOnHost = "in use on the host";
  // Host ids in [lo, hi) that running processes use (host_uids_in_use(), or a
  // fake in tests). May block (it reads /proc).
  using Scan = std::function<std::set<uint32_t>(uint32_t lo, uint64_t hi)>;

  struct Span {
    uint32_t first;
    uint32_t count;  // ids, not ranges
  };
  // Checks a configuration: first > 0, the last id below 2^31 (ids from 2^31 on
  // are read as negative by many programs; (uid_t)-1 means "no change"), and no
  // overlap with any of `reserved` (the store's and the builds' ids).
  static Result<void> validate(uint32_t first, uint32_t count, const std::vector<Span>& reserved);
  // The most ranges that fit from `first` below 2^31.
  static uint32_t max_count(uint32_t first);

  UidRanges(uint32_t first = kDefaultFirst, uint32_t count = kDefaultCount)
      : first_(first), count_(count) {}

  // The lowest free range's first host id, now held by `owner`.
  Result<uint32_t> allocate(const std::string& owner);
  // Holds the range at `base` for `owner` (a restarted daemon's sandboxes; a
  // hold for kInUseOnHost is re-checked like hold_in_use()'s, and holding it
  // again renews it). Idempotent for the same owner; kConflict when another
  // owner holds an overlapping range. A base off this
  // configuration's grid (the flags changed) is held as it is and keeps every
  // range it overlaps from being handed out.
  Result<void> hold(uint32_t base, const std::string& owner);
  // Frees the range if `owner` holds it (a stale release changes nothing).
  void release(uint32_t base, const std::string& owner);

  struct InUse {
    uint32_t base;  // the range now held for kInUseOnHost
    uint32_t id;    // a host id in it that a process runs with
  };
  // Scans the configured span with `scan` (outside the mutex) and holds for
  // kInUseOnHost every range that no one holds yet and some id of the scan lies
  // in. Answers the ranges it held. (A restarted daemon, before serving.)
  std::vector<InUse> hold_in_use(const Scan& scan);
  // Re-checks the ranges held for kInUseOnHost: scans the span with `scan`
  // (outside the mutex) and frees each of them that was held before the scan
  // began and has no id of the scan in it (one beyond the span, which the scan
  // does not cover, stays held). Answers the bases freed. Does not scan when
  // there is nothing to re-check. Blocks as long as the scan.
  std::vector<uint32_t> recheck_in_use(const Scan& scan);
  // How many ranges are held for kInUseOnHost.
  size_t held_in_use();

  std::optional<std::string> holder(uint32_t base);
  size_t held();
  uint32_t first() const { return first_; }
  uint32_t count() const { return count_; }
  // True if `id` lies in one of the configured ranges.
  bool in_span(uint32_t id) const { return id >= first_ && (id - first_) / kSize < count_; }

 private:
  bool overlaps_held(uint32_t base) const;  // caller holds mu_
  std::mutex mu_;
  const uint32_t first_;
  const uint32_t count_;
  std::map<uint32_t, std::string> held_;  // base -> owner
  // The ranges of held_ held for kInUseOnHost -> when (a count of such holds):
  // recheck_in_use() frees only those held before its scan began.
  std::map<uint32_t, uint64_t> in_use_;
  uint64_t in_use_holds_ = 0;
  // Every range below index low_ is held (or overlapped by a hold): allocate()
  // starts there, so that handing out the next range does not walk past every held
  // one (thousands of live sandboxes). A release lowers it.
  uint32_t low_ = 0;
};

// Host uids (real, effective, saved or filesystem) of running processes that
// fall in [lo, hi). Reads /proc; unreadable entries are skipped.
std::set<uint32_t> host_uids_in_use(uint32_t lo, uint64_t hi);

}  // namespace tp::node
