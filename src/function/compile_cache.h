// CompileCache: compiled programs by source hash and compiler flags, and one compile
// for many callers of the same program (docs/function-tier.md).
//
// The key is the SHA-256 of the language's compile command, its file names, the
// source and every extra file (headers), so a program compiles once whatever calls
// run it: a batch of 100 test cases, or 100 SandboxFusion requests with the same code
// sent at once (verl sends one request per test case). The compile itself is a call
// of the function tier like any other (the compiler is the untrusted input's first
// reader); its binary comes back as a fetched file and is kept here, in memory, up
// to a byte budget (least recently used entries go first). A clean compile failure is
// kept too (the same source fails the same way); a compile that hit a limit or could
// not run is not, so the next caller tries again.
//
// Thread rules: every method may be called from any thread (one mutex). Waiters are
// returned to the caller, which runs them outside any lock.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/result.h"
#include "function/call.h"
#include "function/language.h"

namespace tp::function {

class CompileCache {
 public:
  struct Entry {
    StepResult compile;  // the compile step's result (its stdout, stderr, time)
    std::string binary;  // the built program, when compile.verdict is ok
    bool ok() const { return compile.verdict == Verdict::kOk; }
  };
  using EntryPtr = std::shared_ptr<const Entry>;
  using Waiter = std::function<void(Result<EntryPtr>, bool cached)>;

  explicit CompileCache(uint64_t max_bytes) : max_bytes_(max_bytes) {}

  static std::string key(const LanguageDef& lang, std::string_view source,
                         const std::vector<File>& files);

  enum class Lookup { kHit, kLead, kWait };
  // kHit: *hit is set, `w` is not kept. kLead: nobody compiles this key yet: the caller
  // must compile it and call finish(); `w` waits with any later callers. kWait: another
  // caller compiles it; `w` runs when it finishes.
  Lookup lookup(const std::string& key, Waiter w, EntryPtr* hit);
  // The leader's outcome: kept when cacheable; returns the waiters to run.
  std::vector<Waiter> finish(const std::string& key, Result<EntryPtr> r);

  struct Stats {
    uint64_t hits = 0, misses = 0, entries = 0, bytes = 0;
  };
  Stats stats() const;

 private:
  struct Slot {
    EntryPtr entry;
    uint64_t bytes = 0;
    std::list<std::string>::iterator lru;
  };
  void evict_locked();

  const uint64_t max_bytes_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Slot> entries_;
  std::list<std::string> lru_;  // most recent first
  std::unordered_map<std::string, std::vector<Waiter>> compiling_;
  uint64_t bytes_ = 0;
  uint64_t hits_ = 0, misses_ = 0;
};

}  // namespace tp::function
